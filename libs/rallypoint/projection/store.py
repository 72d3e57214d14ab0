"""The PostgreSQL side of the projector: migrations, the fenced batch write, reset, and reads.

Exactly-once effect rests on one transaction per batch that (1) moves this projection's position row
to the batch's last sequence provided it still holds the sequence the batch was folded from (one
statement: lock, check and move), (2) writes the archive rows and the view rows (one statement for
all of them). Either all of it commits or none of it does, so the views always equal the fold of the
log up to the stored position. The check in (1) also fences a second projector (or a concurrent
``rally projector rebuild``): whoever finds the position moved raises ``PositionMoved`` and
re-synchronises instead of writing over the other.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import asyncpg
import msgspec

from .rows import Batch
from .schema import (
    ARCHIVE_TABLE,
    ATTEMPT_COLUMNS,
    EVENT_COLUMNS,
    JOB_COLUMNS,
    MIGRATIONS,
    NODE_COLUMNS,
    QUARANTINE_COLUMNS,
    QUARANTINE_TABLE,
    SCHEMA,
    VIEW_TABLES,
)

DEFAULT_NAME = "read_models"
APPLICATION_NAME = "rally-projector"

# Errors after which dropping the connection and retrying the same batch is the right answer: the
# server went away or restarted, the network broke, or PostgreSQL rolled our transaction back for a
# reason that a retry clears (serialization failure, deadlock, statement timeout).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.TransactionRollbackError,
)

# Errors that come from what one event holds, not from the server or the network: PostgreSQL refused a
# value (a NUL in text or jsonb, a number out of a column's range, an impossible timestamp: class 22), a
# constraint (class 23: a NaN encodes as JSON null, which a NOT NULL column refuses), or a size limit
# (class 54: a key too long for its index). Retrying the same rows can only fail again, so the projector
# quarantines the event (``projector.Projector``) instead of retrying it forever.
DATA_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DataError,
    asyncpg.exceptions.IntegrityConstraintViolationError,
    asyncpg.exceptions.ProgramLimitExceededError,
)

# A fixed key so that concurrent projectors serialise their CREATE ... IF NOT EXISTS (PostgreSQL can
# otherwise fail one of two concurrent CREATE TABLEs with a unique violation on its catalogue).
_MIGRATION_LOCK = 0x52414C4C59  # "RALLY"


class PositionMoved(Exception):
    """The stored position is not the one this projector folded from: someone else wrote or reset it."""

    def __init__(self, expected: int, found: int | None) -> None:
        super().__init__(f"projection position moved: expected {expected}, found {found}")
        self.expected = expected
        self.found = found


def _encode_json(value: Any) -> str:
    # The archive passes JSON it already encoded with msgspec; everything else is plain data.
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=_encode_json, decoder=json.loads, schema="pg_catalog")


async def connect(
    dsn: str, *, timeout: float = 10.0, application_name: str = APPLICATION_NAME
) -> asyncpg.Connection:
    """One connection with the JSON codec the projection expects (reads return Python objects)."""
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn, timeout=timeout, server_settings={"application_name": application_name}
    )
    try:
        await _init_connection(conn)
    except BaseException:
        await conn.close()
        raise
    return conn


def _insert_from_json(
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    param: int,
    *,
    update: bool,
    as_jsonb: bool = False,
) -> str:
    """An insert of every row of a JSON array of objects (``$param``), typed by the table itself; a row
    whose key is there already is updated (``update``) or kept.

    ``json_populate_recordset`` reads each object as a row of the table (a JSON array becomes a text[],
    a string a timestamptz, an object or array a jsonb), so a whole batch is one parameter encoded
    once by msgspec, instead of a bind and an execute per row with a JSON encode per jsonb value.
    ``as_jsonb``: parse the array as jsonb once, for rows that are mostly JSON values themselves (json
    would be checked as text, then each value parsed again into its jsonb column)."""
    names = ", ".join(columns)
    kind = "jsonb" if as_jsonb else "json"
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in key)
    conflict = f"DO UPDATE SET {updates}" if update else "DO NOTHING"
    return (
        f"INSERT INTO {SCHEMA}.{table} ({names}) "
        f"SELECT {names} FROM {kind}_populate_recordset(NULL::{SCHEMA}.{table}, ${param}::{kind}) "
        f"ON CONFLICT ({', '.join(key)}) {conflict}"
    )


# Every row of a batch in one statement, each table's rows one JSON array (a round trip per table, or per
# row, cost more than the rows themselves; so did asyncpg's per-element checks of column arrays). The
# archive keeps rows an earlier run archived (rebuild --keep-archive): ON CONFLICT DO NOTHING. Each part
# reads only its own parameter, so their order does not matter; an empty array writes nothing.
_ARCHIVE_ROWS = _insert_from_json("events", EVENT_COLUMNS, ("seq",), 1, update=False, as_jsonb=True)
_WRITE_ROWS = (
    f"WITH archived AS ({_ARCHIVE_ROWS}), "
    f"jobs AS ({_insert_from_json('jobs', JOB_COLUMNS, ('job_id',), 2, update=True)}), "
    f"nodes AS ({_insert_from_json('nodes', NODE_COLUMNS, ('node_id',), 3, update=True)}) "
    + _insert_from_json("attempts", ATTEMPT_COLUMNS, ("job_id", "attempt"), 4, update=True)
)
# Lock the position row, check it and move it, in one statement: a second writer (or a reset) holding the
# row makes this wait, then find the position moved. It runs before any table is written, as the lock
# did before, so the tables are always locked after the position row (no deadlock with a reset).
_MOVE_POSITION = f"UPDATE {SCHEMA}.projection_position SET seq = $3 WHERE name = $1 AND seq = $2"

_INSERT_QUARANTINED = (
    f"INSERT INTO {QUARANTINE_TABLE} (name, {', '.join(QUARANTINE_COLUMNS)}) "
    f"VALUES ($1, {', '.join(f'${i + 2}' for i in range(len(QUARANTINE_COLUMNS)))}) "
    "ON CONFLICT (name, seq) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in QUARANTINE_COLUMNS if c != "seq")
)

_rows_json = msgspec.json.Encoder()


def _json_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as the JSON array of objects ``json_populate_recordset`` reads (column name -> value)."""
    return _rows_json.encode([dict(zip(columns, row, strict=True)) for row in rows]).decode()


