"""`rally predictions`: how the cluster predicts start times now, and how good its predictions were
(``GET /v1/predictions``; docs/prediction.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .client import ApiClient, ApiError, ApiUnreachable, resolve_api_url
from .jobs_cmds import EXIT_ERROR, EXIT_OK, _api_arg, format_table
from .output import add_output_args, emit

#: (share key, count key of its scored jobs, what it measures), in the table's order.
MEASURES: tuple[tuple[str, str, str], ...] = (
    ("within_1min", "starts", "start within 1 min of its P50"),
    ("within_10min", "starts", "start within 10 min of its P50"),
    ("p90_coverage", "starts", "started no later than its P90"),
    ("runtime_within_50pct", "runtimes", "runtime within 50% of its P50"),
    ("runtime_off_2x", "runtimes", "runtime off by 2x or more"),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predictions",
        help="how start times are predicted, and how good the predictions were",
        description="The predictor's policy, log position and learned history, then each accuracy "
        "measure over the jobs scored since it started (first prediction against what happened).",
    )
    add_output_args(parser)
    _api_arg(parser)
    parser.set_defaults(func=cmd_predictions)


def cmd_predictions(args: argparse.Namespace) -> int:
    try:
        answer = ApiClient(resolve_api_url(args.api_url)).request("GET", "/v1/predictions").body
    except (ApiError, ApiUnreachable) as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    emit(args, answer, format_predictions)
    return EXIT_OK


def format_predictions(summary: dict[str, Any]) -> str:
    if not summary.get("available"):
        return "No predictor answered: start times are not predicted (is `rally serve predictor` running?)"
    head = (
        f"Predicting {summary['waiting_jobs']} waiting job(s) under {summary['policy']} at log seq "
        f"{summary['computed_at_seq']} (refresh {summary['refresh_s']:.3f} s); runtimes learned from "
        f"{summary['learned_jobs']} ended job(s)"
    )
    accuracy, shares = summary.get("accuracy") or {}, summary.get("shares") or {}
    rows = [
        (what, "-" if shares.get(key) is None else f"{shares[key]:.3f}", accuracy.get(count, 0))
        for key, count, what in MEASURES
    ]
    return head + "\n" + format_table(("MEASURE", "SHARE", "JOBS"), rows)
