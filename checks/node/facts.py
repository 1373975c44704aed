"""NodeFacts: everything nodecheck reads of a node, in one record (nodecheck.facts/v1).

Reading and judging are apart. This module is where every read of the node is named:
each *part* of the facts (the PCI inventory, the variables, the NVML snapshot, the kernel
log's XIDs, ...) has one reader here, over the node's sources (the sysfs, procfs and
root filesystem roots, the calling environment, the NVML session). Checks and tuning get
parts, never the sources, so a rule is a pure function of facts and a capture taken on
one node is judged anywhere (`nodecheck capture`, then `check --facts FILE`).

A part that could not be read is `Unread` (why, and the paths a hung read was stuck
on), never a default: "could not determine" stays its own outcome after a round trip.
The document, documented in docs/facts.md:

    {"schema": "nodecheck.facts/v1", "taken_at": 1764600000.0, "nodecheck_version": "0.1.0",
     "roots": {"sysfs": "/sys", ...},
     "parts": {"inventory": {"value": {...}}, "gpus": {"unread": {"reason": ..., ...}}}}

A part absent from "parts" was not captured (the root snapshot holds only the parts that
need root).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from nodecheck.checks.node.codec import (
    FactsFormatError,
    decode,
    encode,
    expansion_budget,
    parse_json,
    refuse_repeated_key,
)
from nodecheck.checks.node.fs import NodeFS, reads_in_flight
from nodecheck.checks.node.patterns import LazyPattern
from nodecheck.checks.record import record

if TYPE_CHECKING:
    from nodecheck.checks.node.job_python import JobPython
    from nodecheck.checks.node.nvml import NvmlSession

SCHEMA_PREFIX = "nodecheck.facts/v"
SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_PREFIX}{SCHEMA_VERSION}"
# v1, v2, ...: ASCII digits, no leading zero, few enough to be a version.
_SCHEMA_PATTERN = LazyPattern(r"nodecheck\.facts/v([1-9][0-9]{0,8})", re.ASCII)
CAPTURE_LIMIT = 64 << 20  # bytes: an 8-GPU node's capture is a few hundred kB
PART_TIMEOUT_S = 20.0  # how long `capture` waits for one part before calling it unread

T = TypeVar("T")


@record
class Unread:
    """A part that could not be read, and why ("did not finish within 10 s, stuck
    reading /sys/..."); `cause` is "timeout", "exception" or "not captured"."""

    reason: str
    cause: Literal["timeout", "exception", "not captured", "not read"]
    stuck_reading: tuple[str, ...] = ()
    remedy: str = ""


class PartUnavailableError(Exception):
    """A check asked for a part that could not be read (or a capture does not hold)."""

    def __init__(self, name: str, unread: Unread) -> None:
        super().__init__(unread.reason)
        self.name = name
        self.unread = unread


class FactsError(ValueError):
    """A capture that cannot be judged: not one, a newer schema, or damaged; says where."""


@record(frozen=False)
class NodeSources:
    """What the readers read: the node's roots, the calling environment, NVML."""

    fs: NodeFS = field(default_factory=NodeFS)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    uid: int = field(default_factory=os.getuid)
    nvml: NvmlSession | None = None
    # Where the kernel log is read for XIDs and SXids; None means <rootfs>/dev/kmsg.
    kernel_log: Path | None = None
    # The Python the job runs, where the user named it (`tune --python`, exec's command):
    # the `job_versions` part reads its packages. None: only running processes are read.
    job_python: JobPython | None = None
    # nodecheck's state directory (BenchOptions.state_dir), where the network_sweep part
    # reads network.json. None, or nodecheck's own default (/var/lib/nodecheck for root):
    # a path of the node, under the root filesystem (a replica's own); any other as given.
    state_dir: Path | None = None

    def session(self) -> NvmlSession:
        if self.nvml is None:
            from nodecheck.checks.node.nvml import NvmlSession

            self.nvml = NvmlSession()
        return self.nvml

    @property
    def kernel_log_path(self) -> Path:
        return self.kernel_log if self.kernel_log is not None else self.fs.host("/dev/kmsg")

    @property
    def state_directory(self) -> Path:
        from nodecheck.checks.config import default_state_dir, is_default_state_dir

        given = self.state_dir if self.state_dir is not None else default_state_dir()
        return self.fs.host(str(given)) if is_default_state_dir(given) else given


Reader = Callable[[NodeSources, "FactsSource"], Any]


@record
class PartSpec:
    """One part of the facts: its reader, the type it decodes to, and what it needs."""

    name: str
    description: str
    reader: Reader
    value_type: Callable[[], object]  # the type hint, imported only when a capture is loaded
    root: bool = False  # complete only as root (the unprivileged agent takes it from a snapshot)
    nvml: bool = False
    # In the agent, shared by the checks run close together (SharedReads), not read per turn.
    shared: bool = False
    # What the value was computed from (a file's size and time): read again when it changes.
    version: Callable[[NodeSources], object] | None = None
    # Left out of `capture` (derivable from another part).
    captured: bool = True


PARTS: dict[str, PartSpec] = {}


def lazy_type(module: str, name: str) -> Callable[[], object]:
    """A part's value type: class `name` of checks/node's `module`, imported only when a
    capture is loaded (reading the node, or `tune`, never pays for it)."""

    def load() -> object:
        import importlib

        return getattr(importlib.import_module(f"nodecheck.checks.node.{module}"), name)

    return load


def part(
    name: str,
    value_type: Callable[[], object],
    *,
    root: bool = False,
    nvml: bool = False,
    shared: bool = False,
    version: Callable[[NodeSources], object] | None = None,
    captured: bool = True,
) -> Callable[[Reader], Reader]:
    """Register the reader of part `name`; its docstring's first line describes it."""

    def decorate(reader: Reader) -> Reader:
        if name in PARTS:
            raise ValueError(f"fact part {name!r} registered twice")
        description = (reader.__doc__ or name).strip().splitlines()[0]
        PARTS[name] = PartSpec(
            name, description, reader, value_type, root, nvml, shared, version, captured
        )
        return reader

    return decorate


class FactsSource:
    """Where a check's parts come from: the node itself (LiveFacts) or a capture (NodeFacts)."""

    taken_at: float

    def get(self, name: str) -> Any:
        raise NotImplementedError

    def has(self, name: str) -> bool:
        """Whether `name` is already at hand (read, or in the capture), without reading it."""
        raise NotImplementedError


class SharedCache:
    """What the agent's per-turn LiveFacts share: `get(key, compute, version)`."""

    def get(self, key: str, compute: Callable[[], T], version: object = None) -> T:
        raise NotImplementedError


class LiveFacts(FactsSource):
    """The node's parts, each read on first use, once, under its own lock: a read that
    hangs holds up only the checks that need that part (the runner reports them).

    Parts are read one at a time. Reading is Python work more than waiting on the
    kernel, so fifteen checks' threads reading their parts at once only take the GIL
    from each other: a third slower on two cores than one after another. A read waits
    at most BATON_WAIT_S for the one in progress, so a read that hangs costs the
    others that much, once each, and never their results."""

    BATON_WAIT_S = 0.25

    def __init__(self, sources: NodeSources, shared: SharedCache | None = None) -> None:
        self.sources = sources
        self.shared = shared
        self.taken_at = time.time()
        self._values: dict[str, object] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        # Reentrant: a part's reader may ask for another part (gpus for pci_gpus).
        self._baton = threading.RLock()

    def _read(self, spec: PartSpec) -> Any:
        holds = self._baton.acquire(timeout=self.BATON_WAIT_S)
        try:
            return spec.reader(self.sources, self)
        finally:
            if holds:
                self._baton.release()

    def has(self, name: str) -> bool:
        return name in self._values

    def get(self, name: str) -> Any:
        spec = PARTS[name]
        if spec.shared and self.shared is not None:
            version = spec.version(self.sources) if spec.version is not None else None
            return self.shared.get(name, lambda: self._read(spec), version)
        # A part with a version (the kernel log) is read again when what it was computed
        # from changed, even within one run; one that failed gets a fresh version each time.
        key = name if spec.version is None else f"{name} {spec.version(self.sources)!r}"
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._values:
                self._values[key] = self._read(spec)
            return self._values[key]

    def _read_bounded(self, names: list[str], timeout_s: float) -> dict[str, object]:
        """Each of `names` read on its own thread, all under one deadline: its value, or
        the Unread that says why not (it raised, or it hung: the paths it was stuck on)."""
        outcomes: dict[str, object] = {}
        threads: dict[str, threading.Thread] = {}

        def read(name: str) -> None:
            try:
                outcomes[name] = self.get(name)
            except PartUnavailableError as err:
                outcomes[name] = err.unread
            except Exception as err:
                outcomes[name] = Unread(
                    f"reading {name} failed: {type(err).__name__}: {err}", "exception"
                )

        started = time.monotonic()
        for name in names:
            threads[name] = threading.Thread(
                target=read, args=(name,), name=f"facts-{name}", daemon=True
            )
            threads[name].start()
        for name, thread in threads.items():
            thread.join(max(started + timeout_s - time.monotonic(), 0.0))
            if thread.is_alive():
                stuck = tuple(r.path for r in reads_in_flight() if r.thread == thread.ident)[:2]
                reason = f"reading {name} did not finish within {timeout_s:g} s"
                if stuck:
                    reason += ", stuck reading " + ", ".join(stuck)
                outcomes[name] = Unread(reason, "timeout", stuck)
        return {name: outcomes[name] for name in names}

    def capture(
        self, names: Iterable[str] | None = None, timeout_s: float = PART_TIMEOUT_S
    ) -> NodeFacts:
        """A NodeFacts of `names` (every captured part by default), each read on its own
        thread under `timeout_s`: a part that raises or hangs is Unread, the others kept."""
        wanted = [n for n in PARTS if PARTS[n].captured] if names is None else list(names)
        outcomes = self._read_bounded(wanted, timeout_s)
        # A part a capture derives from another (pci_gpus from inventory) is read on its
        # own where that other could not be: the GPU checks still judge the GPUs then.
        fallbacks = [
            derived
            for derived, (source, _) in DERIVED.items()
            if derived not in outcomes and isinstance(outcomes.get(source), Unread)
        ]
        if fallbacks:
            outcomes.update(self._read_bounded(fallbacks, timeout_s))
            wanted += fallbacks
        fs = self.sources.fs
        return NodeFacts(
            taken_at=self.taken_at,
            parts={name: outcomes[name] for name in wanted},
            roots={"sysfs": str(fs.sysfs), "procfs": str(fs.procfs), "rootfs": str(fs.rootfs)},
            nodecheck_version=nodecheck_version(),
        )


@record
class NodeFacts(FactsSource):
    """One node's facts: each part's value, or why it is Unread. Judged anywhere."""

    taken_at: float
    parts: Mapping[str, object]
    roots: Mapping[str, str] = field(default_factory=dict)
    nodecheck_version: str = ""

    def has(self, name: str) -> bool:
        return name in self.parts

    def get(self, name: str) -> Any:
        if name not in self.parts:
            # A lighter part the capture derives from a fuller one (pci_gpus from inventory).
            derive = DERIVED.get(name)
            if derive is not None and derive[0] in self.parts:
                return derive[1](self.get(derive[0]))
            raise PartUnavailableError(
                name, Unread(f"the capture holds no {name} (it was not captured)", "not captured")
            )
        value = self.parts[name]
        if isinstance(value, Unread):
            raise PartUnavailableError(name, value)
        return value

    def merged(self, other: NodeFacts) -> NodeFacts:
        """These facts with `other`'s parts added (the root snapshot's, into the agent's)."""
        return NodeFacts(
            self.taken_at, {**self.parts, **other.parts}, self.roots, self.nodecheck_version
        )


# Parts a capture need not hold because another part has them: name -> (source, derive).
DERIVED: dict[str, tuple[str, Callable[[Any], Any]]] = {}


UNKNOWN_HOSTNAME = "unknown"


def hostname_shown(facts: FactsSource) -> str:
    """The name of the node the facts are of (a capture's own, never this machine's), or
    "unknown" where it could not be read: for showing, where a name must stand."""
    from nodecheck.checks.node.fs import ReadError

    try:
        name: str = facts.get("hostname")
    except (PartUnavailableError, ReadError):  # unread in a capture, unreadable live
        return UNKNOWN_HOSTNAME
    return name


def nodecheck_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("nodecheck")
    except metadata.PackageNotFoundError:
        return "unknown"


def facts_document(facts: NodeFacts) -> dict[str, Any]:
    parts: dict[str, Any] = {}
    # Parts in registration order, whatever order they were read in: one text per facts.
    order = {name: index for index, name in enumerate(PARTS)}
    for name, value in sorted(facts.parts.items(), key=lambda item: order.get(item[0], 0)):
        parts[name] = (
            {"unread": encode(value)} if isinstance(value, Unread) else {"value": encode(value)}
        )
    return {
        "schema": SCHEMA,
        "taken_at": encode(facts.taken_at),
        "nodecheck_version": facts.nodecheck_version,
        "roots": dict(facts.roots),
        "parts": parts,
    }


def dumps(facts: NodeFacts) -> str:
    # Keys in the facts' own order, not sorted: a reading's dictionaries keep the order
    # the node gave them in (NVLink error counters per link), and so do the results.
    return json.dumps(facts_document(facts), indent=1, allow_nan=False) + "\n"


def loads(text: str, where: str = "the capture") -> NodeFacts:
    """The NodeFacts a nodecheck.facts/v1 document holds; FactsError saying where not."""
    try:
        document = parse_json(text)
    except json.JSONDecodeError as err:
        raise FactsError(f"{where} is not JSON: {err}") from None
    except RecursionError:
        raise FactsError(f"{where} is nested too deeply to be a capture") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise FactsError(f"{where} is not JSON nodecheck reads: {err}") from None
    if not isinstance(document, dict) or not isinstance(document.get("schema"), str):
        raise FactsError(f"{where} is not a {SCHEMA} capture (no schema)")
    try:
        refuse_repeated_key(document, where)
    except FactsFormatError as err:
        raise FactsError(str(err)) from None
    schema = document["schema"]
    numbered = _SCHEMA_PATTERN.fullmatch(schema)
    if numbered is None:
        shown = schema if len(schema) <= 60 else schema[:60] + "..."
        raise FactsError(f"{where} is a {shown!r} document, not a {SCHEMA} capture")
    version = int(numbered.group(1))
    if version > SCHEMA_VERSION:
        raise FactsError(
            f"{where} is a {schema} capture, newer than this nodecheck reads ({SCHEMA}): "
            "judge it with the nodecheck that took it, or upgrade"
        )
    unknown = sorted(set(document) - ENVELOPE)
    if unknown:
        raise FactsError(
            f"{where}: unknown field {unknown[0]!r} (a capture has {sorted(ENVELOPE)})"
        )
    try:
        with expansion_budget():
            return _decode_document(document, where)
    except FactsFormatError as err:
        raise FactsError(f"{where}: {err}") from None


ENVELOPE = {"schema", "taken_at", "nodecheck_version", "roots", "parts"}


def _decode_document(document: dict[str, Any], where: str) -> NodeFacts:
    """The envelope's fields and every part, decoded by their types."""
    taken_at = decode(float, document.get("taken_at"), "taken_at")
    if not math.isfinite(taken_at) or taken_at < 0:
        raise FactsFormatError(f"taken_at: {taken_at!r} is no time")
    roots = decode(dict[str, str], document.get("roots", {}), "roots")
    made_by = decode(str, document.get("nodecheck_version", ""), "nodecheck_version")
    raw_parts = decode(dict[str, Any], document.get("parts"), "parts")
    parts: dict[str, object] = {}
    for name, entry in raw_parts.items():
        at = f"parts.{name}"
        spec = PARTS.get(name)
        if spec is None:
            raise FactsFormatError(f"{at}: no such part (parts: {', '.join(PARTS)})")
        refuse_repeated_key(entry, at)
        if not isinstance(entry, dict) or len(entry) != 1 or not ({"value", "unread"} & set(entry)):
            raise FactsFormatError(f'{at}: expected {{"value": ...}} or {{"unread": ...}}')
        if "unread" in entry:
            parts[name] = decode(Unread, entry["unread"], f"{at}.unread")
        else:
            parts[name] = decode(spec.value_type(), entry["value"], f"{at}.value")
            # A part with times of its own says which of them the capture's time rules out.
            misdated: Callable[[float], tuple[str, str] | None] | None = getattr(
                parts[name], "misdated", None
            )
            problem = None if misdated is None else misdated(taken_at)
            if problem is not None:
                raise FactsFormatError(f"{at}.value.{problem[0]}: {problem[1]}")
    return NodeFacts(taken_at, parts, roots, made_by)


def load(path: Path) -> NodeFacts:
    """The capture at `path`: a regular file of at most CAPTURE_LIMIT bytes, UTF-8."""
    from nodecheck.checks.node.fs import read_regular_file

    data = read_regular_file(path, CAPTURE_LIMIT)
    if len(data) > CAPTURE_LIMIT:
        raise FactsError(f"{path} is over {CAPTURE_LIMIT} bytes: not a capture")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FactsError(f"{path} is not UTF-8 (byte {err.start})") from None
    return loads(text, str(path))


# The readers. Each imports what it reads with on first use: `tune` never pays for NVML.
# Their registration order is the order of a capture's parts.
import nodecheck.checks.node.fact_parts  # noqa: E402,F401  (registers the parts)
