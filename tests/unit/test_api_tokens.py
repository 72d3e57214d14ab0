"""API tokens: the file (hashes only, owner-only, atomic), the store the API reads, `rally tokens`."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from rallypoint.cli.client import ApiClient, resolve_token
from rallypoint.cli.main import main as rally
from rallypoint.scheduling.queues import QueuesError, queues_from_obj
from rallypoint.security.tokens import (
    TokenError,
    TokenStore,
    create_token,
    hash_token,
    read_tokens,
    revoke_token,
)


def test_the_file_keeps_only_a_hash_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    record, token = create_token(path, user="alice", team="nlp")
    text = path.read_text()
    assert token not in text and record.hash == hash_token(token) and record.hash in text
    assert token.startswith("rly_") and len(token) > 40
    assert path.stat().st_mode & 0o777 == 0o600
    assert [r.id for r in read_tokens(path).tokens] == [record.id]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"user": "alice"}, "either"),
        ({"user": "alice", "team": "nlp", "admin": True}, "either"),
        ({"user": "alice", "team": "NLP"}, "team"),
        ({"user": "al ice", "team": "nlp"}, "user"),
    ],
)
def test_bad_token_requests(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TokenError, match=message):
        create_token(tmp_path / "t.json", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "t.json").exists()


def test_store_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    store = TokenStore(path)  # no file yet: nobody gets in
    _, admin = create_token(path, user="ops", admin=True)
    record, nlp = create_token(path, user="alice", team="nlp")
    who = store.authenticate(nlp)
    assert who is not None and (who.user, who.team, who.admin) == ("alice", "nlp", False)
    assert who.may_act_for("nlp") and not who.may_act_for("vision")
    boss = store.authenticate(admin)
    assert boss is not None and boss.admin and boss.may_act_for("vision")
    assert store.authenticate("rly_guess") is None
    revoke_token(path, record.id)
    assert store.authenticate(nlp) is None and store.authenticate(admin) is not None
    assert read_tokens(path).tokens[1].revoked


def test_an_unreadable_file_lets_nobody_in(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    _, admin = create_token(path, user="ops", admin=True)
    store = TokenStore(path)
    assert store.authenticate(admin) is not None
    path.write_text("{not json")
    assert store.authenticate(admin) is None


def test_concurrent_creates_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    threads = [
        threading.Thread(target=create_token, args=(path,), kwargs={"user": f"u{i}", "team": "nlp"})
        for i in range(12)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.user for r in read_tokens(path).tokens) == sorted(f"u{i}" for i in range(12))


def test_rally_tokens_create_list_revoke(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "api" / "tokens.json"
    monkeypatch.setenv("RALLY_TOKENS_FILE", str(path))
    assert rally(["tokens", "create", "--team", "nlp", "--user", "alice"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert "\n" not in token and "shown only now" in err
    store = TokenStore(path)
    assert store.authenticate(token) is not None

    assert rally(["tokens", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["team"], row["user"], row["role"], row["revoked_at"]) == ("nlp", "alice", "team", None)
    assert "hash" not in row

    assert rally(["tokens", "revoke", row["id"]]) == 0
    capsys.readouterr()
    assert store.authenticate(token) is None
    assert rally(["tokens", "list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["ID", "ROLE", "TEAM", "USER"] and row["id"] in table[1]
    assert rally(["tokens", "revoke", "t-nothere"]) == 2
    assert "no token" in capsys.readouterr().err


def test_rally_tokens_needs_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RALLY_TOKENS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert rally(["tokens", "create", "--admin"]) == 2
    assert "--tokens-file" in capsys.readouterr().err
    # In the folder of `rally up`, the cluster file says where the API's token file is.
    (tmp_path / ".rally").mkdir()
    (tmp_path / ".rally" / "cluster.json").write_text(json.dumps({"tokens_file": str(tmp_path / "t.json")}))
    assert rally(["tokens", "create", "--admin"]) == 0
    assert read_tokens(tmp_path / "t.json").tokens[0].role == "admin"


def test_cli_token_precedence(tmp_path: Path) -> None:
    assert resolve_token(env={}, cwd=tmp_path) is None
    (tmp_path / ".rally").mkdir()
    (tmp_path / ".rally" / "tokens.json").write_text(
        json.dumps({"admin": "rly_a", "teams": {"nlp": "rly_n"}})
    )
    assert resolve_token(env={}, cwd=tmp_path) == "rly_a"
    assert resolve_token(env={"RALLY_TOKEN": "rly_env"}, cwd=tmp_path) == "rly_env"
    assert ApiClient("http://x", token="rly_given").token == "rly_given"


def test_client_resolves_its_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALLY_TOKEN", "rly_from_env")
    assert ApiClient("http://x").token == "rly_from_env"


def test_max_priority_must_be_a_class() -> None:
    queues = queues_from_obj({"teams": [{"name": "nlp", "max_priority": "development"}]})
    assert queues.priority_refusal("nlp", "training-standard") is not None
    assert queues.priority_refusal("nlp", "best-effort") is None
    assert queues.priority_refusal("other", "training-high") is None
    # production is reserved: a team the file does not grant it may not use it (tests/unit/test_fairuse.py)
    assert queues.priority_refusal("other", "production") is not None
    with pytest.raises(QueuesError, match="max_priority"):
        queues_from_obj({"teams": [{"name": "nlp", "max_priority": "urgent"}]})


def test_serve_api_refuses_to_start_without_tokens(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rallypoint_services.api.service import main as serve_api

    monkeypatch.delenv("RALLY_TOKENS_FILE", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        serve_api(["--nats-url", "nats://127.0.0.1:1"])
    assert exit_info.value.code == 2
    assert "--tokens-file" in capsys.readouterr().err
    assert os.environ.get("RALLY_TOKENS_FILE") is None
