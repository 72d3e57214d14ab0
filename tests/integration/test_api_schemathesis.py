"""The OpenAPI document against the live API: schemathesis generates requests for every operation from
the document and runs all its checks on the answers (Issue 18: the document was looser than the server,
so clients generated from it misled their users).

The API runs for real, over HTTP on a free port, on its own NATS JetStream server, with token
authentication: generated requests carry an admin token. It runs in a thread of its own, with its own
event loop: schemathesis calls it synchronously from the test.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from rallypoint_services.api import ApiConfig, build_app
from rallypoint_services.api.openapi import openapi_document
from schemathesis.specs.openapi.checks import positive_data_acceptance
from test_api_auth import register_nodes  # this folder is on sys.path (rootdir-relative imports)

from rallypoint.eventlog import EventLog, connect_nats
from rallypoint.infra import NatsServer, free_port
from rallypoint.security.tokens import TokenStore, create_token

#: Random examples per operation, besides the coverage phase's (every boundary and negative case the
#: document implies, ~570 for POST /v1/jobs alone): drawing them, not their HTTP round trips, is most of
#: the run's time (a JobSpec body ~0.1 s of CPU), and 50 found no more of the bugs tried than 25.
MAX_EXAMPLES = 25
#: Sequences of linked calls in the stateful run, each up to 6 calls.
STATEFUL_EXAMPLES = 30


class _LiveApi:
    """The API on a loop of its own thread, until ``stop``."""

    def __init__(self, nats_url: str, tokens: Path, port: int) -> None:
        self.nats_url, self.tokens, self.port = nats_url, tokens, port
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="live-api", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(30.0) or self.error is not None:
            raise RuntimeError(f"the API did not start: {self.error!r}")

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stopping.set)
        self.thread.join(30.0)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._stopping = asyncio.Event()
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported by start(), or lost with a test that already failed
            self.error = exc
            self.ready.set()

    async def _serve(self) -> None:
        nc = await connect_nats(self.nats_url, name="schemathesis-api")
        log = await EventLog.attach(nc)
        await register_nodes(log)  # two 8-GPU nodes: generated jobs are accepted and wait
        app = build_app(log, config=ApiConfig(source="schemathesis"), auth=TokenStore(self.tokens))
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self.ready.set()
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()
            await nc.close()


@pytest.fixture(scope="module")
def live_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of an API with its own NATS server (a fresh stream, no other tests'), whose tokens
    are ``_ADMIN``'s."""
    server = NatsServer(tmp_path_factory.mktemp("schemathesis") / "nats").start()
    api = _LiveApi(server.url, Path(_TOKENS.name) / "tokens.json", free_port())
    try:
        api.start()
        yield f"http://127.0.0.1:{api.port}"
    finally:
        api.stop()
        server.stop()
        _TOKENS.cleanup()


# Loaded eagerly (the document needs no server); the requests go to the live API of the fixture.
schema = schemathesis.openapi.from_dict(openapi_document())
schema.config.generation.update(max_examples=MAX_EXAMPLES)
# Every check but use_after_free: DELETE /v1/jobs/{id} cancels the job, which stays readable (its state,
# history and checkpoints are what `rally show` and accounting need), as squeue/sacct keep a scancelled
# job; schemathesis assumes a DELETE removes the resource.
schema.config.checks.update(included_check_names=["all"], excluded_check_names=["use_after_free"])
# 413 (a body over the API's 1 MiB, which a schema has no words for) refuses invalid data too.
schema.config.checks.negative_data_rejection.expected_statuses.append("413")
# The admin token exists before collection: schemathesis generates its explicit examples, credentials
# included, while it collects. The folder goes when the module's API stops (or at exit).
_TOKENS = tempfile.TemporaryDirectory(prefix="rally-schemathesis-")
_, _ADMIN = create_token(Path(_TOKENS.name) / "tokens.json", user="schemathesis", admin=True)


@schema.auth()
class AdminToken:
    """Every request as the admin: schemathesis knows the credentials are supplied, so it does not count
    a request that carries them as one that violates the security requirement."""

    def get(self, case: Any, context: Any) -> str:
        return _ADMIN

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


#: The rules of a job spec that JSON Schema cannot state, so a schema-valid spec may break them (422,
#: documented in prose): field -> a fragment of the refusal's detail ("" for any). Sizes against the
#: cluster, divisibility, order of the elastic bounds, totals in bytes, the token's team, a reused key.
UNSTATED_RULES = {
    "gpus": "",
    "gpus_per_task": "",
    "ranks_per_task": "",
    "min_gpus": "",
    "max_gpus": "",
    "gpu_step": "",
    "topology_preferred": "wider than",
    "team": "",
    "command": "as JSON",
    "env": "as JSON",
    "idempotency_key": "already used",
    # what exists in the cluster, and an array's sizes: no schema can say
    "depends_on.job_id": "",
    "array": "",
    "secrets": "an array cannot have secrets",
    # a fraction of one GPU: one GPU, one rank, not elastic (relations no schema keyword states)
    "gpu_milli": "",
    "gpu_memory_mib": "",
    "mig_profile": "",
    "kind": "no time_limit_s",
    # one affinity rule per group (uniqueness of one property across items: no schema keyword states it)
    "affinity.group": "one rule per group",
}


def _refused_only_for_unstated_rules(ctx: Any, response: Any, case: Any) -> None:
    """positive_data_acceptance for POST /v1/jobs: a schema-valid spec is accepted unless it breaks one
    of ``UNSTATED_RULES``; a refusal for anything the document could have said fails."""
    if not case.meta.generation.mode.is_positive or response.status_code != 422:
        return
    problem = response.json()
    fragment = UNSTATED_RULES.get(re.sub(r"\[\d+\]", "", problem.get("field") or ""))
    assert fragment is not None and fragment in problem["detail"], f"schema-valid spec refused: {problem}"


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case: Any, live_api: str) -> None:
    case.call_and_validate(base_url=live_api, **_checks_for(case))


def _checks_for(case: Any) -> dict[str, Any]:
    """Every check, with positive_data_acceptance narrowed to ``UNSTATED_RULES`` for submissions."""
    if (case.method, case.path) != ("POST", "/v1/jobs"):
        return {}
    return {
        "excluded_checks": [positive_data_acceptance],
        "additional_checks": [_refused_only_for_unstated_rules],
    }


def test_stateful_links_from_a_submitted_job(live_api: str) -> None:
    """Sequences that follow the document's links: submit, then read, cancel, list checkpoints, read the
    history and logs of the job just made, every check on every answer."""
    schema.config.update(base_url=live_api)  # before the machine is built: it copies the config

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def validate_response(
            self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            case.validate_response(
                response, transport_kwargs=kwargs or None, recorder=self.recorder, **_checks_for(case)
            )

    Workflow.run(
        settings=settings(
            max_examples=STATEFUL_EXAMPLES,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
    )
