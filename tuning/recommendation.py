"""What `nodecheck tune` says about one variable: the value, the reason, the fact behind it,
and what it means against the calling environment (keep, set, change or unset)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from enum import Enum

from nodecheck.checks.node.variables import audited
from nodecheck.checks.record import record


def plain(value: str) -> bool:
    """A value safe to carry over as it is: printable, without surrounding whitespace."""
    return value.isprintable() and value == value.strip()


class Action(str, Enum):
    KEEP = "keep"  # already set to the recommended value
    SET = "set"  # not set now
    CHANGE = "change"  # set now, to another value
    UNSET = "unset"  # a red flag: remove it


@record
class Recommendation:
    name: str
    value: str | None  # None: remove the variable
    reason: str
    source: str  # the rule or file it rests on
    # Its value in the calling environment, kept only for audited variables (NCCL_*,
    # TORCH_*, PYTORCH_*, CUDA_*) or where it equals `value`: any other variable's value
    # (OMP_NUM_THREADS=<anything a caller put there>) never leaves the process.
    current: str | None = None
    found_in: tuple[str, ...] = ()  # for a removal: where it was found
    flagged_value: str | None = None  # for a removal: the value the checks flag
    severity: str | None = None  # for a removal: "fail" or "warn", as the checks judge it
    # A change of a value the user set that works, to one that is better: `tune` shows it,
    # `nodecheck exec` leaves the user's value alone.
    advisory: bool = False
    # Another variable this one must agree with (PYTORCH_ALLOC_CONF with
    # PYTORCH_CUDA_ALLOC_CONF): where that one keeps the user's value, so does this.
    same_as: str | None = None
    # Set by the caller to a value that is not kept (not audited, and not `value`).
    current_hidden: bool = False
    # For a removal: the value the checks would put in its place (NCCL_DEBUG=INFO becomes
    # WARN, not nothing); None: remove it.
    replacement: str | None = None

    @property
    def action(self) -> Action:
        if self.value is None:
            return Action.UNSET
        if self.current_hidden:
            return Action.CHANGE
        if self.current is None:
            return Action.SET
        return Action.KEEP if self.current == self.value else Action.CHANGE

    @property
    def is_set(self) -> bool:
        """Whether the calling environment sets it (whether or not its value is kept)."""
        return self.current is not None or self.current_hidden

    def against(self, environ: Mapping[str, str]) -> Recommendation:
        """The same advice, marked against this environment; the current value is kept
        only where it may be shown (an audited variable, or the recommended value)."""
        current = environ.get(self.name)
        if current is None or audited(self.name) or current == self.value:
            return replace(self, current=current, current_hidden=False)
        return replace(self, current=None, current_hidden=True)


@record
class LeftUnset:
    """A variable left unset on purpose: what NCCL or torch already does well by itself."""

    names: tuple[str, ...]
    reason: str
    source: str
    found: tuple[str, ...] = ()  # where one is set now, unflagged: "NCCL_IB_TIMEOUT=22 in ..."
    # What nodecheck says of the values set now ("kept: ...", "warning: ..."); "" where
    # nothing is set or the variable's value needs no word.
    verdict: str = ""


@record
class DataLoaderHint:
    num_workers: int
    pin_memory: bool
    reason: str
    source: str
