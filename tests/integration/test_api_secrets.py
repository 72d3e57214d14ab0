"""A job's secrets are not log entries (issue 30, item 4): the API over a real NATS.

``POST /v1/jobs`` with ``secrets`` stores the values in the ``rally-secrets`` bucket under the job id and
appends a ``JobSubmitted`` whose spec names them only; a job shows the names, never the values. A bad
secret is a 422 naming ``secrets.NAME`` that quotes no value and appends nothing, and a retry with the
same Idempotency-Key must send the same values (409 otherwise). Before, ``secrets`` was an unknown field
and the only way to give a rank a token was ``env``, which the log keeps for every reader.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import test_utils
from rallypoint_services.api import ApiConfig, build_app
from test_api_auth import Client, Tokens, assert_problem, events_of, register_nodes, tokens  # noqa: F401

from rallypoint.eventlog import EventLog
from rallypoint.eventlog.secretstore import SecretStore
from rallypoint.events import JobSubmitted
from rallypoint.security.tokens import TokenStore

#: what a test's secret values look like: found nowhere but the bucket
VALUE = "s3cr3t-{}"


def spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "pretrain", "team": "nlp", "gpus": 8, "command": ["python", "train.py"]}
    body.update(overrides)
    return body


def fresh_value() -> str:
    return VALUE.format(uuid.uuid4().hex)


@pytest.fixture
async def api(event_log: EventLog, tokens: Tokens) -> AsyncIterator[Client]:  # noqa: F811
    await register_nodes(event_log)
    app = build_app(event_log, config=ApiConfig(source="test-api"), auth=TokenStore(tokens.path))
    async with test_utils.TestClient(test_utils.TestServer(app)) as c:
        yield c


async def submit(api: Client, token: str, body: dict[str, Any], key: str | None = None) -> Any:
    headers = Tokens.auth(token) | ({"Idempotency-Key": key} if key else {})
    return await api.post("/v1/jobs", json=body, headers=headers)


async def raw_log(log: EventLog) -> list[bytes]:
    """Every message of the stream as stored: its headers and its data, undecoded."""
    last = await log.last_seq()
    raw: list[bytes] = []
    for seq in range(1, last + 1):
        msg = await log.js.get_msg(log.stream, seq)
        raw.append(repr(msg.headers).encode() + (msg.data or b""))
    return raw


async def test_secrets_are_stored_apart_and_the_log_names_them_only(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    wandb, pem = fresh_value(), f"-----BEGIN KEY-----\n{fresh_value()}\n-----END KEY-----"
    body = spec(env={"NCCL_DEBUG": "WARN"}, secrets={"WANDB_API_KEY": wandb, "TLS_KEY": pem})
    resp = await submit(api, tokens.nlp, body)
    assert resp.status == 202, await resp.text()
    job_id = (await resp.json())["job_id"]

    [submitted] = await events_of(event_log, JobSubmitted)
    assert submitted.spec.secret_names == ("TLS_KEY", "WANDB_API_KEY")
    assert submitted.spec.env == {"NCCL_DEBUG": "WARN"}
    for message in await raw_log(event_log):
        assert wandb.encode() not in message and b"BEGIN KEY" not in message

    store = await SecretStore.open(event_log.js, create=False)
    assert await store.read(job_id) == {"WANDB_API_KEY": wandb, "TLS_KEY": pem}

    shown = await api.get(f"/v1/jobs/{job_id}", headers=Tokens.auth(tokens.nlp))
    text = await shown.text()
    assert shown.status == 200, text
    assert (await shown.json())["spec"]["secret_names"] == ["TLS_KEY", "WANDB_API_KEY"]
    assert wandb not in text and "BEGIN KEY" not in text
    listed = await api.get("/v1/jobs?all=true", headers=Tokens.auth(tokens.admin))
    assert wandb not in await listed.text()


async def test_a_job_without_secrets_touches_no_bucket(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    resp = await submit(api, tokens.nlp, spec())
    assert resp.status == 202, await resp.text()
    [submitted] = await events_of(event_log, JobSubmitted)
    assert submitted.spec.secret_names == ()
    store = await SecretStore.open(event_log.js, create=False)
    assert await store.read(submitted.job_id) is None


BIG = "x" * (64 * 1024 + 1)


@pytest.mark.parametrize(
    ("secrets", "field", "why"),
    [
        ({"1TOKEN": "qz7"}, "secrets.1TOKEN", "not a valid environment variable name"),
        ({"BAD-NAME": "v"}, "secrets.BAD-NAME", "not a valid environment variable name"),
        ({"RALLY_TOKEN": "v"}, "secrets.RALLY_TOKEN", "Rallypoint sets"),
        ({"MASTER_ADDR": "v"}, "secrets.MASTER_ADDR", "Rallypoint sets"),
        ({"RANK": "v"}, "secrets.RANK", "Rallypoint sets"),
        ({"NCCL_DEBUG": "v"}, "secrets.NCCL_DEBUG", "also in env"),
        ({"TOKEN": 42}, "secrets.TOKEN", "must be a string"),
        ({"TOKEN": "qz7\x00qz7"}, "secrets.TOKEN", "NUL"),
        ({"TOKEN": "qz7\x1bqz7"}, "secrets.TOKEN", "control character"),
        ({"TOKEN": BIG}, "secrets.TOKEN", "at most 65536"),
        ({f"T{i}": "v" for i in range(33)}, "secrets", "at most 32"),
        ({f"T{i}": "y" * 60_000 for i in range(5)}, "secrets", "bytes as JSON"),
        (["TOKEN"], "secrets", "must be an object"),
    ],
)
async def test_a_bad_secret_is_refused_naming_it_and_appends_nothing(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    secrets: object,
    field: str,
    why: str,
) -> None:
    before = await event_log.last_seq()
    resp = await submit(api, tokens.nlp, spec(env={"NCCL_DEBUG": "WARN"}, secrets=secrets))
    problem = await assert_problem(resp, 422, field)
    assert why in problem["detail"], problem
    assert "qz7" not in problem["detail"] and "xxxx" not in problem["detail"]  # no value quoted back
    assert await event_log.last_seq() == before


async def test_secret_names_cannot_be_set_directly(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    before = await event_log.last_seq()
    resp = await submit(api, tokens.nlp, spec(secret_names=["WANDB_API_KEY"]))
    await assert_problem(resp, 422, "secret_names")
    assert await event_log.last_seq() == before


async def test_a_retry_must_send_the_same_secret_values(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    key = f"secrets-{uuid.uuid4().hex}"  # the bucket outlives each test's stream: a key of its own
    value = fresh_value()
    first = await submit(api, tokens.nlp, spec(secrets={"TOKEN": value}), key)
    assert first.status == 202, await first.text()
    job_id = (await first.json())["job_id"]
    after_first = await event_log.last_seq()

    again = await submit(api, tokens.nlp, spec(secrets={"TOKEN": value}), key)
    assert again.status == 202, await again.text()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert (await again.json())["job_id"] == job_id

    other = fresh_value()
    changed = await submit(api, tokens.nlp, spec(secrets={"TOKEN": other}), key)
    problem = await assert_problem(changed, 409, "secrets")
    assert problem["job_id"] == job_id
    assert value not in str(problem) and other not in str(problem)
    # the same value under another name differs too
    renamed = await submit(api, tokens.nlp, spec(secrets={"OTHER": value}), key)
    await assert_problem(renamed, 409, "secrets")

    assert await event_log.last_seq() == after_first
    store = await SecretStore.open(event_log.js, create=False)
    assert await store.read(job_id) == {"TOKEN": value}


async def test_concurrent_twins_with_other_values_create_one_job_with_the_first_values(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
) -> None:
    key = f"twins-{uuid.uuid4().hex}"
    values = [fresh_value() for _ in range(4)]
    answers = await asyncio.gather(
        *(submit(api, tokens.nlp, spec(secrets={"TOKEN": v}), key) for v in values)
    )
    statuses = sorted(a.status for a in answers)
    assert statuses == [202, 409, 409, 409], [await a.text() for a in answers]
    [winner] = [v for v, a in zip(values, answers, strict=True) if a.status == 202]
    [submitted] = await events_of(event_log, JobSubmitted)
    store = await SecretStore.open(event_log.js, create=False)
    assert await store.read(submitted.job_id) == {"TOKEN": winner}


# --- rally submit --secret NAME=@FILE: a real CLI process against the API ------------------------------


async def rally_submit(api: Client, token: str, *flags: str, stdin: bytes = b"") -> tuple[int, str, str]:
    """``rally submit`` as a user runs it: its exit code, stdout and stderr."""
    argv = [str(Path(sys.executable).with_name("rally")), "submit", "--team", "nlp", "--gpus", "8"]
    argv += ["--api-url", str(api.make_url("")).rstrip("/"), *flags, "--", "python", "train.py"]
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "RALLY_TOKEN": token},
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_rally_submit_reads_each_secret_from_its_file_or_stdin(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    tmp_path: Path,
) -> None:
    token, pem = fresh_value(), f"line one\n{fresh_value()}\n"
    (tmp_path / "token").write_text(token + "\n")  # as `echo` writes it: the newline is not the secret's
    code, out, err = await rally_submit(
        api, tokens.nlp, "--secret", f"TOKEN=@{tmp_path / 'token'}", "--secret", "PEM=@-", stdin=pem.encode()
    )
    assert code == 0, err
    job_id = out.strip()
    [submitted] = await events_of(event_log, JobSubmitted)
    assert (submitted.job_id, submitted.spec.secret_names) == (job_id, ("PEM", "TOKEN"))
    store = await SecretStore.open(event_log.js, create=False)
    assert await store.read(job_id) == {"TOKEN": token, "PEM": pem.removesuffix("\n")}


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("TOKEN=qz7-on-the-command-line", "NAME=@FILE"),
        ("TOKEN=@/nonexistent/qz7", "cannot read /nonexistent/qz7: No such file or directory"),
        ("RALLY_TOKEN=@{file}", "error: --secret RALLY_TOKEN: "),
    ],
)
async def test_rally_submit_refuses_a_bad_secret_flag_without_a_request(
    api: Client,
    event_log: EventLog,
    tokens: Tokens,  # noqa: F811
    tmp_path: Path,
    flag: str,
    said: str,
) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text("qz7-in-the-file")
    before = await event_log.last_seq()
    code, out, err = await rally_submit(api, tokens.nlp, "--secret", flag.format(file=secret_file))
    assert code == 2 and out == ""
    assert said in err
    assert "qz7-on-the-command-line" not in err and "qz7-in-the-file" not in err
    assert await event_log.last_seq() == before
