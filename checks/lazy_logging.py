"""nodecheck's loggers, with `logging` imported when the first record is made.

Importing `logging` (and the traceback module it imports) is a fiftieth of a short
command such as `nodecheck check --json`, which on a healthy node logs nothing. Every
nodecheck module takes its logger from here (`log = get_logger(__name__)`, a test holds
them to it); a record made through one imports logging, first runs the handler set-up
the command asked for (`install_before_first_record`: agent/logs.py's key=value lines on
stderr) and is then handled by `logging.getLogger(name)`, the same logger a test's
caplog or an operator's configuration sees.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

# logging's own level numbers (Lib/logging/__init__.py), without importing it.
DEBUG = 10
INFO = 20
WARNING = 30
ERROR = 40


class _SetUp:
    """The handler set-up still to run, and whether a logger of ours has been used."""

    def __init__(self) -> None:
        # Reentrant: a set-up that logs (through one of these loggers) does not wait on itself.
        self.lock = threading.RLock()
        self.pending: Callable[[], None] | None = None
        self.used = False


_setup = _SetUp()


def _install_pending() -> None:
    """The handler set-up still pending, run (once), before any record is made."""
    with _setup.lock:
        _setup.used = True
        install = _setup.pending
        if install is not None:
            install()  # kept pending if it raises (a signal mid-way): the next record retries
            _setup.pending = None


def install_before_first_record(install: Callable[[], None]) -> None:
    """Run `install` (which sets up logging's handlers) before the first record of any
    nodecheck logger; at once where logging is already in use (a logger of ours made a
    record, or other code imported logging and may log through it directly). A later
    call replaces a set-up still pending."""
    with _setup.lock:
        if not _setup.used and "logging" not in sys.modules:
            _setup.pending = install
            return
        _setup.pending = None
    install()


def shutdown() -> None:
    """logging.shutdown() (flush and close every handler), where logging was loaded."""
    if "logging" in sys.modules:
        import logging

        logging.shutdown()


class Logger:
    """`logging.getLogger(name)`, fetched on the first record; the methods nodecheck
    uses, with logging's meaning. stacklevel=2: a record names its caller, not this."""

    __slots__ = ("_logger", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger: logging.Logger | None = None

    def _real(self) -> logging.Logger:
        logger = self._logger
        if logger is None:
            _install_pending()
            import logging

            logger = self._logger = logging.getLogger(self.name)
        return logger

    def log(
        self, level: int, message: str, *values: object, exc_info: BaseException | None = None
    ) -> None:
        self._real().log(level, message, *values, exc_info=exc_info, stacklevel=2)

    def debug(self, message: str, *values: object, exc_info: BaseException | None = None) -> None:
        self._real().debug(message, *values, exc_info=exc_info, stacklevel=2)

    def info(self, message: str, *values: object, exc_info: BaseException | None = None) -> None:
        self._real().info(message, *values, exc_info=exc_info, stacklevel=2)

    def warning(self, message: str, *values: object, exc_info: BaseException | None = None) -> None:
        self._real().warning(message, *values, exc_info=exc_info, stacklevel=2)

    def error(self, message: str, *values: object, exc_info: BaseException | None = None) -> None:
        self._real().error(message, *values, exc_info=exc_info, stacklevel=2)

    def enabled_for(self, level: int) -> bool:
        """logging.Logger.isEnabledFor: whether a record at `level` would be handled."""
        return self._real().isEnabledFor(level)


def get_logger(name: str) -> Logger:
    """The logger called `name` (a module's __name__), made lazily."""
    return Logger(name)
