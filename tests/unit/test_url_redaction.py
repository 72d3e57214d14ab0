"""What may be printed or logged of a URL: all but its password (issue 30: local secrets stay local)."""

from __future__ import annotations

import pytest

from rallypoint.eventlog.connection import without_password

CASES = [
    ("nats://admin:p0123abc@127.0.0.1:4222", "nats://admin:***@127.0.0.1:4222"),
    # a cluster's seed list: every member's password
    (
        "nats://api:s1@nats-1:4222,nats://api:s1@nats-2:4222",
        "nats://api:***@nats-1:4222,nats://api:***@nats-2:4222",
    ),
    ("postgresql://rally:abc@127.0.0.1:5432/rallypoint", "postgresql://rally:***@127.0.0.1:5432/rallypoint"),
    ("postgresql://u:p%40ss%2Fword@db/x?sslmode=require", "postgresql://u:***@db/x?sslmode=require"),
    ("postgresql://u:p@ss@db/x", "postgresql://u:***@db/x"),  # an unescaped @ in it: still all of it
    # nothing to hide
    ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
    ("nats://user@127.0.0.1:4222", "nats://user@127.0.0.1:4222"),
    ("postgresql://rally@db:5432/rallypoint", "postgresql://rally@db:5432/rallypoint"),
    ("http://127.0.0.1:8080/v1/jobs", "http://127.0.0.1:8080/v1/jobs"),
]


@pytest.mark.parametrize(("url", "shown"), CASES)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert without_password(url) == shown
