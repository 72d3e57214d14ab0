"""``rally sim packing --mode replay``: openb with departures and a queue (docs/packing-replay.md).

Hand-made clusters check the queue, the release and the time average by arithmetic; the CLI runs on
tests/data/openb_small_timed (the 39 nodes of openb_small, the first 300 pods of openb's default list with
every column).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rallypoint.cli.main import main
from rallypoint.sim.packing import POLICIES, NodeSpec, PodSpec, read_nodes, read_pods, run_seed
from rallypoint.sim.packing.replay import arrival_curve, replay_summary, run_replay
from rallypoint.sim.packing.timed import TimedPod, read_timed_pods

TIMED = Path(__file__).resolve().parents[1] / "data" / "openb_small_timed"
NODES, PODS = TIMED / "nodes.csv", TIMED / "pods.csv"
SMALL = Path(__file__).resolve().parents[1] / "data" / "openb_small"

TWO_ONE_GPU = [NodeSpec("n-a", 32_000, 65_536, 1, "T4"), NodeSpec("n-b", 32_000, 65_536, 1, "T4")]


def pod(name: str, at: float, life: float, num_gpu: int = 1, milli: int = 1000) -> TimedPod:
    return TimedPod(PodSpec(name, 1000, 1024, num_gpu, milli), at, at + life)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_leaving_pod_frees_its_gpu_for_the_waiting_one_and_the_time_average_is_the_integral(
    policy: str,
) -> None:
    """Two nodes of one GPU (capacity 2,000 milli). p0 and p1 take both GPUs at 0; p2 arrives at 10 and
    waits until p1 leaves at 30, then runs 30..80; p3 wants 2 GPUs on one node: never fits, fails.
    Allocation: 2,000 over 0..30, 2,000 over 30..80, 1,000 over 80..100 -> 180,000 / (2,000 x 100) = 90%."""
    pods = [pod("p0", 0, 100), pod("p1", 0, 30), pod("p2", 10, 50), pod("p3", 10, 5, num_gpu=2)]
    run = run_replay(TWO_ONE_GPU, pods, policy)
    assert run.waits == [0.0, 0.0, 20.0, None]
    assert (run.placed, run.failed, run.max_queue) == (3, 1, 1)
    assert run.horizon_s == 100.0 and run.peak_alloc == 100.0
    assert run.time_avg_alloc == pytest.approx(90.0)
    assert run.alloc_while_waiting == pytest.approx(100.0) and run.backlog_s == 20.0
    s = replay_summary(run)
    assert (s["wait_s_mean"], s["wait_s_p50"], s["wait_s_p95"]) == (6.667, 0.0, 18.0)
    assert (s["placed_pods"], s["failed_pods"], s["waited_pods"]) == (3, 1, 1)


def test_the_queue_lets_a_pod_that_fits_pass_one_that_does_not() -> None:
    """One node of 2 GPUs, full from 0 (p0 until 100, p1 until 10). p2 (2 GPUs) queues at 1, p3 (1 GPU) at 2.
    When p1 leaves at 10 one GPU is free: the head p2 cannot use it, p3 can and starts (no head-of-line
    blocking); p2 starts when p0 leaves at 100. Strict FIFO would hold p3 until 105."""
    node = [NodeSpec("n-a", 32_000, 65_536, 2, "T4")]
    pods = [pod("p0", 0, 100), pod("p1", 0, 10), pod("p2", 1, 5, num_gpu=2), pod("p3", 2, 5)]
    run = run_replay(node, pods, "bestfit")
    assert run.waits == [0.0, 0.0, 99.0, 8.0]
    assert run.horizon_s == 105.0 and run.max_queue == 2


def test_a_release_at_the_same_instant_comes_before_an_arrival_and_the_queue_before_it_too() -> None:
    """p1 leaves at 10; the queued p2 gets the GPU freed at 10, not p3, which arrives at 10 and waits."""
    pods = [pod("p0", 0, 100), pod("p1", 0, 10), pod("p2", 5, 10), pod("p3", 10, 10)]
    run = run_replay(TWO_ONE_GPU, pods, "fgd")
    assert run.waits == [0.0, 0.0, 5.0, 10.0]


def test_shared_pods_share_a_gpu_and_release_only_their_milli() -> None:
    """One GPU: 0.6 + 0.4 fit together; a second 0.6 waits for the first to leave (not the 0.4)."""
    node = [NodeSpec("n-a", 32_000, 65_536, 1, "T4")]
    pods = [pod("a", 0, 50, milli=600), pod("b", 0, 10, milli=400), pod("c", 1, 10, milli=600)]
    for policy in POLICIES:
        run = run_replay(node, pods, policy)
        assert run.waits == [0.0, 0.0, 49.0] and run.peak_alloc == 100.0, policy
        # 1,000 milli over 0..10, 600 over 10..50, 600 over 50..60 -> 40,000 / (1,000 x 60)
        assert run.time_avg_alloc == pytest.approx(100 * 40_000 / 60_000)


def test_speedup_packs_arrivals_closer_and_keeps_lifetimes() -> None:
    """p2 arrives at 3,000, or at 30 packed 100x: when p1 (0..30) leaves, so it does not wait."""
    pods = [pod("p0", 0, 100), pod("p1", 0, 30), pod("p2", 3000, 50)]
    assert run_replay(TWO_ONE_GPU, pods, "bestfit").horizon_s == 3050.0
    fast = run_replay(TWO_ONE_GPU, pods, "bestfit", speedup=100)
    assert fast.horizon_s == 100.0 and fast.waits == [0.0, 0.0, 0.0]
    # p1 leaves at 30 as p2 arrives: never more than 2 of 2 GPUs, but 100% over 0..30 and 30..80
    assert fast.peak_alloc == 100.0
    assert run_replay(TWO_ONE_GPU, pods[:1] + pods[2:], "bestfit").peak_alloc == 50.0
    slower = run_replay(TWO_ONE_GPU, pods, "bestfit", speedup=300)  # p2 at 10: waits for p1 until 30
    assert slower.waits == [0.0, 0.0, 20.0]
    with pytest.raises(ValueError, match="speedup"):
        run_replay(TWO_ONE_GPU, pods, "bestfit", speedup=0)


def test_the_sample_replays_the_same_every_time_and_waits_when_packed() -> None:
    nodes, pods = read_nodes(NODES), read_timed_pods(PODS)
    assert len(pods) == 300 and pods[1].created == 427061 and pods[1].deleted == 12902960
    recorded = run_replay(nodes, pods, "random", seed=7)
    assert recorded.placed == 300 and not any(recorded.waits)  # as recorded, nothing waits
    packed = [run_replay(nodes, pods, "random", seed=7, speedup=1000) for _ in range(2)]
    assert packed[0].waits == packed[1].waits and packed[0].time_avg_alloc == packed[1].time_avg_alloc
    assert sum(w is not None and w > 0 for w in packed[0].waits) > 10
    other = run_replay(nodes, pods, "random", seed=8, speedup=1000)
    assert other.waits != packed[0].waits  # the seed drives Random's draws


@pytest.mark.parametrize("policy", ["random", "gpupacking", "fgd"])
def test_the_arrival_curve_is_the_fgd_protocol_replay(policy: str) -> None:
    """The plot's curve decides as run_seed does: the allocation where arrived demand first reaches 100%."""
    nodes, pods = read_nodes(SMALL / "nodes.csv"), read_pods(SMALL / "pods.csv")
    arrived, alloc = arrival_curve(nodes, pods, policy, 3)
    first = int(np.argmax(arrived >= 100.0))
    assert arrived[first] >= 100.0 > arrived[first - 1]
    assert alloc[first] == pytest.approx(run_seed(nodes, pods, policy, 3).alloc_at_100)
    assert np.all(np.diff(alloc) >= 0) and alloc[-1] <= arrived[-1]


