"""Ctrl-C and SIGTERM during a command: it stops where it is and exits 128 + the signal's
number (130 for SIGINT, 143 for SIGTERM), as a shell reports a command a signal ended
(POSIX Shell Command Language, 2.8.2 "Exit Status for Commands"), with one line on stderr
and no traceback.

KeyboardInterrupt will not do: click turns it into "Aborted!" and exit 1 (click's
core.py, Command.main, `except (EOFError, KeyboardInterrupt)`), which for `nodecheck
check` means "a check failed". The handler raises Interrupted instead, which click lets
through to the entry point. It is a BaseException, like KeyboardInterrupt, so no `except
Exception` on the way takes it for a failure, and every `finally` (an NVML session
closed, write_atomically's temporary file removed) runs on the way out. The agent
installs its own handlers once it starts (a clean stop, exit 0).
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A stop signal arrived: the command gives up where it is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # A second Ctrl-C while the first one unwinds would raise again out of the handler
    # that reports the first: the command is leaving anyway.
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, signal.SIG_IGN)
    raise Interrupted(signum)


def raise_on_stop_signals() -> None:
    """From now on SIGINT and SIGTERM raise Interrupted in the main thread."""
    for stop_signal in STOP_SIGNALS:
        signal.signal(stop_signal, _interrupt)
