"""Logging to stderr, one key=value line per event, as journald and grep like it."""

from __future__ import annotations

import logging
import sys

LEVELS = ("debug", "info", "warning", "error")


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"level={record.levelname.lower()} logger={record.name} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("nodecheck")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
