"""Regular expressions compiled when first used.

A module that parses many forms (the kernel log's dozen stamps, a capture's keys)
keeps a pattern for each, most of which a run never meets: compiling one is a tenth
to a third of a millisecond, paid at import by every command. A `LazyPattern` is
compiled the first time it is used; from then on its methods are the compiled
pattern's own, as fast as a module-level `re.compile`.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any

# What a LazyPattern offers: the methods the readers call.
_METHODS = ("match", "fullmatch", "search")


class LazyPattern:
    """`re.compile(pattern, flags)`, done when one of its methods is first looked up."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        self.flags = flags

    if TYPE_CHECKING:

        def match(
            self, string: str, pos: int = 0, endpos: int = sys.maxsize
        ) -> re.Match[str] | None: ...

        def fullmatch(
            self, string: str, pos: int = 0, endpos: int = sys.maxsize
        ) -> re.Match[str] | None: ...

        def search(
            self, string: str, pos: int = 0, endpos: int = sys.maxsize
        ) -> re.Match[str] | None: ...

    def __getattr__(self, name: str) -> Any:
        # Only a name the instance does not have comes here: the methods are put on it,
        # so every later use finds the compiled pattern's method at once. Two threads
        # may both compile it; either's methods are as good.
        if name not in _METHODS:
            raise AttributeError(name)
        compiled = re.compile(self.pattern, self.flags)
        for method in _METHODS:
            setattr(self, method, getattr(compiled, method))
        return getattr(compiled, name)

    def __repr__(self) -> str:
        return f"LazyPattern({self.pattern!r}, {self.flags!r})"
