"""`rally run --pty` / `rally attach`: a terminal the rank's agent did not open (502, 503: a loaded node,
a rank just started) is asked for again a few times; what the API refuses itself is said at once."""

from __future__ import annotations

import pytest

from rallypoint.cli import interactive_cmds
from rallypoint.cli.client import ApiClient
from rallypoint.interactive import client as terminal_client
from rallypoint.interactive.client import Ending, HandshakeRefused


def _refusing(monkeypatch: pytest.MonkeyPatch, statuses: list[int]) -> list[int]:
    """``run`` refuses with each of ``statuses`` in turn, then ends with exit status 0; returns the calls."""
    calls: list[int] = []

    def run(*_args: object) -> Ending:
        calls.append(len(calls))
        if len(calls) <= len(statuses):
            raise HandshakeRefused(statuses[len(calls) - 1], "Service Unavailable")
        return Ending(status=0)

    monkeypatch.setattr(terminal_client, "run", run)
    monkeypatch.setattr(interactive_cmds, "ATTACH_RETRY_S", 0.0)
    return calls


def test_an_agent_that_did_not_answer_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _refusing(monkeypatch, [503, 502])
    assert interactive_cmds._attach(ApiClient("http://127.0.0.1:9"), "j-1", 0) == 0
    assert len(calls) == 3


def test_after_the_last_try_the_refusal_is_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _refusing(monkeypatch, [503] * interactive_cmds.ATTACH_TRIES)
    assert interactive_cmds._attach(ApiClient("http://127.0.0.1:9"), "j-1", 0) == interactive_cmds.EXIT_ERROR
    assert len(calls) == interactive_cmds.ATTACH_TRIES
    err = capsys.readouterr().err
    assert "did not open its terminal (HTTP 503" in err and "rally attach j-1" in err


def test_the_apis_own_refusal_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _refusing(monkeypatch, [409])
    monkeypatch.setattr(interactive_cmds, "_refusal", lambda _c, job_id, err: f"{job_id}: {err}")
    assert interactive_cmds._attach(ApiClient("http://127.0.0.1:9"), "j-1", 0) == interactive_cmds.EXIT_ERROR
    assert len(calls) == 1
    assert "j-1: HTTP 409" in capsys.readouterr().err