def replay_argv(*extra: str) -> list[str]:
    return ["sim", "packing", "--mode", "replay", "--nodes", str(NODES), "--pods", str(PODS), *extra]


def test_cli_replay_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    argv = replay_argv("--policy", "best-fit", "--speedup", "1000", "--json")
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "bestfit" and out["mode"] == "replay"
    assert out["placed_pods"] + out["failed_pods"] == 300
    assert 0 < out["time_avg_alloc"] <= 100
    assert 0 <= out["wait_s_p50"] <= out["wait_s_p95"] and out["wait_s_mean"] > 0
    assert out["decision_ms_p99"] > 0
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in again.items() if k != "decision_ms_p99"} == {
        k: v for k, v in out.items() if k != "decision_ms_p99"
    }
    assert main(replay_argv("--policy", "fgd")) == 0
    assert capsys.readouterr().out.startswith("fgd (replay): time-averaged allocation ")


def test_cli_default_mode_stays_the_fgd_protocol(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "packing", "--nodes", str(NODES), "--pods", str(PODS), "--policy", "random", "--json"]
    assert main(argv) == 0
    assert "alloc_at_100_median" in json.loads(capsys.readouterr().out)
    assert main([*argv, "--speedup", "10"]) == 2
    assert "--speedup is for --mode replay" in capsys.readouterr().err


def test_cli_replay_writes_the_object_to_a_file_and_prints_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "replay.json"
    assert main(replay_argv("--policy", "gpu-packing", "--seeds", "3", "--json", str(out))) == 0
    figures = json.loads(out.read_text())
    assert (figures["policy"], figures["seed"], figures["speedup"]) == ("gpupacking", 3, 1.0)
    assert capsys.readouterr().out.startswith("gpupacking (replay): time-averaged allocation ")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policy", "tetris"], "unknown packing policy"),
        (["--policy", "fgd", "--seeds", "1-2"], "one seed"),
        (["--policy", "fgd", "--speedup", "-1"], "speedup must be > 0"),
        (["--policy", "fgd", "--pods", str(SMALL / "pods.csv")], "missing column 'creation_time'"),
        (["--policy", "fgd", "--pods", "/nonexistent.csv"], "nonexistent"),
    ],
)
def test_cli_replay_bad_input_exits_2(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(replay_argv(*extra)) == 2
    assert message in capsys.readouterr().err


def test_a_pod_leaving_before_it_came_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = PODS.read_text().splitlines()[:3]
    head, first, second = rows
    cells = second.split(",")
    cells[9] = str(int(cells[8]) - 1)  # deletion_time one second before creation_time
    bad = tmp_path / "pods.csv"
    bad.write_text("\n".join([head, first, ",".join(cells)]) + "\n")
    assert main(replay_argv("--policy", "fgd", "--pods", str(bad))) == 2
    assert f"{bad}:3: deletion_time" in capsys.readouterr().err


def test_mode_is_only_for_packing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--mode", "replay", "--workload", "w.jsonl", "--cluster", "c.yaml"]) == 2
    assert "--mode is for `rally sim packing`" in capsys.readouterr().err
