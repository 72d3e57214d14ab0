"""``rally sim`` and ``rally trace convert`` through the ``rally`` console script's entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rallypoint.cli.main import main


def rally(*argv: str) -> int:
    """The console script's own entry point, so a command wired wrongly there fails here too."""
    return main(list(argv))


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    w = tmp_path / "w.jsonl"
    w.write_text(
        "\n".join(
            json.dumps(
                {"id": f"j{i}", "submit": i * 10, "gpus": [1, 4, 8][i % 3], "duration": 100 + i, "team": "a"}
            )
            for i in range(12)
        )
        + "\n"
    )
    c = tmp_path / "c.yaml"
    c.write_text("generator: {racks: 1, nodes_per_rack: 2, gpus_per_node: 8}\n")
    return w, c


def test_sim_writes_json_per_job_and_report(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    w, c = inputs
    out, pj, rep = tmp_path / "s.json", tmp_path / "pj.jsonl", tmp_path / "rep"
    args = ["sim", "--workload", str(w), "--cluster", str(c), "--policy", "fifo"]
    assert rally(*args, "--json", str(out), "--per-job", str(pj), "--report", str(rep)) == 0
    s = json.loads(out.read_text())
    assert s["jobs"] == s["completed"] == 12
    for key in (
        "jct",
        "queue",
        "bounded_slowdown",
        "makespan",
        "gpu_utilization",
        "alloc_fraction",
        "fragmentation",
        "quota_honoured",
        "jain_fairness",
        "per_class",
        "per_team",
    ):
        assert key in s
    rows = [json.loads(x) for x in pj.read_text().splitlines()]
    assert len(rows) == 12 and {"id", "submit", "start", "end", "gpus", "preemptions"} <= set(rows[0])
    assert (rep / "index.html").exists() and (rep / "timeline.png").stat().st_size > 1000


def test_compare_prints_a_table(inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    w, c = inputs
    assert (
        rally("sim", "compare", "--workload", str(w), "--cluster", str(c), "--policy", "fifo,easy-backfill")
        == 0
    )
    out = capsys.readouterr().out
    assert "| fifo |" in out and "| easy-backfill |" in out


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        ("missing", "cannot read"),
        ("malformed", "w.jsonl:1:"),
        ("policy", "unknown policy"),
    ],
)
def test_bad_input_is_one_line_on_stderr(
    inputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: str, needle: str
) -> None:
    w, c = inputs
    policy = "fifo"
    if mutate == "missing":
        w = tmp_path / "nope.jsonl"
    elif mutate == "malformed":
        w.write_text('{"id": 1}\n')
    else:
        policy = "nope"
    assert rally("sim", "--workload", str(w), "--cluster", str(c), "--policy", policy) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and err.startswith("rally sim: error:")


def test_trace_convert_philly_sample(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "conv"
    code = rally(
        "trace",
        "convert",
        "philly",
        "--out",
        str(out),
        "--jobs",
        str(data_dir / "philly_sample.csv"),
        "--vc-sizes",
        str(data_dir / "philly_vc.csv"),
        "--start",
        "2017-10-02",
        "--days",
        "0.5",
        "--load",
        "1.1",
    )
    assert code == 0
    assert {p.name for p in out.iterdir()} >= {"workload.jsonl", "cluster.yaml", "queues.yaml"}
    w, c, q = out / "workload.jsonl", out / "cluster.yaml", out / "queues.yaml"
    assert (
        rally("sim", "--workload", str(w), "--cluster", str(c), "--queues", str(q), "--policy", "fifo") == 0
    )
    assert rally("trace", "convert", "philly", "--out", str(out), "--jobs", str(tmp_path / "x.csv")) == 2
    assert "no such file" in capsys.readouterr().err
