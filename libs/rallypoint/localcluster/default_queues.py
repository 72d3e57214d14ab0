"""The queue file `rally up` runs with when given none: a few teams, one cohort, borrowing and an org.

Sized from the cluster's shape, so a bigger `rally up --nodes N` is not held to a small cluster's quotas:
the GPUs are split evenly as nominal quota over the default teams (the first teams take the remainder),
all in one cohort, so an idle team's nominal is lent to busy ones and reclaimed when it needs it back.
``nlp`` and ``vision`` sit under the org ``research``, whose limit (three quarters of the cluster) keeps
them from holding every GPU together; ``nlp`` may borrow at most its nominal again. Every team has the same
fair-use limits (``FAIR_USE``) and none is given ``production``: a team token submits at most a burst of
100 jobs and 600 a minute, keeps at most 500 waiting, and uses every class but production. `rally demo`
submits its ten jobs as team demo; the benchmarks and the tests submit with the admin token, which is not
limited. The file is written
beside the cluster's data, where `rally up` prints it: copy and edit it, then pass it with ``--queues``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rallypoint.scheduling.queues import queues_from_obj

#: The teams a local cluster gives tokens to: the demo's, the benchmarks', two for trying things by hand.
TEAMS: tuple[str, ...] = ("demo", "bench", "nlp", "vision")
COHORT = "lab"
ORG = "research"
ORG_TEAMS: frozenset[str] = frozenset({"nlp", "vision"})
#: Each team's fair-use keys: far above what the demo batch (ten jobs) or a person trying things sends,
#: far below a runaway script's thousands a second (docs/api.md, "Fair use").
FAIR_USE: dict[str, int] = {"max_pending_jobs": 500, "submissions_per_minute": 600, "submission_burst": 100}

HEADER = """\
# The local cluster's queues (written by `rally up`, which was given no --queues). Every team may use its
# nominal GPUs; above that it borrows idle nominal of the other teams in its cohort (up to its
# borrowing_limit; none: unlimited), and gives it back by preemption when they need it (reclaim). An org's
# limit caps the GPUs of every team below it. A team token may keep max_pending_jobs waiting and submit
# submissions_per_minute (submission_burst at once); beyond, the API answers 429. No team may use the
# production class until its entry lists it, e.g. priorities: [production, training-high, training-standard,
# development, best-effort]. Edit a copy and pass it to `rally up --queues FILE`.
"""


def default_queues(total_gpus: int) -> dict[str, Any]:
    """The default queue configuration for a cluster of ``total_gpus`` GPUs."""
    share, extra = divmod(total_gpus, len(TEAMS))
    teams: list[dict[str, Any]] = []
    for i, name in enumerate(TEAMS):
        team: dict[str, Any] = {"name": name, "cohort": COHORT, "nominal": share + (1 if i < extra else 0)}
        if name in ORG_TEAMS:
            team["parent"] = ORG
        if name == "nlp":
            team["borrowing_limit"] = team["nominal"]
        team.update(FAIR_USE)
        teams.append(team)
    return {
        "cohorts": [{"name": COHORT}],
        "orgs": [{"name": ORG, "limit": total_gpus * 3 // 4}],
        "teams": teams,
    }


def write_default_queues(path: Path, total_gpus: int) -> Path:
    """Write the default file to ``path`` (checked by the reader the services use) and return it."""
    config = default_queues(total_gpus)
    queues_from_obj(config, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=110))
    return path
