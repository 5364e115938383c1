"""Logging set-up: plain text for people, or one JSON object a line for log pipelines."""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any, Final

import orjson

# LogRecord's own attributes: everything else on a record came from `extra=` and is a field.
_STANDARD: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


class JSONFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message", ...extra fields, "exception"}` on one line.

    Fields given with `extra=` (workload, source, reason...) are kept as they are; values that
    are not JSON become their str(). Nothing here adds object content: callers name things."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def setup_logging(level: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


__all__ = ["JSONFormatter", "setup_logging"]
