"""A simulated GPU node: GPU topology, memory, temperatures, NICs, and injectable faults.

Everything is deterministic: uuids derive from (node id, index), sample noise from a seeded generator
(never the wall clock), counters grow per sample, and a flapping NIC follows the number of NIC samples
taken (or a clock the caller passes in), so two runs with the same seed and the same calls see the same
numbers.

Faults can be injected three ways, so unit tests, integration tests and demos can all trigger them:

- methods: ``inject_thermal``, ``inject_ecc``, ``inject_xid``, ``inject_throttle``,
  ``inject_ecc_corrected``, ``inject_nvlink``, ``inject_slowdown``, ``inject_nic``, ``clear_faults``;
- the ``RALLY_SIM_FAULTS`` environment variable, read once at construction;
- a fault file (``RALLY_SIM_FAULT_FILE`` or the ``fault_file`` argument), re-read whenever it changes,
  so ``echo '3:xid=79' > faults`` makes GPU 3 of a running agent report XID 79 on its next heartbeat,
  and emptying the file clears those faults again.

Spec and file syntax: entries separated by commas, semicolons or newlines, each
``<target>:<kind>[=<value>]``; ``#`` starts a comment. The target says what the fault hits:

- ``<gpu>`` (an index) or ``*`` (every GPU), with the GPU kinds (default value in brackets):
  ``thermal`` (temperature in °C [95]; 90 °C and up also sets the thermal throttle reason),
  ``ecc`` (uncorrectable errors [1]), ``xid`` (code [79]: fallen off the bus),
  ``throttle`` (a throttle reason: ``hw`` HW slowdown [the default, also ``1``], ``thermal``,
  ``power`` (HW power brake), ``0`` clears all three), ``ecc_corrected`` (a corrected-ECC storm: the
  cumulative counter grows by this many errors per sample [10]), ``nvlink`` (NVLink errors per sample
  [10]);
- ``node``, with ``slow=<factor>`` [2]: the node runs its ranks ``factor`` times slower (the agent
  duty-cycles them, see ``slowdown``); 1 clears it;
- a NIC name (``ib0``; ``nic*`` every NIC), with ``down`` [1; 0 clears], ``flap=<seconds>`` [2]: the
  link is down for the first half of every period and up for the second (0 clears),
  ``speed=<gbps>`` [200]: the link trained down to this speed, ``errors=<n>`` [10]: symbol/receive
  errors per NIC sample.

Examples: ``3:xid=79``, ``*:thermal=97``, ``0:throttle=power``, ``2:ecc_corrected=50``, ``node:slow=3``,
``ib0:down``, ``ib0:flap=4``, ``nic*:speed=200``. Every simulated node has ``nics`` InfiniBand ports
``ib0``, ``ib1``... at ``nic_speed_gbps`` (default one port at 400 Gb/s).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rallypoint.agent.backend import GpuDevice, MigUnavailable
from rallypoint.protocol import GpuSample, NicSample

FAULTS_ENV = "RALLY_SIM_FAULTS"
FAULT_FILE_ENV = "RALLY_SIM_FAULT_FILE"

FaultKind = Literal[
    "thermal",
    "ecc",
    "xid",
    "throttle",
    "throttle_thermal",
    "throttle_power",
    "ecc_corrected",
    "nvlink",
    "slow",
    "down",
    "flap",
    "speed",
    "errors",
]
# Default values per kind, by what the entry targets.
_GPU_DEFAULTS: dict[str, float] = {
    "thermal": 95.0,
    "ecc": 1.0,
    "xid": 79.0,
    "throttle": 1.0,
    "throttle_thermal": 1.0,
    "throttle_power": 1.0,
    "ecc_corrected": 10.0,
    "nvlink": 10.0,
}
_NODE_DEFAULTS: dict[str, float] = {"slow": 2.0}
_NIC_DEFAULTS: dict[str, float] = {"down": 1.0, "flap": 2.0, "speed": 200.0, "errors": 10.0}
# ``throttle=<reason>``: which reason an entry sets (``0`` clears all three, see _GpuFaults.apply).
_THROTTLE_REASONS: dict[str, tuple[FaultKind, float]] = {
    "hw": ("throttle", 1.0),
    "1": ("throttle", 1.0),
    "0": ("throttle", 0.0),
    "thermal": ("throttle_thermal", 1.0),
    "power": ("throttle_power", 1.0),
}
NODE_TARGET = "node"
ALL_NICS = "nic*"
_NIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
# At and above this temperature a GPU slows itself down: a thermal fault also sets the thermal reason.
THERMAL_THROTTLE_C = 90.0

# An H100 SXM 80GB reports 81559 MiB through NVML; simulated nodes look the same to the scheduler.
DEFAULT_MEMORY_MIB = 81559
DEFAULT_NIC_SPEED_GBPS = 400.0  # one NDR InfiniBand port
_UUID_NAMESPACE = uuid.UUID("5f0c6a0e-2d55-4f8e-9a51-7a1f3c2b9d10")
_IDLE_TEMP_C = 34.0


@dataclass(frozen=True)
class FaultSpec:
    """One parsed fault entry. GPU kinds: ``index`` None means every GPU. Node kinds (``slow``): no
    target. NIC kinds: ``nic`` names the port (``nic*``: every port)."""

    index: int | None
    kind: FaultKind
    value: float
    nic: str | None = None


def _number(entry: str, text: str, default: float) -> float:
    if not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"fault entry {entry!r}: value must be a number") from None
    if value < 0:
        raise ValueError(f"fault entry {entry!r}: value must not be negative")
    return value


def _gpu_entry(entry: str, target: str, kind: str, value_text: str) -> FaultSpec:
    if kind not in _GPU_DEFAULTS:
        raise ValueError(f"fault entry {entry!r}: a GPU fault kind must be one of {sorted(_GPU_DEFAULTS)}")
    try:
        index = None if target == "*" else int(target)
    except ValueError:
        raise ValueError(f"fault entry {entry!r}: gpu must be an index or '*'") from None
    if index is not None and index < 0:
        raise ValueError(f"fault entry {entry!r}: negative gpu index")
    if kind == "throttle" and value_text.strip() and not value_text.strip().replace(".", "").isdigit():
        reason = _THROTTLE_REASONS.get(value_text.strip())
        if reason is None:
            raise ValueError(f"fault entry {entry!r}: throttle reason must be one of hw, thermal, power, 0")
        return FaultSpec(index=index, kind=reason[0], value=reason[1])
    value = _number(entry, value_text, _GPU_DEFAULTS[kind])
    return FaultSpec(index=index, kind=kind, value=value)  # type: ignore[arg-type]


def _node_entry(entry: str, kind: str, value_text: str) -> FaultSpec:
    if kind not in _NODE_DEFAULTS:
        raise ValueError(f"fault entry {entry!r}: a node fault kind must be one of {sorted(_NODE_DEFAULTS)}")
    value = _number(entry, value_text, _NODE_DEFAULTS[kind])
    if value < 1:
        raise ValueError(f"fault entry {entry!r}: a slowdown factor is at least 1 (1: not slow)")
    return FaultSpec(index=None, kind=kind, value=value)  # type: ignore[arg-type]


def _nic_entry(entry: str, target: str, kind: str, value_text: str) -> FaultSpec:
    if kind not in _NIC_DEFAULTS:
        raise ValueError(f"fault entry {entry!r}: a NIC fault kind must be one of {sorted(_NIC_DEFAULTS)}")
    value = _number(entry, value_text, _NIC_DEFAULTS[kind])
    return FaultSpec(index=None, kind=kind, value=value, nic=target)  # type: ignore[arg-type]


def _parse_entry(entry: str) -> FaultSpec:
    target, sep, rest = entry.partition(":")
    if not sep:
        raise ValueError(f"fault entry {entry!r}: expected <target>:<kind>[=<value>]")
    target = target.strip()
    kind, _, value_text = rest.strip().partition("=")
    kind = kind.strip()
    if target == NODE_TARGET:
        return _node_entry(entry, kind, value_text)
    if target == ALL_NICS or (_NIC_NAME.match(target) and kind in _NIC_DEFAULTS):
        return _nic_entry(entry, target, kind, value_text)
    return _gpu_entry(entry, target, kind, value_text)


def parse_fault_spec(text: str) -> list[FaultSpec]:
    """Parse ``0:thermal=97, *:throttle; 3:xid=48; node:slow=3; ib0:flap=4``. Raises ValueError naming
    the bad entry."""
    specs: list[FaultSpec] = []
    for raw_line in text.splitlines():
        line = raw_line.split("#", 1)[0]
        for raw in line.replace(";", ",").split(","):
            entry = raw.strip()
            if entry:
                specs.append(_parse_entry(entry))
    return specs


@dataclass
class _GpuFaults:
    temperature_c: float | None = None
    ecc: int = 0
    xid: int = 0
    throttle_hw: bool = False
    throttle_thermal: bool = False
    throttle_power: bool = False
    ecc_corrected_rate: int = 0
    nvlink_rate: int = 0

    def apply(self, spec: FaultSpec) -> None:
        kind, value = spec.kind, spec.value
        if kind == "thermal":
            self.temperature_c = value
        elif kind == "ecc":
            self.ecc += int(value)
        elif kind == "xid":
            self.xid = int(value)
        elif kind == "throttle":
            # ``throttle=0`` (and the old ``inject_throttle(i, False)``) means "not throttled": all reasons.
            self.throttle_hw = value != 0
            if value == 0:
                self.throttle_thermal = self.throttle_power = False
        elif kind == "throttle_thermal":
            self.throttle_thermal = value != 0
        elif kind == "throttle_power":
            self.throttle_power = value != 0
        elif kind == "ecc_corrected":
            self.ecc_corrected_rate = int(value)
        elif kind == "nvlink":
            self.nvlink_rate = int(value)

    def merged(self, other: _GpuFaults) -> _GpuFaults:
        temps = [t for t in (self.temperature_c, other.temperature_c) if t is not None]
        return _GpuFaults(
            temperature_c=max(temps) if temps else None,
            ecc=self.ecc + other.ecc,
            xid=other.xid or self.xid,
            throttle_hw=self.throttle_hw or other.throttle_hw,
            throttle_thermal=self.throttle_thermal or other.throttle_thermal,
            throttle_power=self.throttle_power or other.throttle_power,
            ecc_corrected_rate=self.ecc_corrected_rate + other.ecc_corrected_rate,
            nvlink_rate=self.nvlink_rate + other.nvlink_rate,
        )


@dataclass
class _NicFaults:
    down: bool = False
    flap_s: float = 0.0
    speed_gbps: float | None = None
    errors_rate: int = 0

    def apply(self, spec: FaultSpec) -> None:
        if spec.kind == "down":
            self.down = spec.value != 0
        elif spec.kind == "flap":
            self.flap_s = spec.value
        elif spec.kind == "speed":
            self.speed_gbps = spec.value
        elif spec.kind == "errors":
            self.errors_rate = int(spec.value)

    def merged(self, other: _NicFaults) -> _NicFaults:
        speeds = [s for s in (self.speed_gbps, other.speed_gbps) if s is not None]
        return _NicFaults(
            down=self.down or other.down,
            flap_s=max(self.flap_s, other.flap_s),
            speed_gbps=min(speeds) if speeds else None,
            errors_rate=self.errors_rate + other.errors_rate,
        )


@dataclass
class _FaultSet:
    """Every fault from one source (methods and env, or the file)."""

    gpus: list[_GpuFaults]
    nics: dict[str, _NicFaults]
    slow: float = 1.0

    @classmethod
    def empty(cls, gpus: int, nics: Iterable[str]) -> _FaultSet:
        return cls(gpus=[_GpuFaults() for _ in range(gpus)], nics={n: _NicFaults() for n in nics})

    def apply(self, spec: FaultSpec) -> None:
        if spec.kind in _NODE_DEFAULTS:
            self.slow = spec.value
        elif spec.nic is not None:
            for name in self.nics if spec.nic == ALL_NICS else (spec.nic,):
                # An unknown port (a file written for another node) is ignored, like an unknown GPU.
                if name in self.nics:
                    self.nics[name].apply(spec)
        else:
            for i in self._gpu_targets(spec.index):
                self.gpus[i].apply(spec)

    def _gpu_targets(self, index: int | None) -> Iterable[int]:
        if index is None:
            return range(len(self.gpus))
        # Out-of-range indices from an env var or file are ignored, not fatal: a fault file written for
        # an 8-GPU node must not crash a 4-GPU agent that happens to read it.
        return (index,) if 0 <= index < len(self.gpus) else ()


def sim_uuid(node_id: str, index: int) -> str:
    """NVIDIA-style ``GPU-<uuid>``, stable for (node, index) so re-registration keeps identities."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_id}/{index}')}"


