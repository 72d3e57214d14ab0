"""Structured logging: one line per record, tagged with the service and instance that wrote it."""

from __future__ import annotations

import datetime as _dt
import logging
import sys
from typing import TextIO

import msgspec

_encoder = msgspec.json.Encoder()
# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged as a field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _utc(created: float) -> str:
    return (
        _dt.datetime.fromtimestamp(created, tz=_dt.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


class JsonLineFormatter(logging.Formatter):
    def __init__(self, service: str, instance: str) -> None:
        super().__init__()
        self.service = service
        self.instance = instance

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": _utc(record.created),
            "level": record.levelname,
            "service": self.service,
            "instance": self.instance,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool | None) else repr(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)  # newlines escaped by JSON
        return _encoder.encode(entry).decode()


class TextLineFormatter(logging.Formatter):
    def __init__(self, service: str, instance: str) -> None:
        super().__init__()
        self.prefix = f"{service}/{instance}"

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{_utc(record.created)} {record.levelname:<7} {self.prefix} {record.name}: {record.getMessage()}"
        )
        if record.exc_info:
            # Keep one record on one line, so grep and log shippers never split it.
            line += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        return line


def setup_logging(
    service: str, instance: str, level: str = "INFO", fmt: str = "json", stream: TextIO | None = None
) -> None:
    """Replace the root handlers with one line-per-record handler on stderr (idempotent)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter: logging.Formatter = (
        JsonLineFormatter(service, instance) if fmt == "json" else TextLineFormatter(service, instance)
    )
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # nats-py logs every reconnect attempt with a traceback; our callbacks already log one line each.
    logging.getLogger("nats").setLevel(max(logging.WARNING, root.level))
