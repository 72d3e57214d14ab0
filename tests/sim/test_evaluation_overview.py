"""The overview table of docs/evaluation.md: one row per Philly week and load, criteria from the summaries."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

from rallypoint.sim.evaluate import (
    _checks,
    _philly_overview,
    _published_order,
    _replay_rows,
    packing_curves,
    packing_run,
    packing_variants,
    predict_cases,
    predict_run,
    predict_section,
    render,
)


def summary(jct: float, top_p99: float, backlog: float = 0.97, quota: float = 1.0) -> dict[str, Any]:
    return {
        "jct": {"avg": jct},
        "per_class": {"training-high": {"queue": {"p99": top_p99}}},
        "backlog_utilization": backlog,
        "quota_honoured": {"min": quota},
    }


def run(week: str, load: float, rp: float, las: float, quota: float = 1.0) -> dict[str, Any]:
    s = {"fifo": summary(20_000, 5_000), "las": summary(las, 900), "rallypoint": summary(rp, 0, quota=quota)}
    return {
        "week": week,
        "load": load,
        "info": {"gpus": 512},
        "floor": 6_500.0,
        "summaries": s,
        "checks": _checks(s),
    }


def test_a_row_per_week_and_load_with_ratios_and_the_criteria_missed() -> None:
    lines = _philly_overview(
        [run("2017-10-02", 0.9, 8_000, 8_100), run("2017-10-09", 1.1, 9_000, 8_800, 0.5)]
    )
    assert lines[2] == (
        "| 2017-10-02 | 0.9 | 512 | 6,500 | 20,000 | 8,100 | 8,000 | 0.400x | 0.988x | 5/5 | - | - |"
    )
    assert lines[3] == (
        "| 2017-10-09 | 1.1 | 512 | 6,500 | 20,000 | 8,800 | 9,000 | 0.450x | 1.023x "
        "| 3/5 (not: avg JCT <= las, no team below guaranteed share while pending) | - | - |"
    )


def test_the_criteria_follow_the_figures() -> None:
    s = {"fifo": summary(10_000, 1_000), "las": summary(4_000, 50), "rallypoint": summary(5_001, 101, 0.94)}
    met = {name: ok for name, ok, _ in _checks(s)}
    assert met == {
        "avg JCT <= 0.5 x fifo": False,
        "avg JCT <= las": False,
        "training-high p99 queue <= fifo/10": False,
        "utilization under backlog >= 95% of fillable": False,
        "no team below guaranteed share while pending": True,
    }


def test_a_half_fifo_line_below_the_no_wait_floor_is_marked_unreachable() -> None:
    light = run("2017-10-23", 0.9, 19_900, 19_950)
    light["floor"] = 19_800.0  # fifo (20,000) hardly queues: no policy can halve its avg JCT
    [row] = _philly_overview([light])[2:3]
    assert "avg JCT <= 0.5 x fifo (unreachable: no-wait floor is 0.990x fifo)" in row
    [contended] = _philly_overview([run("2017-10-09", 0.9, 12_000, 13_000)])[2:3]
    assert "(not: avg JCT <= 0.5 x fifo) |" in contended  # floor 6,500 = 0.325x fifo: reachable


def test_misses_of_las_are_split_by_what_the_quotas_off_run_shows() -> None:
    priced = run("2017-10-09", 1.1, 9_000, 8_800)
    priced["without_quotas"] = summary(8_200, 0, quota=0.0)
    unexplained = run("2017-10-16", 0.9, 10_600, 10_500)
    unexplained["without_quotas"] = summary(10_550, 0, quota=0.2)
    ahead = run("2017-10-02", 0.9, 8_000, 8_100)
    ahead["without_quotas"] = summary(7_900, 0, quota=0.0)
    lines = _philly_overview([priced, unexplained, ahead])
    assert lines[2].endswith("| 8,200 (0.000) | - |")
    assert lines[4].endswith("| 7,900 (0.000) | - |")
    text = lines[-2]
    assert (
        "explains (rallypoint without quotas is not behind las): 2017-10-09 / 1.1 (9,000 with quotas, "
        "8,200 without, las 8,800; quota min without: 0.000)." in text
    )
    assert text.endswith("Misses of `<= las` not explained by the guarantee: 2017-10-16 / 0.9.")
    assert "2017-10-02" not in text  # met: not a miss


def test_misses_are_split_by_whether_the_fluid_reference_reaches_las_keeping_the_guarantee() -> None:
    beyond = run("2017-10-16", 0.9, 10_600, 10_500)
    beyond["fluid"] = {"kept": 10_560.4, "off": 10_480.0}
    within = run("2017-10-09", 1.1, 9_000, 8_800)
    within["fluid"] = {"kept": 8_700.0, "off": 8_000.0}
    met = run("2017-10-02", 0.9, 8_000, 8_100)
    met["fluid"] = {"kept": 7_990.0, "off": 7_900.0}
    lines = _philly_overview([beyond, within, met])
    assert lines[2].endswith("| 10,560 / 10,480 |")
    text = lines[-2]
    assert text.startswith("The fluid reference (`rallypoint.sim.fluid`) is an idealized scheduler")
    assert (
        "Misses of `<= las` where even it, keeping the guarantee, is behind las (fluid vs las avg JCT): "
        "2017-10-16 / 0.9 (10,560 vs 10,500)." in text
    )
    assert text.endswith(
        "Misses where it keeps the guarantee and is not behind las: 2017-10-09 / 1.1 (8,700 vs 8,800)."
    )
    assert "2017-10-02" not in text


def test_without_fluid_figures_there_is_no_fluid_paragraph() -> None:
    lines = _philly_overview([run("2017-10-09", 1.1, 9_000, 8_800)])
    assert not any(line.startswith("The fluid reference") for line in lines)


def predicted(
    week: str, load: float, baseline_1min: float | None = 0.990, cov: float = 0.997
) -> dict[str, Any]:
    figures = {
        "jobs": 11_386,
        "within_1min": 0.9921,
        "within_10min": 0.994,
        "median_abs_error_s": 0.0,
        "p90_coverage": cov,
        "waited_jobs": 89,
        "waited_within_1min": 0.0337,
        "waited_within_10min": None,
        "baseline_within_1min": baseline_1min,
        "baseline_within_10min": 0.993,
        "runtime_within_50pct": 0.881,
        "runtime_off_2x": 0.096,
        "predicted_jobs": 141,
        "predicted_p90_coverage": 0.872,
        "predicted_p90_run_coverage": 0.794,
    }
    return {"week": week, "load": load, "gpus": 640, "figures": figures, "wall": 1_240.6}


def test_the_predicted_start_section_has_a_row_per_week_and_load_and_says_what_was_run() -> None:
    lines = predict_section([predicted("2017-10-02", 0.9), predicted("2017-10-09", 1.1, 0.5, 0.95)], 5)
    assert lines[0] == "## 5. Predicted start times\n"
    assert "Run here: 2017-10-02 at 0.9, 2017-10-09 at 1.1. The harness's cost grows" in lines[1]
    assert lines[4] == (
        "| 2017-10-02 | 0.9 | 640 | 11,386 | 0.992 | 0.994 | 0 | 0.997 | 141: 0.872 (0.794) | 89 | 0.034 / - "
        "| 0.990 / 0.993 | 0.881 | 0.096 | 1,241 |"
    )
    assert lines[5].startswith("| 2017-10-09 | 1.1 | 640 | 11,386 | 0.992 | 0.994 | 0 | 0.950 | 141: ")
    older = predicted("2017-10-02", 0.9)  # figures from before the calibrated P90: no such column
    del older["figures"]["predicted_jobs"]
    assert "| 0.997 | - | 89 |" in predict_section([older], 5)[4]
    assert lines[-1].startswith("Why the issue's targets are or are not reachable on this trace: docs/pred")
    assert lines[-1].endswith(
        "Here the baseline is within 1 min for 0.500-0.990 of the jobs: 3x it can be reached in no row; "
        "P90 coverage over all jobs is 0.950-0.997 against the issue's 0.87-0.93.\n"
    )
    low = predict_section([predicted("2017-10-02", 0.9, 0.3)], 5)[-1]
    assert "3x it can be reached only in rows where it is 0.333 or less;" in low
    none = predict_section([predicted("2017-10-02", 0.9, None)], 5)[-1]
    assert "Here the baseline" not in none


def test_predicted_starts_default_to_every_week_at_the_lowest_load() -> None:
    assert predict_cases("2017-10-02,2017-10-09", "1.1,0.9", None) == [
        ("2017-10-02", 0.9),
        ("2017-10-09", 0.9),
    ]
    assert predict_cases("2017-10-02", "0.9,1.1", "0.9,1.1") == [("2017-10-02", 0.9), ("2017-10-02", 1.1)]


def test_the_section_follows_the_others_and_leaves_them_unchanged(data_dir: Path, tmp_path: Path) -> None:
    """The harness on the first 80 jobs of the repository's Philly sample (8 GPUs: some jobs wait),
    seconds; rendered alone, and after the other sections without changing a byte of them."""
    (tmp_path / "philly").mkdir()
    rows = (data_dir / "philly_sample.csv").read_text().splitlines()[:81]
    (tmp_path / "philly" / "philly_open.csv").write_text("\n".join(rows) + "\n")
    shutil.copy(data_dir / "philly_vc.csv", tmp_path / "philly" / "philly_vc.csv")
    run = predict_run(tmp_path, "2017-10-02", 0.9, io.StringIO())
    f = run["figures"]
    assert (f["jobs"], run["gpus"]) == (80, 8) and f["waited_jobs"] > 0
    golden = [
        {"gpus": 64, "match": 3, "rows": 3, "avg_jct": 1.0, "avg_queue": 0.0, "makespan": 9, "util": 0.5}
    ]
    others = render(golden, [], [], "img", 1.0)
    both = render(golden, [], [], "img", 1.0, (), [run])
    assert "Predicted start times" not in others
    assert both.startswith(others)
    section = both[len(others) :].splitlines()
    assert section[0] == "## 5. Predicted start times"
    [row] = [line for line in section if line.startswith("| 2017-10-02 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["2017-10-02", "0.9", "8", "80", f"{f['within_1min']:.3f}"]
    assert cells[9] == str(f["waited_jobs"]) and len(cells) == 15
    alone = render([], [], [], "img", 1.0, (), [run])
    assert alone.endswith(both[len(others) :]) and "### " not in alone


OPENB_SAMPLES = Path(__file__).resolve().parents[1] / "data"


def openb_traces(tmp_path: Path) -> Path:
    """A traces folder with the openb layout: the 39 sample nodes, a timed list (`default`, 300 pods with
    creation/deletion times) and one without times (`untimed`, openb_small's 300 pods)."""
    base = tmp_path / "alibaba-openb"
    base.mkdir()
    shutil.copy(OPENB_SAMPLES / "openb_small_timed" / "nodes.csv", base / "openb_node_list_gpu_node.csv")
    shutil.copy(OPENB_SAMPLES / "openb_small_timed" / "pods.csv", base / "openb_pod_list_default.csv")
    shutil.copy(OPENB_SAMPLES / "openb_small" / "pods.csv", base / "openb_pod_list_untimed.csv")
    return tmp_path


def test_the_packing_section_has_every_policy_and_list_and_follows_the_others(tmp_path: Path) -> None:
    from rallypoint.sim.packing import POLICIES

    traces = openb_traces(tmp_path)
    assert packing_variants(traces) == ["default", "untimed"]
    log = io.StringIO()
    runs = [packing_run(traces, v, [1, 2], [1.0, 1000.0], log) for v in ("default", "untimed")]
    timed, untimed = runs
    assert list(timed["fgd"]) == list(POLICIES) and timed["fgd"]["fgd"]["seeds"] == [1, 2]
    assert set(timed["replay"]) == {1.0, 1000.0} and untimed["replay"] == {}
    assert timed["replay"][1000.0]["bestfit"]["waited_pods"] > 0  # packed 1000x, the 39 nodes fill up
    img = tmp_path / "img"
    img.mkdir()
    curve = packing_curves(traces, "default", 1, img, log)
    assert (img / curve).stat().st_size > 1000
    packing = {"runs": runs, "seeds": [1, 2], "curve": curve}
    golden = [
        {"gpus": 64, "match": 3, "rows": 3, "avg_jct": 1.0, "avg_queue": 0.0, "makespan": 9, "util": 0.5}
    ]
    others = render(golden, [], [], "img", 1.0)
    both = render(golden, [], [], "img", 1.0, (), (), packing)
    assert both.startswith(others)
    section = both[len(others) :].splitlines()
    assert section[0] == "## 6. GPU sharing: openb packing"
    assert "median over seeds 1-2 (`--packing-seeds`" in section[2]
    head = next(line for line in section if line.startswith("| pod list | pods |"))
    assert head == "| pod list | pods | " + " | ".join(POLICIES) + " | published order |"
    [row] = [line for line in section if line.startswith("| default | 300 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:-1] == [f"{float(timed['fgd'][p]['alloc_at_100_median']):.2f}" for p in POLICIES]
    assert f"![{curve}](img/{curve})" in section
    recorded = section.index("Speedup 1 (as recorded):")
    packed = section.index("Speedup 1000:")
    # as recorded nothing waits on the sample either: one row for every policy
    assert section[recorded + 4].startswith(f"| default | all {len(POLICIES)} (identical) | ")
    rows = [line for line in section[packed:] if line.startswith("| default | ")]
    assert [r.split("|")[2].strip() for r in rows] == list(POLICIES)
    assert "No recorded times, so no replay: untimed." in section[-2]


def test_the_published_order_and_the_identical_replays_are_read_from_the_figures() -> None:
    ordered = {"random": 86.0, "dotprod": 90.0, "gpuclustering": 91.0, "gpupacking": 91.5, "bestfit": 93.0,
               "fgd": 95.0, "rallypoint": 94.0}  # fmt: skip
    assert _published_order(ordered) == "yes"  # rallypoint is not part of the published order
    assert _published_order({**ordered, "gpupacking": 90.9}) == "**no**"
    figures = {
        "time_avg_alloc": 1.5, "peak_alloc": 3.0, "alloc_while_waiting": None, "waited_pods": 0,
        "wait_s_mean": 0.0, "wait_s_p50": 0.0, "wait_s_p95": 0.0, "max_queue": 0, "failed_pods": 2,
        "placed_pods": 98,
    }  # fmt: skip
    same = {"a": {**figures, "decision_ms_p99": 0.1}, "b": {**figures, "decision_ms_p99": 0.3}}
    assert _replay_rows("v", same) == [
        "| v | all 2 (identical) | 1.5000 | 3.00 | - | 0 | 0.00 | 0.0 | 0.0 | 0 | 2 | 98 | 0.30 |"
    ]
    differ = {
        **same,
        "b": {**figures, "waited_pods": 1, "alloc_while_waiting": 97.123, "decision_ms_p99": 0.3},
    }
    assert [r.split("|")[2].strip() for r in _replay_rows("v", differ)] == ["a", "b"]
    assert "| 97.12 | 1 |" in _replay_rows("v", differ)[1]
