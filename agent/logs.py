"""Logging to stderr, one key=value line per event, as journald and grep like it.

A record that carries an exception (log.debug(..., exc_info=err)) gets it on the same
line, as `exception=` (type and message) and `at=` (the innermost frame): never a
multi-line traceback, which journald would split into unrelated entries. A line holds
no control character: each is escaped ("\\n", "\\x1b").
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback

from nodecheck.checks.printable import printable

LEVELS = ("debug", "info", "warning", "error")


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"level={record.levelname.lower()} logger={record.name} {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            err = record.exc_info[1]
            line += f" exception={type(err).__name__} error={str(err)!r}"
            frames = traceback.extract_tb(err.__traceback__)
            if frames:
                last = frames[-1]
                line += f" at={last.filename}:{last.lineno}:{last.name}"
        # The whole line escaped (checks/printable.py): a value logged with %s (a path, a
        # check's subject, a client's address) may hold a newline, which would forge an
        # entry of its own in the journal, or an escape sequence for the terminal that
        # follows the log.
        return printable(line)


def log_thread_crash(args: threading.ExceptHookArgs) -> None:
    """threading.excepthook: a thread that dies of an exception is one error line, not
    the traceback Python prints to stderr by default."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "unknown"
    logging.getLogger("nodecheck").error(
        "event=thread_crashed thread=%s", name, exc_info=args.exc_value
    )


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("nodecheck")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    threading.excepthook = log_thread_crash
