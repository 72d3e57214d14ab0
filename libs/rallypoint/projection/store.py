"""The PostgreSQL side of the projector: migrations, the fenced batch write, reset, and reads.

Exactly-once effect rests on one transaction per batch that (1) locks this projection's position row
and checks it still holds the sequence the batch was folded from, (2) writes the archive rows and the
view rows, (3) moves the position to the batch's last sequence. Either all of it commits or none of it
does, so the views always equal the fold of the log up to the stored position. The check in (1) also
fences a second projector (or a concurrent ``rally projector rebuild``): whoever finds the position
moved raises ``PositionMoved`` and re-synchronises instead of writing over the other.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from .rows import Batch
from .schema import (
    ARCHIVE_TABLE,
    ATTEMPT_COLUMNS,
    EVENT_COLUMNS,
    JOB_COLUMNS,
    MIGRATIONS,
    NODE_COLUMNS,
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


def _upsert(table: str, columns: Sequence[str]) -> str:
    names = ", ".join(columns)
    params = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns[1:])
    return (
        f"INSERT INTO {SCHEMA}.{table} ({names}) VALUES ({params}) "
        f"ON CONFLICT ({columns[0]}) DO UPDATE SET {updates}"
    )


_UPSERT_JOBS = _upsert("jobs", JOB_COLUMNS)
_UPSERT_NODES = _upsert("nodes", NODE_COLUMNS)
_UPSERT_ATTEMPTS = (
    f"INSERT INTO {SCHEMA}.attempts ({', '.join(ATTEMPT_COLUMNS)}) "
    f"VALUES ({', '.join(f'${i}' for i in range(1, len(ATTEMPT_COLUMNS) + 1))}) "
    "ON CONFLICT (job_id, attempt) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in ATTEMPT_COLUMNS[2:])
)
# One statement for the whole archive part of a batch: unnest of column arrays is far cheaper than a
# round trip per row. ON CONFLICT DO NOTHING keeps rows an earlier run archived (rebuild --keep-archive).
_INSERT_EVENTS = (
    f"INSERT INTO {ARCHIVE_TABLE} ({', '.join(EVENT_COLUMNS)}) "
    "SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::timestamptz[], $5::jsonb[], $6::jsonb[]) "
    "ON CONFLICT (seq) DO NOTHING"
)


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
            # FOR UPDATE: a second writer waits here until we commit, then sees the moved position.
            found = await conn.fetchval(
                f"SELECT seq FROM {SCHEMA}.projection_position WHERE name = $1 FOR UPDATE", self.name
            )
            if found != expected:
                raise PositionMoved(expected, found)
            columns = list(zip(*batch.events, strict=True))
            await conn.execute(_INSERT_EVENTS, *columns)
            if batch.jobs:
                await conn.executemany(_UPSERT_JOBS, batch.jobs)
            if batch.nodes:
                await conn.executemany(_UPSERT_NODES, batch.nodes)
            if batch.attempts:
                await conn.executemany(_UPSERT_ATTEMPTS, batch.attempts)
            await conn.execute(
                f"UPDATE {SCHEMA}.projection_position SET seq = $2 WHERE name = $1",
                self.name,
                batch.last_seq,
            )
            if snapshot is not None:
                await conn.execute(
                    f"INSERT INTO {SCHEMA}.projection_snapshot (name, seq, state) VALUES ($1, $2, $3) "
                    "ON CONFLICT (name) DO UPDATE SET seq = EXCLUDED.seq, state = EXCLUDED.state",
                    self.name,
                    batch.last_seq,
                    snapshot,
                )

    async def reset(self, *, keep_archive: bool = False) -> None:
        """Empty the views, the snapshot and the position (and the archive) in one transaction."""
        tables = list(VIEW_TABLES) + ([] if keep_archive else [ARCHIVE_TABLE])
        async with self.conn.transaction():
            # Lock the position row first, like a batch does, so a running projector's in-flight
            # batch either commits before the reset or sees the position moved afterwards.
            await self.conn.execute(
                f"SELECT seq FROM {SCHEMA}.projection_position WHERE name = $1 FOR UPDATE", self.name
            )
            await self.conn.execute(f"TRUNCATE {', '.join(tables)}")
            await self.conn.execute(f"DELETE FROM {SCHEMA}.projection_snapshot WHERE name = $1", self.name)
            await self.conn.execute(
                f"UPDATE {SCHEMA}.projection_position SET seq = 0 WHERE name = $1", self.name
            )


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
