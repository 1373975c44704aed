"""Logging to stderr, one key=value line per event, as journald and grep like it.

A record that carries an exception (log.debug(..., exc_info=err)) gets it on the same
line, as `exception=` (type and message) and `at=` (the innermost frame): never a
multi-line traceback, which journald would split into unrelated entries. A line holds
no control character: each is escaped ("\\n", "\\x1b").

The handler is set up before the first record (checks/lazy_logging.py): a command that
logs nothing, as `nodecheck check` on a healthy node, never imports logging.
"""

from __future__ import annotations

import sys
import threading
from functools import partial
from typing import TYPE_CHECKING

from nodecheck.checks.lazy_logging import get_logger, install_before_first_record
from nodecheck.checks.printable import printable

if TYPE_CHECKING:
    import logging

LEVELS = ("debug", "info", "warning", "error")


def format_record(record: logging.LogRecord) -> str:
    """A record as its one line: level, logger, message, and the exception if any."""
    line = f"level={record.levelname.lower()} logger={record.name} {record.getMessage()}"
    if record.exc_info and record.exc_info[1] is not None:
        import traceback  # logging imports it: free here

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
    get_logger("nodecheck").error("event=thread_crashed thread=%s", name, exc_info=args.exc_value)


def _install_handler(level: str) -> None:
    import logging

    class KeyValueFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return format_record(record)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("nodecheck")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def configure_logging(level: str) -> None:
    """nodecheck's records at `level` and above, as key=value lines on stderr (set up
    before the first record); a thread that dies, one such line."""
    threading.excepthook = log_thread_crash
    install_before_first_record(partial(_install_handler, level))