@dataclass
class _Counters:
    """Cumulative counters, as NVML and sysfs keep them: a fault makes them grow, clearing it stops that."""

    ecc_corrected: list[int] = field(default_factory=list)
    nvlink: list[int] = field(default_factory=list)
    nic_errors: dict[str, int] = field(default_factory=dict)
    nic_downed: dict[str, int] = field(default_factory=dict)
    nic_up: dict[str, bool] = field(default_factory=dict)
    nic_samples: int = 0


class SimulatedGpus:
    """``count`` identical GPUs in NVLink domains of ``nvlink_domain_size`` consecutive indices, and
    ``nics`` InfiniBand ports ``ib0``... at ``nic_speed_gbps``.

    ``clock``: what a flapping NIC's phase follows; None (the default) counts NIC samples instead, each
    ``sample_interval_s`` apart (the agent takes one per heartbeat), so tests need no clock at all.
    """

    def __init__(
        self,
        node_id: str,
        count: int = 8,
        *,
        gpu_type: str = "sim-h100",
        memory_mib: int = DEFAULT_MEMORY_MIB,
        nvlink_domain_size: int = 8,
        seed: int = 0,
        faults: str | None = None,
        fault_file: Path | str | None = None,
        nics: int = 1,
        nic_speed_gbps: float = DEFAULT_NIC_SPEED_GBPS,
        clock: Callable[[], float] | None = None,
        sample_interval_s: float = 1.0,
        mig_gpus: Sequence[int] = (),
    ) -> None:
        if count < 0 or nics < 0:
            raise ValueError("count and nics must be >= 0")
        if nvlink_domain_size < 1:
            raise ValueError("nvlink_domain_size must be >= 1")
        self.node_id = node_id
        self._gpu_type = gpu_type
        self._devices = tuple(
            GpuDevice(
                index=i,
                uuid=sim_uuid(node_id, i),
                memory_mib=memory_mib,
                nvlink_domain=i // nvlink_domain_size,
                name=gpu_type,
                mig=i in mig_gpus,
            )
            for i in range(count)
        )
        self.nic_names = tuple(f"ib{i}" for i in range(nics))
        self.nic_speed_gbps = nic_speed_gbps
        self._clock = clock
        self._started = clock() if clock is not None else 0.0
        self._sample_interval_s = sample_interval_s
        # Seeded from (seed, node) so nodes differ from each other but each is reproducible.
        digest = hashlib.sha256(f"{seed}:{node_id}".encode()).digest()
        self._rng = random.Random(int.from_bytes(digest[:8], "big"))
        self._injected = self._no_faults()
        self._from_file = self._no_faults()
        self._counters = _Counters(
            ecc_corrected=[0] * count,
            nvlink=[0] * count,
            nic_errors=dict.fromkeys(self.nic_names, 0),
            nic_downed=dict.fromkeys(self.nic_names, 0),
            nic_up=dict.fromkeys(self.nic_names, True),
        )
        self._busy = [False] * count
        env_spec = os.environ.get(FAULTS_ENV) if faults is None else faults
        if env_spec:
            self.apply_faults(parse_fault_spec(env_spec))
        file_name = fault_file if fault_file is not None else os.environ.get(FAULT_FILE_ENV)
        self.fault_file = Path(file_name) if file_name else None
        self._file_stamp: tuple[int, int] | None = None

    # -- GpuBackend ---------------------------------------------------------------------------------

    def mig_device(self, index: int, profile: str, start: int) -> str:
        """A simulated MIG device: NVIDIA-style ``MIG-<uuid>``, stable for (GPU, profile, start)."""
        device = self._devices[index] if 0 <= index < len(self._devices) else None
        if device is None or not device.mig:
            raise MigUnavailable(f"GPU {index} of {self.node_id} is not in MIG mode")
        return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{device.uuid}/{profile}/{start}')}"

    @property
    def gpu_type(self) -> str:
        return self._gpu_type

    def inventory(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def sample(self) -> tuple[GpuSample, ...]:
        self._reload_fault_file()
        return tuple(self._sample_one(device) for device in self._devices)

    def nics(self) -> tuple[NicSample, ...]:
        """One sample per simulated port; each call is one sample (counters grow, a flap advances)."""
        self._reload_fault_file()
        elapsed = self._elapsed()
        self._counters.nic_samples += 1
        return tuple(self._nic_one(name, elapsed) for name in self.nic_names)

    def slowdown(self) -> float:
        """How many times slower this node runs its ranks (1.0: not slowed)."""
        self._reload_fault_file()
        return max(self._injected.slow, self._from_file.slow, 1.0)

    def close(self) -> None:
        """Nothing to release; present for the Protocol."""

    # -- fault injection ----------------------------------------------------------------------------

    def inject_thermal(self, index: int, temperature_c: float = _GPU_DEFAULTS["thermal"]) -> None:
        self.apply_faults([FaultSpec(self._check(index), "thermal", temperature_c)])

    def inject_ecc(self, index: int, count: int = 1) -> None:
        """Adds ``count`` uncorrectable errors: like NVML's volatile counter, it only grows."""
        self.apply_faults([FaultSpec(self._check(index), "ecc", count)])

    def inject_xid(self, index: int, xid: int = 79) -> None:
        self.apply_faults([FaultSpec(self._check(index), "xid", xid)])

    def inject_throttle(self, index: int, throttled: bool = True, reason: str = "hw") -> None:
        """Sets one throttle reason (``hw``, ``thermal``, ``power``); ``throttled=False`` clears all."""
        kind, value = _THROTTLE_REASONS[reason if throttled else "0"]
        self.apply_faults([FaultSpec(self._check(index), kind, value)])

    def inject_ecc_corrected(self, index: int, per_sample: int = 10) -> None:
        """A corrected-ECC storm: the GPU's cumulative counter grows by ``per_sample`` on every sample."""
        self.apply_faults([FaultSpec(self._check(index), "ecc_corrected", per_sample)])

    def inject_nvlink(self, index: int, per_sample: int = 10) -> None:
        self.apply_faults([FaultSpec(self._check(index), "nvlink", per_sample)])

    def inject_slowdown(self, factor: float) -> None:
        """The node runs its ranks ``factor`` times slower (1: normal again)."""
        self.apply_faults(parse_fault_spec(f"{NODE_TARGET}:slow={factor}"))

    def inject_nic(self, name: str, kind: str, value: float | None = None) -> None:
        """``kind`` one of down, flap, speed, errors (as in the spec syntax); ``name`` a port or nic*."""
        if name != ALL_NICS and name not in self.nic_names:
            raise IndexError(f"no NIC {name!r} on {self.node_id} ({', '.join(self.nic_names) or 'none'})")
        value_text = "" if value is None else str(value)
        self.apply_faults([_nic_entry(f"{name}:{kind}", name, kind, value_text)])

    def clear_faults(self, index: int | None = None) -> None:
        """Clears method/env-injected faults of GPU ``index``, or every fault (GPU, node, NIC) for None.
        File faults follow the file's contents; cumulative counters keep what they counted."""
        if index is None:
            self._injected = self._no_faults()
        elif 0 <= index < len(self._devices):
            self._injected.gpus[index] = _GpuFaults()

    def apply_faults(self, specs: Iterable[FaultSpec]) -> None:
        for spec in specs:
            self._injected.apply(spec)

    def set_busy(self, indices: Iterable[int], busy: bool) -> None:
        """Mark GPUs as running a rank, so utilization, memory and temperature look alive in demos."""
        for i in indices:
            if 0 <= i < len(self._busy):
                self._busy[i] = busy

    # -- internals ----------------------------------------------------------------------------------

    def _no_faults(self) -> _FaultSet:
        return _FaultSet.empty(len(self._devices), self.nic_names)

    def _sample_one(self, device: GpuDevice) -> GpuSample:
        i = device.index
        faults = self._injected.gpus[i].merged(self._from_file.gpus[i])
        # Draw the noise unconditionally so injecting a fault on one GPU does not shift the
        # numbers every other GPU reports (keeps before/after comparisons in tests exact).
        jitter = self._rng.uniform(-1.0, 1.0)
        load = self._rng.uniform(88.0, 99.0)
        utilization = load if self._busy[i] else 0.0
        temperature = round(_IDLE_TEMP_C + 0.3 * utilization + jitter, 1)
        if faults.temperature_c is not None:
            temperature = faults.temperature_c
        self._counters.ecc_corrected[i] += faults.ecc_corrected_rate
        self._counters.nvlink[i] += faults.nvlink_rate
        thermal = faults.throttle_thermal or (faults.temperature_c or 0.0) >= THERMAL_THROTTLE_C
        return GpuSample(
            index=i,
            temperature_c=temperature,
            utilization=round(utilization, 1),
            memory_used_mib=int(device.memory_mib * 0.6) if self._busy[i] else 0,
            ecc_uncorrectable=faults.ecc,
            xid=faults.xid,
            throttled=thermal or faults.throttle_power or faults.throttle_hw,
            throttle_thermal=thermal,
            throttle_power_brake=faults.throttle_power,
            throttle_hw_slowdown=faults.throttle_hw,
            ecc_corrected=self._counters.ecc_corrected[i],
            nvlink_errors=self._counters.nvlink[i],
        )

    def _elapsed(self) -> float:
        if self._clock is not None:
            return self._clock() - self._started
        return self._counters.nic_samples * self._sample_interval_s

    def _nic_one(self, name: str, elapsed: float) -> NicSample:
        faults = self._injected.nics[name].merged(self._from_file.nics[name])
        self._counters.nic_errors[name] += faults.errors_rate
        # A flapping link is down for the first half of each period, up for the second.
        flapped_down = faults.flap_s > 0 and elapsed % faults.flap_s < faults.flap_s / 2
        up = not faults.down and not flapped_down
        speed = self.nic_speed_gbps if faults.speed_gbps is None else faults.speed_gbps
        if self._counters.nic_up[name] and not up:
            self._counters.nic_downed[name] += 1  # as the port's link_downed counter counts
        self._counters.nic_up[name] = up
        return NicSample(
            name=name,
            link_up=up,
            speed_gbps=speed if up else 0.0,
            errors=self._counters.nic_errors[name],
            link_downed=self._counters.nic_downed[name],
        )

    def _check(self, index: int) -> int:
        if not 0 <= index < len(self._devices):
            raise IndexError(f"no GPU {index} on {self.node_id} ({len(self._devices)} GPUs)")
        return index

    def _reload_fault_file(self) -> None:
        if self.fault_file is None:
            return
        try:
            stat = self.fault_file.stat()
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._file_stamp:
            return
        self._file_stamp = stamp
        fresh = self._no_faults()
        if stamp is not None:
            try:
                specs = parse_fault_spec(self.fault_file.read_text())
            except (OSError, ValueError):
                # A half-written or malformed file keeps the previous faults rather than clearing them;
                # any later change to the file (even its removal) is picked up, as the stamp matches nothing.
                self._file_stamp = (-1, -1)
                return
            for spec in specs:
                fresh.apply(spec)
        self._from_file = fresh
