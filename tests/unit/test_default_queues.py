"""`rally up`'s queue file: the default one is sized from the cluster and read by the services' reader;
--queues FILE replaces it, --no-queues runs without quotas."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rallypoint.cli import cluster_cmds
from rallypoint.localcluster.default_queues import TEAMS, default_queues
from rallypoint.scheduling.queues import load_queues, queues_from_obj


@pytest.mark.parametrize(("gpus", "nominals", "limit"), [(32, [8, 8, 8, 8], 24), (30, [8, 8, 7, 7], 22)])
def test_the_cluster_is_split_evenly_over_one_cohort(gpus: int, nominals: list[int], limit: int) -> None:
    q = queues_from_obj(default_queues(gpus))
    assert [t.name for t in q.teams] == list(TEAMS)
    assert [t.nominal for t in q.teams] == nominals and sum(nominals) == gpus
    assert {t.cohort for t in q.teams} == {"lab"}
    assert [(o.name, o.limit) for o in q.orgs] == [("research", limit)]
    assert q.lineage("nlp") == ["research"] and q.lineage("demo") == []
    assert q.team("nlp").borrowing_limit == q.team("nlp").nominal
    assert q.team("demo").borrowing_limit is None  # borrows whatever idle nominal the cohort has


def up_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cluster_cmds.add_parsers(parser.add_subparsers())
    return parser.parse_args(["up", *argv])


def test_rally_up_writes_the_default_file_into_its_data_folder(tmp_path: Path) -> None:
    path = cluster_cmds._queue_file(up_args("--nodes", "3", "--gpus-per-node", "4"), tmp_path)
    assert path == tmp_path / "queues.yaml"
    assert path.read_text().startswith("# The local cluster's queues")
    assert sum(t.nominal for t in load_queues(path).teams) == 12


def test_a_given_file_or_none_replaces_the_default(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    assert cluster_cmds._queue_file(up_args("--queues", str(mine)), tmp_path) == mine
    assert cluster_cmds._queue_file(up_args("--no-queues"), tmp_path) is None
    assert not (tmp_path / "queues.yaml").exists()
    with pytest.raises(SystemExit):
        up_args("--queues", str(mine), "--no-queues")
