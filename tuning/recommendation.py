"""What `nodecheck tune` says about one variable: the value, the reason, the fact behind it,
and what it means against the calling environment (keep, set, change or unset)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum


def plain(value: str) -> bool:
    """A value safe to carry over as it is: printable, without surrounding whitespace."""
    return value.isprintable() and value == value.strip()


class Action(str, Enum):
    KEEP = "keep"  # already set to the recommended value
    SET = "set"  # not set now
    CHANGE = "change"  # set now, to another value
    UNSET = "unset"  # a red flag: remove it


@dataclass(frozen=True)
class Recommendation:
    name: str
    value: str | None  # None: remove the variable
    reason: str
    source: str  # the rule or file it rests on
    current: str | None = None  # its value in the calling environment
    found_in: tuple[str, ...] = ()  # for a removal: where it was found
    flagged_value: str | None = None  # for a removal: the value the checks flag
    severity: str | None = None  # for a removal: "fail" or "warn", as the checks judge it
    # A change of a value the user set that works, to one that is better: `tune` shows it,
    # `nodecheck exec` leaves the user's value alone.
    advisory: bool = False
    # Another variable this one must agree with (PYTORCH_ALLOC_CONF with
    # PYTORCH_CUDA_ALLOC_CONF): where that one keeps the user's value, so does this.
    same_as: str | None = None

    @property
    def action(self) -> Action:
        if self.value is None:
            return Action.UNSET
        if self.current is None:
            return Action.SET
        return Action.KEEP if self.current == self.value else Action.CHANGE

    def against(self, environ: Mapping[str, str]) -> Recommendation:
        """The same advice, marked against this environment."""
        return replace(self, current=environ.get(self.name))


@dataclass(frozen=True)
class LeftUnset:
    """A variable left unset on purpose: what NCCL or torch already does well by itself."""

    names: tuple[str, ...]
    reason: str
    source: str
    found: tuple[str, ...] = ()  # where one is set now, unflagged: "NCCL_IB_TIMEOUT=22 in ..."


@dataclass(frozen=True)
class DataLoaderHint:
    num_workers: int
    pin_memory: bool
    reason: str
    source: str
