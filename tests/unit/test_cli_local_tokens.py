"""The local cluster's tokens across restarts of its folder (issue 31): kept while the API's token file
accepts them, replaced one by one when not, and a corrupt file refused rather than silently reset (it
holds the revocations)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.localcluster.localtokens import keep_or_make_tokens
from rallypoint.security.tokens import TokenStore, create_token, read_tokens, revoke_token

TEAMS = ("nlp", "vision")


def test_a_restart_keeps_every_token_and_replaces_only_a_revoked_one(tmp_path: Path) -> None:
    api_file, kept_file = tmp_path / "api-tokens.json", tmp_path / "local-tokens.json"
    first = keep_or_make_tokens(api_file, kept_file, TEAMS)
    assert kept_file.stat().st_mode & 0o777 == 0o600
    _, operator_made = create_token(api_file, user="alice", team="nlp")
    (vision,) = [r for r in read_tokens(api_file).tokens if r.user == "vision"]
    revoke_token(api_file, vision.id)

    second = keep_or_make_tokens(api_file, kept_file, (*TEAMS, "new-team"))
    assert (second.admin, second.teams["nlp"]) == (first.admin, first.teams["nlp"])
    assert second.teams["vision"] != first.teams["vision"] and "new-team" in second.teams
    store = TokenStore(api_file)
    assert store.authenticate(operator_made) is not None, "a `rally tokens create` token stays"
    assert store.authenticate(first.teams["vision"]) is None, "a revocation stays"
    assert keep_or_make_tokens(api_file, kept_file, TEAMS).teams == {t: second.teams[t] for t in TEAMS}


def test_a_token_of_another_role_is_not_taken_for_the_admin(tmp_path: Path) -> None:
    api_file, kept_file = tmp_path / "api-tokens.json", tmp_path / "local-tokens.json"
    first = keep_or_make_tokens(api_file, kept_file, TEAMS)
    kept_file.write_text(kept_file.read_text().replace(first.admin, first.teams["nlp"]))
    assert keep_or_make_tokens(api_file, kept_file, TEAMS).admin not in (first.admin, first.teams["nlp"])


def test_an_unreadable_api_token_file_is_refused_not_reset(tmp_path: Path) -> None:
    api_file, kept_file = tmp_path / "api-tokens.json", tmp_path / "local-tokens.json"
    keep_or_make_tokens(api_file, kept_file, TEAMS)
    api_file.write_text("{half")
    with pytest.raises(RuntimeError, match="token file cannot be read"):
        keep_or_make_tokens(api_file, kept_file, TEAMS)
    assert api_file.read_text() == "{half"
