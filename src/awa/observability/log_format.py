"""Log output of the ``awa`` processes: human-readable lines, or one JSON object per line for
log shippers (``awa worker --log-format json``).

The JSON object has ``timestamp`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``;
records about a job add ``job_id``, ``kind``, ``queue`` and ``attempt``; a record with an
exception adds ``exception`` (the formatted traceback).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Literal

import orjson

LogFormat = Literal["text", "json"]

JOB_FIELDS = ("job_id", "kind", "queue", "attempt")
"""Attributes a record about a job carries (see ``awa.worker.outcome_log.job_fields``)."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "timestamp": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in JOB_FIELDS:
            value = record.__dict__.get(field)
            if value is not None:
                entry[field] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return orjson.dumps(entry, default=str).decode()


def configure(level: str, log_format: LogFormat) -> None:
    """Send log records of ``level`` and above to stderr in ``log_format``."""
    handler = logging.StreamHandler()
    formatter: logging.Formatter
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
