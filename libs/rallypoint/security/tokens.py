"""API bearer tokens: who is calling, for which team, kept in a file the API reads.

A token is 32 random bytes (``secrets``), shown once when it is created; the file keeps only its
sha256. A salted slow hash (bcrypt, argon2) protects *guessable* secrets such as passwords from an
offline dictionary attack; a 256-bit random token cannot be guessed, so one sha256 is as strong and
lets the API find a token with one dictionary lookup per request instead of a 100 ms hash.

The file is the unit an operator manages (``rally tokens create|list|revoke`` on the API host, or any
tool that writes the same JSON); the API re-reads it when its stat changes, so a revocation takes
effect on the next request without a restart. Writes are atomic (temp file, fsync, rename) under an
advisory lock, so the API never reads half a file and two concurrent ``rally tokens`` do not lose an
entry. The file is owner-only: it holds no secret, but it does say who may do what.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from rallypoint.jobs.validate import TEAM_PATTERN

_log = logging.getLogger("rallypoint.security.tokens")

TOKEN_PREFIX = "rly_"  # recognisable in a leaked log or a secret scanner's rules, as GitHub's ghp_
USER_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
Role = Literal["team", "admin"]


class TokenError(ValueError):
    """A token file or a token request is not acceptable."""


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str  # public handle: what `rally tokens list` shows and `revoke` takes
    hash: str  # "sha256:<hex>" of the token
    role: Role
    team: str | None  # None for an admin token
    user: str
    created_at: float
    revoked_at: float | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class TokenFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    version: int = 1
    tokens: list[TokenRecord] = []


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request, as its token says."""

    user: str
    team: str | None
    admin: bool
    token_id: str

    def may_act_for(self, team: str) -> bool:
        return self.admin or self.team == team


#: What an API without a token file sees every caller as (in-process tests and embedding only; the
#: served API always has a token file).
ANONYMOUS_ADMIN = Principal(user="anonymous", team=None, admin=True, token_id="-")


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def check_user(user: str) -> str:
    if not USER_PATTERN.fullmatch(user):  # fullmatch: $ alone lets a trailing newline through
        raise TokenError(f"user {user!r}: 1-64 characters, letters, digits, '.', '_', '@' or '-'")
    return user


def check_team(team: str) -> str:
    if not TEAM_PATTERN.fullmatch(team):
        raise TokenError(f"team {team!r}: 1-63 characters, lowercase letters, digits, '_' or '-'")
    return team


_decoder = msgspec.json.Decoder(TokenFile)


def read_tokens(path: Path) -> TokenFile:
    """The file's content; an absent file is an empty one (nobody may call yet)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return TokenFile()
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise TokenError(f"{path}: {exc}") from None


def write_tokens(path: Path, content: TokenFile) -> None:
    """Atomically replace ``path`` (mode 600): a reader sees the old file or the new one, never half."""
    write_private(path, msgspec.json.format(msgspec.json.encode(content)) + b"\n")


def write_private(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``, owner-only (mode 600) from its first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def create_token(
    path: Path, *, user: str, team: str | None = None, admin: bool = False, now: float | None = None
) -> tuple[TokenRecord, str]:
    """Add a token to the file; returns its record and the token itself (the only time it exists)."""
    if admin == (team is not None):
        raise TokenError("a token is either for one team (--team) or an admin token (--admin)")
    record_team = None if team is None else check_team(team)
    token = new_token()
    record = TokenRecord(
        id=f"t-{secrets.token_hex(4)}",
        hash=hash_token(token),
        role="admin" if admin else "team",
        team=record_team,
        user=check_user(user),
        created_at=time.time() if now is None else now,
    )
    with _locked(path):
        content = read_tokens(path)
        content.tokens.append(record)
        write_tokens(path, content)
    return record, token


def revoke_token(path: Path, token_id: str, *, now: float | None = None) -> TokenRecord:
    """Mark a token revoked (kept in the file, so `list` still says who had it and when it ended)."""
    with _locked(path):
        content = read_tokens(path)
        for index, record in enumerate(content.tokens):
            if record.id == token_id:
                if record.revoked:
                    return record
                revoked = msgspec.structs.replace(record, revoked_at=time.time() if now is None else now)
                content.tokens[index] = revoked
                write_tokens(path, content)
                return revoked
    raise TokenError(f"no token {token_id!r} in {path}")


class TokenStore:
    """The API's view of the token file, re-read when the file's stat changes.

    One ``stat`` per request is the price of revocation without a restart; it costs microseconds,
    far below a request's own cost. A file that cannot be parsed authenticates nobody (fail closed)
    and says why in the log once per change.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | bool | None = False  # False: never read
        self._by_hash: dict[str, TokenRecord] = {}
        self._reload()

    def _current_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _reload(self) -> None:
        stamp = self._current_stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            content = read_tokens(self.path)
        except (TokenError, OSError) as exc:
            _log.error("token file unreadable, every request is refused until it is fixed: %s", exc)
            self._by_hash = {}
            return
        self._by_hash = {r.hash: r for r in content.tokens if not r.revoked}
        if stamp is None:
            _log.warning("token file %s does not exist yet: every request is refused", self.path)

    def authenticate(self, token: str) -> Principal | None:
        self._reload()
        record = self._by_hash.get(hash_token(token))
        if record is None:
            return None
        return Principal(user=record.user, team=record.team, admin=record.role == "admin", token_id=record.id)
