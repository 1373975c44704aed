"""What a check is given: the node's roots, its calling environment, and shared reads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.inventory import Inventory, read_inventory
from nodecheck.checks.node.variables import Variables, read_variables
from nodecheck.checks.node.virtualization import detect_virtualization

T = TypeVar("T")


@dataclass
class CheckContext:
    """Shared by every check of one run. Expensive reads happen once, on first use.

    The runner runs checks in parallel threads, so each shared read has its own
    lock: a read that hangs (say, on /proc) holds up only the checks that need
    that read, and those are reported when their deadline passes.
    """

    fs: NodeFS = field(default_factory=NodeFS)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    uid: int = field(default_factory=os.getuid)
    _cache: dict[str, object] = field(default_factory=dict, repr=False)
    _locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)
    _locks_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _once(self, key: str, compute: Callable[[], T]) -> T:
        with self._locks_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._cache:
                self._cache[key] = compute()
            return self._cache[key]  # type: ignore[return-value]

    @property
    def inventory(self) -> Inventory:
        return self._once("inventory", lambda: read_inventory(self.fs))

    @property
    def variables(self) -> Variables:
        return self._once("variables", lambda: read_variables(self.fs, self.environ, self.uid))

    @property
    def virtualization(self) -> str | None:
        """Why this node looks like a VM, or None on bare metal."""
        return self._once("virtualization", lambda: detect_virtualization(self.fs))
