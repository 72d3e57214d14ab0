"""Predicted starts (rallypoint.predict.starts) and ``rally sim predict``: exact where the answer is known,
only what was known at each submit, and every figure of the accuracy harness on the Philly sample."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from rallypoint.cli.main import main
from rallypoint.predict import JobFeatures, RuntimeEstimate, RuntimeEstimator, accuracy, predict_starts
from rallypoint.sim import Job, run_policy
from rallypoint.sim.cluster import load_cluster
from rallypoint.sim.workload import write_workload
from rallypoint.traces.convert import convert_philly

FIELDS = {
    "jobs",
    "within_1min",
    "within_10min",
    "median_abs_error_s",
    "p90_coverage",
    "waited_jobs",
    "waited_within_10min",
    "baseline_within_1min",
    "baseline_within_10min",
    "runtime_within_50pct",
    "runtime_off_2x",
}


def one_node(tmp_path: Path) -> Path:
    c = tmp_path / "c.yaml"
    c.write_text("generator: {racks: 1, nodes_per_rack: 1, gpus_per_node: 8}\n")
    return c


def whole_node_job(jid: str, submit: float) -> Job:
    return Job(id=jid, submit=submit, gpus=8, duration=100.0, team="a", time_limit=1000.0)


def scripted() -> list[Job]:
    """Three 100 s jobs run alone (history), then three arrive together on the one node: the second must
    start at 1,100 and the third at 1,200, which the learned runtime knows and the 1,000 s limits do not."""
    warm = [whole_node_job(f"w{i}", 200.0 * i) for i in range(3)]
    return [*warm, *(whole_node_job(j, 1000.0) for j in ("a", "b", "c"))]


def test_known_runtimes_on_one_node_are_predicted_exactly(tmp_path: Path) -> None:
    preds = {p.job_id: p for p in predict_starts(scripted(), load_cluster(one_node(tmp_path)), None, "fifo")}
    assert {j: (p.p50, p.start) for j, p in preds.items()} == {
        "w0": (0.0, 0.0),
        "w1": (200.0, 200.0),
        "w2": (400.0, 400.0),
        "a": (1000.0, 1000.0),
        "b": (1100.0, 1100.0),
        "c": (1200.0, 1200.0),
    }
    assert (preds["b"].p90, preds["c"].p90) == (1100.0, 1200.0)
    assert (preds["b"].baseline, preds["c"].baseline) == (2000.0, 3000.0)  # a holds the node to its limit
    figures = accuracy(list(preds.values()))
    assert (figures["within_1min"], figures["p90_coverage"]) == (1.0, 1.0)
    assert figures["baseline_within_1min"] == figures["started_at_submit"] == pytest.approx(4 / 6)
    assert figures["median_abs_error_s"] == 0.0


def test_without_json_one_line_of_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = tmp_path / "w.jsonl"
    write_workload(w, scripted())
    args = ["sim", "predict", "--workload", str(w), "--cluster", str(one_node(tmp_path)), "--policy", "fifo"]
    assert main(args) == 0
    line = capsys.readouterr().out
    assert line.startswith("policy fifo, jobs 6, started_at_submit 0.667, within_1min 1.000,")
    assert "waited_jobs 0, waited_within_1min -," in line


def test_forks_know_no_failure_to_come_and_leave_the_replay_alone(tmp_path: Path) -> None:
    """Random node failures: the replay with predictions fails the same nodes at the same times as a
    plain one (a fork that drew from the replay's generator would move them)."""
    c = tmp_path / "c.yaml"
    c.write_text(
        "generator: {racks: 1, nodes_per_rack: 1, gpus_per_node: 8}\n"
        "faults: {node_mtbf: 300, repair_time: 20}\n"
    )
    cluster = load_cluster(c)
    jobs = [whole_node_job(f"j{i}", 30.0 * i) for i in range(30)]
    preds = predict_starts(jobs, cluster, None, "fifo")
    truth = run_policy(jobs, cluster, None, "fifo").records
    assert truth and sum(r.failures for r in truth) > 0
    assert {p.job_id: p.start for p in preds if p.start is not None} == {r.id: r.start for r in truth}


class Spy(RuntimeEstimator):
    """Records, at each answer, which jobs' ends it had been told of."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []
        self.asked: list[tuple[float, int]] = []

    def observe(self, ended_at: float, features: JobFeatures, runtime_s: float) -> None:
        self.ends.append(ended_at)
        super().observe(ended_at, features, runtime_s)

    def estimate(self, features: JobFeatures, now: float, elapsed_s: float = 0.0):  # type: ignore[no-untyped-def]
        self.asked.append((now, len(self.ends)))
        return super().estimate(features, now, elapsed_s)


@pytest.fixture(scope="module")
def sample(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The Philly sample's 200 jobs of one day on 64 GPUs, written as ``rally trace convert`` writes
    them: about a quarter of them wait. Written once; no test changes it."""
    conv = convert_philly(
        data_dir / "philly_sample.csv", data_dir / "philly_vc.csv", datetime(2017, 10, 2), 1.0, gpus=64
    )
    paths = conv.write(tmp_path_factory.mktemp("philly") / "conv")
    return paths["workload"], paths["cluster"], paths["queues"]


def test_only_jobs_ended_by_the_submit_are_learned_and_the_replay_is_untouched(
    sample: tuple[Path, Path, Path],
) -> None:
    from rallypoint.sim.run import load_inputs

    jobs, cluster, queues = load_inputs(*sample)
    spy = Spy()
    preds = predict_starts(jobs, cluster, queues, "rallypoint", spy)
    truth = {r.id: r for r in run_policy(jobs, cluster, queues, "rallypoint").records}
    # forks leave the replay alone: every actual start is the plain simulation's
    assert {p.job_id: p.start for p in preds} == {j: r.start for j, r in truth.items()}
    # at every answer, each job it had been told of had really ended by then, in the plain replay too
    ends = sorted(r.end for r in truth.values())
    assert spy.asked and spy.ends
    for now, told in spy.asked:
        assert all(e <= now for e in spy.ends[:told])
        assert told <= sum(1 for e in ends if e <= now)


class Oracle(RuntimeEstimator):
    """Knows every job's true runtime."""

    def __init__(self, jobs: list[Job]) -> None:
        super().__init__()
        self.truth = {j.id: j.duration for j in jobs}

    def estimate(self, features: JobFeatures, now: float, elapsed_s: float = 0.0) -> RuntimeEstimate:
        assert features.job_id is not None
        runtime = self.truth[features.job_id]
        return RuntimeEstimate(p50=runtime, p90=runtime, key="oracle", samples=1)


def test_true_runtimes_predict_every_fifo_start_exactly(sample: tuple[Path, Path, Path]) -> None:
    """Under FIFO no later arrival can go ahead, so with the true runtimes the forks must find every
    actual start: what is left of a prediction's error is the runtimes' alone."""
    from rallypoint.sim.run import load_inputs

    jobs, cluster, queues = load_inputs(*sample)
    preds = predict_starts(jobs, cluster, queues, "fifo", Oracle(jobs))
    waited = [p for p in preds if p.start != p.submit]
    assert len(waited) > 20
    assert [(p.job_id, p.p50) for p in preds] == [(p.job_id, p.start) for p in preds]


def test_rally_sim_predict_prints_every_figure_the_same_each_time(
    sample: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, c, q = sample
    # its first 150 jobs (27 wait under FIFO): a third of the whole sample's cost, run twice here
    w = tmp_path / "first.jsonl"
    w.write_text("".join(sample[0].read_text().splitlines(keepends=True)[:150]))
    capsys.readouterr()
    args = ["sim", "predict", "--workload", str(w), "--cluster", str(c), "--queues", str(q)]
    assert main([*args, "--policy", "fifo", "--json"]) == 0
    printed = capsys.readouterr().out
    assert main([*args, "--policy", "fifo", "--json"]) == 0
    assert capsys.readouterr().out == printed  # deterministic: the same inputs, the same figures
    got = json.loads(printed)
    assert set(got) >= FIELDS
    assert got["policy"] == "fifo"
    assert got["jobs"] == sum(1 for line in w.read_text().splitlines() if line.strip())
    assert 0 < got["waited_jobs"] < got["jobs"]
    for k in FIELDS - {"jobs", "waited_jobs", "median_abs_error_s"}:
        assert 0.0 <= got[k] <= 1.0, k
    assert got["within_1min"] <= got["within_10min"]
    assert got["runtime_off_2x"] <= 1.0 - got["runtime_within_50pct"]
    assert got["median_abs_error_s"] >= 0.0
    assert main([*args, "--policy", "nope", "--json"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    assert main([*args, "--policy", "fifo,las"]) == 2
    assert main(["sim", "--workload", str(w), "--cluster", str(c), "--policy", "fifo", "--json"]) == 2
    assert "--json needs a FILE" in capsys.readouterr().err
