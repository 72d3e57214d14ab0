"""The PostgreSQL schema of the read models and the audit archive, as idempotent migrations.

Every statement is safe to run again (``IF NOT EXISTS``), so a projector applies the whole list at each
start and two projectors starting together cannot break each other. A change to an existing table is a
new statement appended to ``MIGRATIONS`` (``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``), never an edit of
an old one, so a database created by any earlier version converges to the same shape.

Column lists live here too: the row builders (``rows.py``) and the writer (``store.py``) both read them,
so a column cannot be added to one and forgotten in the other.
"""

from __future__ import annotations

SCHEMA = "rally"

# Order matters: the writer builds its INSERTs from these and the row builders return tuples in it.
JOB_COLUMNS: tuple[str, ...] = (
    "job_id",
    "name",
    "team",
    "priority",
    "state",
    "gpus",
    "gpus_per_task",
    "attempt",
    "queue",
    "cancel_requested",
    "submitted_at",
    "bound_at",
    "started_at",
    "ended_at",
    "exit_code",
    "reason",
    "pending_code",
    "pending_message",
    "nodes",
    "placements",
    "preemptions",
    "last_preempted_at",
    "preempt_for",
    "last_seq",
)

NODE_COLUMNS: tuple[str, ...] = (
    "node_id",
    "address",
    "rack",
    "spine",
    "gpu_type",
    "gpus",
    "gpus_free",
    "status",
    "status_reason",
    "health",
    "last_seq",
)

EVENT_COLUMNS: tuple[str, ...] = ("seq", "subject", "type", "time", "data", "envelope")

# One row per attempt of a job (``accounting.AttemptLedger``): the jobs row shows only the current one.
# ``started_s``/``ended_s`` repeat the times as the log's float seconds, so usage sums in SQL reproduce
# the log's to the bit (timestamptz would round them to microseconds first).
ATTEMPT_COLUMNS: tuple[str, ...] = (
    "job_id",
    "attempt",
    "team",
    "user_name",
    "priority",
    "gpus",
    "nodes",
    "placements",
    "bound_at",
    "started_at",
    "ended_at",
    "started_s",
    "ended_s",
    "outcome",
    "reason",
    "exit_code",
    "preempted_for",
    "lost_gpu_s",
    "resume_step",
    "last_seq",
    "failed_rank",
    "gpu_milli",
)

# Events PostgreSQL refused to store (NUL in text, a number out of range...): quarantined, not projected.
# ``data`` is the event's JSON as bytes, kept faithfully where no text or jsonb column could hold it.
QUARANTINE_COLUMNS: tuple[str, ...] = ("seq", "subject", "type", "error", "data")

