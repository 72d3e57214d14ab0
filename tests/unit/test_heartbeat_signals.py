"""The heartbeat's health signals: new fields decode from old agents' messages, and round-trip."""

from __future__ import annotations

import msgspec

from rallypoint.protocol import GpuSample, Heartbeat, NicSample, RankStatus

# What an agent from before the signal fields sends (keys exactly as its encoder wrote them).
_OLD_BEAT = (
    b'{"node_id":"n1","agent_instance":"a1","at":12.5,'
    b'"gpus":[{"index":0,"temperature_c":41.0,"utilization":93.0,"memory_used_mib":48000,'
    b'"ecc_uncorrectable":0,"xid":0,"throttled":true}],'
    b'"ranks":[{"job_id":"j","attempt":0,"rank":3,"pid":77}]}'
)


def test_an_old_heartbeat_still_decodes_with_defaults() -> None:
    beat = msgspec.json.decode(_OLD_BEAT, type=Heartbeat)
    assert beat.nics == ()
    gpu = beat.gpus[0]
    assert gpu.throttled
    assert (gpu.throttle_thermal, gpu.throttle_power_brake, gpu.throttle_hw_slowdown) == (False, False, False)
    assert (gpu.ecc_corrected, gpu.nvlink_errors) == (0, 0)
    assert beat.ranks == (RankStatus(job_id="j", attempt=0, rank=3, pid=77),)


def test_new_fields_round_trip() -> None:
    beat = Heartbeat(
        node_id="n1",
        agent_instance="a1",
        at=1.0,
        gpus=(
            GpuSample(
                index=2,
                temperature_c=92.0,
                utilization=50.0,
                memory_used_mib=1,
                throttled=True,
                throttle_thermal=True,
                ecc_corrected=120,
                nvlink_errors=7,
            ),
        ),
        nics=(NicSample(name="mlx5_0/1", link_up=False, speed_gbps=200.0, errors=5),),
    )
    again = msgspec.json.decode(msgspec.json.encode(beat), type=Heartbeat)
    assert again == beat
    assert again.nics[0].name == "mlx5_0/1" and not again.nics[0].link_up


# A monitor that predates the fields, decoding into its own older structs.
class OldGpu(msgspec.Struct, kw_only=True):
    index: int
    temperature_c: float
    utilization: float
    memory_used_mib: int
    throttled: bool = False


class OldBeat(msgspec.Struct, kw_only=True):
    node_id: str
    agent_instance: str
    at: float
    gpus: tuple[OldGpu, ...] = ()


def test_an_old_reader_ignores_the_new_fields() -> None:
    """A monitor that predates the fields (decoding into its own, older struct) is not broken by them."""

    new = Heartbeat(
        node_id="n",
        agent_instance="a",
        at=2.0,
        gpus=(
            GpuSample(
                index=0,
                temperature_c=1,
                utilization=0,
                memory_used_mib=0,
                throttled=True,
                throttle_power_brake=True,
            ),
        ),
        nics=(NicSample(name="ib0"),),
    )
    old = msgspec.json.decode(msgspec.json.encode(new), type=OldBeat)
    assert old.gpus[0].throttled and old.node_id == "n"


def test_fields_at_their_default_are_left_out_and_decode_the_same() -> None:
    """A healthy idle node's heartbeat carries only what differs from the defaults: the monitor parses
    2,500 of them a second at 12,500 nodes, and an older reader decodes what is left as before."""
    idle = tuple(GpuSample(index=i, temperature_c=41.0, utilization=0.0, memory_used_mib=0) for i in range(8))
    beat = Heartbeat(
        node_id="node-01234",
        agent_instance="0123456789abcdef",
        at=1765000000.125,
        gpus=idle,
        ranks=(RankStatus(job_id="j", attempt=1, rank=0, pid=9, step=40),),
    )
    wire = msgspec.json.encode(beat)
    assert b"ecc_uncorrectable" not in wire and b"throttle" not in wire and b"nics" not in wire
    assert b'"exit_code"' not in wire and b'"step":40' in wire
    assert len(wire) < 800  # ~2 KB with every default written out
    assert msgspec.json.decode(wire, type=Heartbeat) == beat
    old = msgspec.json.decode(wire, type=OldBeat)
    assert [g.index for g in old.gpus] == list(range(8)) and not old.gpus[0].throttled
