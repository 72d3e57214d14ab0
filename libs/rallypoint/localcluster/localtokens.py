"""The local cluster's own API tokens (one admin, one per team), kept across restarts of its folder.

A restart of the same data folder is the same cluster: its event log is kept, and so are its tokens. The
API's token file (hashes only) stays as it is, with every token `rally tokens create` added and every
revocation; the cluster's own tokens themselves are kept beside it, owner-only, because a hash cannot give
them back. On a start, each kept token the API's file still accepts for its role is used again, so an
exported ``RALLY_TOKEN`` or the dashboard's saved token keeps working; a token that is missing, revoked or
no longer in the file is replaced by a new one (the revoked one stays revoked).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from rallypoint.security.tokens import TokenError, TokenStore, create_token, read_tokens, write_private


class LocalTokens(msgspec.Struct, kw_only=True):
    """What ``.rally/tokens.json`` holds: the admin token and each team's."""

    admin: str = ""
    teams: dict[str, str] = {}


def keep_or_make_tokens(api_file: Path, kept_file: Path, teams: Sequence[str]) -> LocalTokens:
    """The cluster's tokens: the kept ones the API's file still accepts, new ones for the rest; written
    back to ``kept_file``. RuntimeError when the API's file cannot be read (its revocations would be lost)."""
    try:
        read_tokens(api_file)
    except TokenError as exc:
        raise RuntimeError(
            f"the API's token file cannot be read ({exc}); fix it, or remove it and {kept_file} to start "
            "with new tokens (every token given out is then refused)"
        ) from None
    kept = _read_kept(kept_file)
    store = TokenStore(api_file)
    admin = kept.admin if _accepted(store, kept.admin, team=None) else _new(api_file, None)
    tokens = LocalTokens(
        admin=admin,
        teams={
            team: kept.teams[team]
            if _accepted(store, kept.teams.get(team), team=team)
            else _new(api_file, team)
            for team in teams
        },
    )
    write_private(kept_file, msgspec.json.format(msgspec.json.encode(tokens)) + b"\n")
    return tokens


def _read_kept(path: Path) -> LocalTokens:
    """The kept tokens; none when the file is absent or unreadable (each is then made anew)."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=LocalTokens)
    except (OSError, msgspec.DecodeError):
        return LocalTokens()


def _accepted(store: TokenStore, token: str | None, *, team: str | None) -> bool:
    """Whether the API takes ``token`` as ``team``'s (None: as an admin's)."""
    principal = store.authenticate(token) if token else None
    if principal is None:
        return False
    return principal.team == team and principal.admin == (team is None)


def _new(api_file: Path, team: str | None) -> str:
    return create_token(api_file, user=team or "admin", team=team, admin=team is None)[1]