MIGRATIONS: tuple[str, ...] = (
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    # The audit archive: one row per log entry, keyed by stream sequence so a redelivered event
    # cannot appear twice (the writer inserts ON CONFLICT DO NOTHING as a second line of defence).
    f"""
    CREATE TABLE IF NOT EXISTS {SCHEMA}.events (
        seq       bigint      PRIMARY KEY,
        subject   text        NOT NULL,
        type      text        NOT NULL,
        time      timestamptz,
        data      jsonb       NOT NULL,
        envelope  jsonb       NOT NULL DEFAULT '{{}}'::jsonb
    )
    """,
    f"CREATE INDEX IF NOT EXISTS events_subject_seq ON {SCHEMA}.events (subject, seq)",
    f"CREATE INDEX IF NOT EXISTS events_type_time ON {SCHEMA}.events (type, time)",
    f"""
    CREATE TABLE IF NOT EXISTS {SCHEMA}.jobs (
        job_id           text        PRIMARY KEY,
        name             text        NOT NULL,
        team             text        NOT NULL,
        priority         text        NOT NULL,
        state            text        NOT NULL,
        gpus             integer     NOT NULL,
        gpus_per_task    integer     NOT NULL,
        attempt          integer     NOT NULL,
        queue            text,
        cancel_requested boolean     NOT NULL DEFAULT false,
        submitted_at     timestamptz NOT NULL,
        bound_at         timestamptz,
        started_at       timestamptz,
        ended_at         timestamptz,
        exit_code        integer,
        reason           text        NOT NULL DEFAULT '',
        pending_code     text        NOT NULL DEFAULT '',
        pending_message  text        NOT NULL DEFAULT '',
        nodes            text[]      NOT NULL DEFAULT '{{}}',
        placements       jsonb       NOT NULL DEFAULT '[]'::jsonb,
        last_seq         bigint      NOT NULL
    )
    """,
    # The questions people ask of the jobs table: "what is team X running / waiting for".
    f"CREATE INDEX IF NOT EXISTS jobs_team_state ON {SCHEMA}.jobs (team, state)",
    f"CREATE INDEX IF NOT EXISTS jobs_state ON {SCHEMA}.jobs (state)",
    f"""
    CREATE TABLE IF NOT EXISTS {SCHEMA}.nodes (
        node_id        text    PRIMARY KEY,
        address        text    NOT NULL DEFAULT '',
        rack           text    NOT NULL,
        spine          text    NOT NULL,
        gpu_type       text    NOT NULL,
        gpus           integer NOT NULL,
        gpus_free      integer NOT NULL,
        status         text    NOT NULL,
        status_reason  text    NOT NULL DEFAULT '',
        last_seq       bigint  NOT NULL
    )
    """,
    f"CREATE INDEX IF NOT EXISTS nodes_rack ON {SCHEMA}.nodes (rack)",
    # The applied stream sequence, written in the same transaction as the views (exactly-once effect).
    f"""
    CREATE TABLE IF NOT EXISTS {SCHEMA}.projection_position (
        name  text   PRIMARY KEY,
        seq   bigint NOT NULL
    )
    """,
    # Added with preemption. A derived column added to a projected database reads its default until
    # `rally projector rebuild` re-derives every row.
    f"ALTER TABLE {SCHEMA}.jobs ADD COLUMN IF NOT EXISTS preemptions integer NOT NULL DEFAULT 0",
    f"ALTER TABLE {SCHEMA}.jobs ADD COLUMN IF NOT EXISTS last_preempted_at timestamptz",
    f"ALTER TABLE {SCHEMA}.jobs ADD COLUMN IF NOT EXISTS preempt_for text",
    # The in-memory fold at some position, so a restart need not replay the whole log. Written in the
    # same transaction as the position it belongs to, so it is never ahead of the views.
    f"""
    CREATE TABLE IF NOT EXISTS {SCHEMA}.projection_snapshot (
        name   text   PRIMARY KEY,
        seq    bigint NOT NULL,
        state  bytea  NOT NULL
    )
    """,
    # Added with accounting (rally usage / history / show). Filled for the past by `rally projector rebuild`.
    f"""
    CREATE TABLE IF NOT EXISTS {SCHEMA}.attempts (
        job_id         text             NOT NULL,
        attempt        integer          NOT NULL,
        team           text             NOT NULL,
        user_name      text             NOT NULL,
        priority       text             NOT NULL,
        gpus           integer          NOT NULL,
        nodes          text[]           NOT NULL DEFAULT '{{}}',
        placements     jsonb            NOT NULL DEFAULT '[]'::jsonb,
        bound_at       timestamptz      NOT NULL,
        started_at     timestamptz,
        ended_at       timestamptz,
        started_s      double precision,
        ended_s        double precision,
        outcome        text             NOT NULL,
        reason         text             NOT NULL DEFAULT '',
        exit_code      integer,
        preempted_for  text,
        lost_gpu_s     double precision NOT NULL DEFAULT 0,
        resume_step    integer,
        last_seq       bigint           NOT NULL,
        PRIMARY KEY (job_id, attempt)
    )
    """,
    f"CREATE INDEX IF NOT EXISTS attempts_team_started ON {SCHEMA}.attempts (team, started_s)",
    # Added with node health (NodeHealthChanged): healthy, suspect, degraded (cordoned) or failed.
    f"ALTER TABLE {SCHEMA}.nodes ADD COLUMN IF NOT EXISTS health text NOT NULL DEFAULT 'healthy'",
    # Added with the failing rank (``AttemptRecord.failed_rank``): the rank whose exit failed the attempt.
    f"ALTER TABLE {SCHEMA}.attempts ADD COLUMN IF NOT EXISTS failed_rank integer",
    # Added with billing by share (``AttemptRecord.gpu_milli``): a share's or a MIG slice's part of its GPU.
    # Rows written before it hold NULL (whole GPUs): `rally projector rebuild` fills a share's from the log.
    f"ALTER TABLE {SCHEMA}.attempts ADD COLUMN IF NOT EXISTS gpu_milli integer",
    # Added with issue 30: the events PostgreSQL refused, each written in the transaction that moved the
    # position past it, so the projector goes on and an operator can see what the views lack.
    f"""
    CREATE TABLE IF NOT EXISTS {SCHEMA}.projection_quarantine (
        name            text        NOT NULL,
        seq             bigint      NOT NULL,
        subject         text        NOT NULL,
        type            text        NOT NULL,
        error           text        NOT NULL,
        data            bytea       NOT NULL,
        quarantined_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (name, seq)
    )
    """,
)

# Tables a rebuild empties. The archive is listed separately because an operator may keep it.
VIEW_TABLES: tuple[str, ...] = (f"{SCHEMA}.jobs", f"{SCHEMA}.nodes", f"{SCHEMA}.attempts")
ARCHIVE_TABLE = f"{SCHEMA}.events"
QUARANTINE_TABLE = f"{SCHEMA}.projection_quarantine"