class Store:
    """One connection, used by one projector; not safe for concurrent use (asyncpg connections are not)."""

    def __init__(self, conn: asyncpg.Connection, *, name: str = DEFAULT_NAME) -> None:
        self.conn = conn
        self.name = name

    @classmethod
    async def open(cls, dsn: str, *, name: str = DEFAULT_NAME, timeout: float = 10.0) -> Store:
        """Connect and apply the migrations; the caller owns the result and must ``close()`` it."""
        store = cls(await connect(dsn, timeout=timeout), name=name)
        try:
            await store.migrate()
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        if not self.conn.is_closed():
            # terminate(), not close(): close() waits for the server, which may be the thing that broke.
            self.conn.terminate()

    async def migrate(self) -> None:
        async with self.conn.transaction():
            await self.conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            for statement in MIGRATIONS:
                await self.conn.execute(statement)
            await self.conn.execute(
                f"INSERT INTO {SCHEMA}.projection_position (name, seq) VALUES ($1, 0) "
                "ON CONFLICT (name) DO NOTHING",
                self.name,
            )

    # -- position and snapshot --------------------------------------------------------------

    async def position(self) -> int:
        seq = await self.conn.fetchval(
            f"SELECT seq FROM {SCHEMA}.projection_position WHERE name = $1", self.name
        )
        return int(seq or 0)

    async def snapshot(self) -> tuple[int, bytes] | None:
        row = await self.conn.fetchrow(
            f"SELECT seq, state FROM {SCHEMA}.projection_snapshot WHERE name = $1", self.name
        )
        return (int(row["seq"]), bytes(row["state"])) if row is not None else None

    # -- the batch transaction --------------------------------------------------------------

    async def write(self, batch: Batch, *, expected: int, snapshot: bytes | None = None) -> None:
        """Apply one batch atomically, provided the stored position is still ``expected``."""
        conn = self.conn
        async with conn.transaction():
            # Fenced first: a second writer waits here until we commit, then finds the position moved.
            moved = await conn.execute(_MOVE_POSITION, self.name, expected, batch.last_seq)
            if moved != "UPDATE 1":
                found = await conn.fetchval(
                    f"SELECT seq FROM {SCHEMA}.projection_position WHERE name = $1", self.name
                )
                raise PositionMoved(expected, found)
            await conn.execute(_WRITE_ROWS, *_row_params(batch))
            if batch.quarantined:  # rare: one refused event per batch, so one statement each is fine
                await conn.executemany(_INSERT_QUARANTINED, [(self.name, *row) for row in batch.quarantined])
            if snapshot is not None:
                await conn.execute(
                    f"INSERT INTO {SCHEMA}.projection_snapshot (name, seq, state) VALUES ($1, $2, $3) "
                    "ON CONFLICT (name) DO UPDATE SET seq = EXCLUDED.seq, state = EXCLUDED.state",
                    self.name,
                    batch.last_seq,
                    snapshot,
                )

    async def quarantined(self, limit: int) -> tuple[int, list[QuarantinedRow]]:
        return await fetch_quarantined(self.conn, self.name, limit)

    async def reset(self, *, keep_archive: bool = False) -> None:
        """Empty the views, the snapshot, the quarantine and the position (and the archive) in one
        transaction: a rebuild quarantines again whatever PostgreSQL still refuses."""
        tables = list(VIEW_TABLES) + ([] if keep_archive else [ARCHIVE_TABLE])
        async with self.conn.transaction():
            # Lock the position row first, like a batch does, so a running projector's in-flight
            # batch either commits before the reset or sees the position moved afterwards.
            await self.conn.execute(
                f"SELECT seq FROM {SCHEMA}.projection_position WHERE name = $1 FOR UPDATE", self.name
            )
            await self.conn.execute(f"TRUNCATE {', '.join(tables)}")
            await self.conn.execute(f"DELETE FROM {SCHEMA}.projection_snapshot WHERE name = $1", self.name)
            await self.conn.execute(f"DELETE FROM {QUARANTINE_TABLE} WHERE name = $1", self.name)
            await self.conn.execute(
                f"UPDATE {SCHEMA}.projection_position SET seq = 0 WHERE name = $1", self.name
            )


class QuarantinedRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``rally.projection_quarantine`` as read back (``data``, the event itself, left out)."""

    seq: int
    subject: str
    type: str
    error: str
    quarantined_at: str  # ISO 8601


def _row_params(batch: Batch) -> list[str]:
    """The parameters of ``_WRITE_ROWS``: each table's rows as JSON."""
    return [
        _json_rows(EVENT_COLUMNS, batch.events),
        _json_rows(JOB_COLUMNS, batch.jobs),
        _json_rows(NODE_COLUMNS, batch.nodes),
        _json_rows(ATTEMPT_COLUMNS, batch.attempts),
    ]


# -- reads, for `rally projector status` and the tests --------------------------------------------


async def fetch_jobs(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(f"SELECT {', '.join(JOB_COLUMNS)} FROM {SCHEMA}.jobs ORDER BY job_id")
    return [tuple(r) for r in rows]


async def fetch_nodes(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(f"SELECT {', '.join(NODE_COLUMNS)} FROM {SCHEMA}.nodes ORDER BY node_id")
    return [tuple(r) for r in rows]


async def fetch_attempts(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        f'SELECT {", ".join(ATTEMPT_COLUMNS)} FROM {SCHEMA}.attempts ORDER BY job_id COLLATE "C", attempt'
    )
    return [tuple(r) for r in rows]


async def fetch_archive_seqs(conn: asyncpg.Connection) -> list[int]:
    return [int(r[0]) for r in await conn.fetch(f"SELECT seq FROM {ARCHIVE_TABLE} ORDER BY seq")]


async def fetch_quarantined(
    conn: asyncpg.Connection, name: str, limit: int
) -> tuple[int, list[QuarantinedRow]]:
    """How many events projection ``name`` quarantined, and the first ``limit`` of them in log order."""
    total = await conn.fetchval(f"SELECT count(*) FROM {QUARANTINE_TABLE} WHERE name = $1", name)
    rows = await conn.fetch(
        f"SELECT seq, subject, type, error, quarantined_at FROM {QUARANTINE_TABLE} "
        "WHERE name = $1 ORDER BY seq LIMIT $2",
        name,
        limit,
    )
    found = [
        QuarantinedRow(
            seq=int(r["seq"]),
            subject=r["subject"],
            type=r["type"],
            error=r["error"],
            quarantined_at=r["quarantined_at"].isoformat(),
        )
        for r in rows
    ]
    return int(total), found
