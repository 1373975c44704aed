"""Only checks/node/ reads the node: every other module judges facts.

Two halves, so that the test fails when any module outside checks/node/ opens a file of
the node or calls NVML:

- Static, by AST over every module of agent/, checks/ (outside checks/node/) and tuning/:
  no call of a function of checks/node/ that reads (one that opens, lists or stats a file,
  or takes the node's NodeFS, NodeSources or NvmlSession: found in checks/node's own
  source, not listed here), no NodeFS path method (`.sys()`, `.proc()`, `.host()`), no
  `open()` / `os.open` / `Path.read_*` / directory listing, no `ctx.fs` / `ctx.nvml` /
  `ctx.sources` outside what runs live by nature (LIVE), no pynvml import, no NvmlSession
  `.call/.run/.module`.
- Dynamic: the DGX replicas are captured, their trees deleted, and every check and
  `make_plan` run over the loaded capture with roots pointing at an empty directory and no
  NVML session: the same results and plan as live, and an audit hook (PEP 578) sees
  nothing opened or listed under the node's roots (nor this machine's /sys, /proc, /dev)
  and no NVML asked (a pynvml call, a library loaded or looked up) while they judge. A
  read of a file that is not there never reaches open(2) (fs.py stats first): under the
  empty roots such a read shows as a different result, which the comparison catches.

What may still read is named below, each entry with its module, the enclosing function
("*": anywhere in it), the call and why: the agent's own files (OWN_FILES). Any other
read fails, and so does an entry that no longer matches a read.
"""

from __future__ import annotations

import ast
import contextlib
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import nodecheck.checks
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import LiveFacts, dumps, loads
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.registry import Check, load_checks
from nodecheck.checks.runner import run_checks
from nodecheck.tuning.plan import TuneOptions, make_plan
from tests.conftest import CLEAN_ENVIRON, Node
from tests.facts.compare import comparable, differences, results_by_check

# The product's source tree (agent/, checks/, tuning/), as Python imports it.
PRODUCT = Path(nodecheck.checks.__file__).resolve().parent.parent
LAYERS = ("agent", "checks", "tuning")
NODE_PACKAGE = "checks/node/"
# What runs on this node by nature, never over a capture, and so may hold the node's
# sources and call checks/node's readers with them (it still opens no node file itself):
LIVE = {
    # the benchmarks measure this node: a child process on its GPUs
    # (registry.register_benchmark); their child/ package is the benchmark process itself
    "checks/bench/": "checks/bench/child/",
    # `nodecheck exec` runs the job here: it reads its own process's allowed memory nodes
    "agent/launch/rank_exec.py": None,
}


@dataclass(frozen=True)
class Allowed:
    """A read outside checks/node/ that is allowed: `module` (relative to the product
    tree), the function it is in ("*": anywhere in the module), the call, and why."""

    module: str
    function: str
    call: str
    reason: str


# The agent's own files, for good: its configuration, TLS and basic-auth files, the
# state and textfile directories, the root snapshot and the captures it is given, and the
# options that name the roots and the NVML library. None is a file of the node judged.
OWN_FILES = (
    Allowed("agent/config.py", "read_text_file", "read_regular_file", "the agent's TOML file"),
    # `config check` says whether the configured kernel log can be read at all; its lines
    # are read by the kernel_log part.
    Allowed("agent/config.py", "kernel_log_problem", "stat", "config check: the log's kind"),
    Allowed("agent/config.py", "kernel_log_problem", "access", "config check: readable"),
    Allowed("agent/config.py", "snapshot_problem", "stat", "the root snapshot's path"),
    Allowed("agent/web/tls.py", "_read_pem", "read_regular_file", "TLS certificate and key"),
    # PyYAML's yaml.load (with a SafeLoader) parses the web configuration's text, which
    # agent/config.py's read_text_file read: the name is the facts loader's, not the call.
    Allowed("agent/web/config.py", "_document", "load", "the web configuration's YAML text"),
    Allowed("agent/daemon/snapshot.py", "*", "read_regular_file", "the root snapshot (a capture)"),
    # The state folder's JSON files (the healthy-run count, the drain's record, a hook's
    # failure, a withheld drain): nodecheck's own, not the node's.
    Allowed("agent/state_files.py", "load_state", "read_regular_file", "its state files"),
    Allowed("agent/slurm/hysteresis.py", "__init__", "open", "its hysteresis lock file"),
    # The task prolog's threads come from this process's affinity only on the live node:
    # whether the node read is this machine (a replica's tasks have no affinity here).
    Allowed("agent/cli/slurm_task.py", "_task_affinity", "is_live_procfs", "live node?"),
    # slurm health-check acts on this node's Slurm state now: its intervals are on this
    # boot's clock, keyed by its boot id (checks/node/boot.py), which no capture holds.
    Allowed("agent/slurm/health.py", "run_health_check", "read_boot_moment", "its boot clock"),
    Allowed("agent/cli/options.py", "*", "load", "a capture named by --facts FILE"),
    Allowed("agent/cli/options.py", "_remember_regular_file", "stat", "--nvml-library: a file?"),
    Allowed("agent/cli/options.py", "node_fs", "is_dir", "--sysfs-root etc. must be directories"),
    Allowed("agent/cli/options.py", "node_fs", "exists", "--sysfs-root etc. must be directories"),
    # A command closes the NVML session it opened for its context (a source, not a read).
    Allowed("agent/cli/check.py", "check", "nvml", "closes the command's NVML session"),
    Allowed("agent/cli/mfu.py", "mfu", "nvml", "closes the command's NVML session"),
    Allowed("agent/cli/bench.py", "bench", "nvml", "closes the command's NVML session"),
    Allowed("agent/cli/bench_network.py", "network", "nvml", "closes its NVML session"),
    Allowed("checks/bench/state.py", "*", "read_text", "the benchmark state file"),
    Allowed("checks/bench/state.py", "*", "open", "the state directory's lock files"),
    # The benchmark's own NCCL debug log, in the ranks' private temporary folder.
    Allowed("checks/bench/nccl_log.py", "log_size", "stat", "its NCCL log's size"),
    Allowed("checks/bench/nccl_log.py", "read_segment", "open", "its NCCL log"),
    Allowed("checks/bench/nccl_log.py", "log_files", "listdir", "its NCCL log folder"),
    Allowed("checks/bench/child_runner.py", "<module>", "resolve", "its own checkout's path"),
    Allowed("checks/bench/child_runner.py", "child_module", "is_file", "a test double's file"),
    # `nodecheck exec -- CMD`: whether CMD is there and can be run (126 or 127), as execvp
    # would find it; the job's command, no file of the node judged.
    Allowed("agent/launch/rank_exec.py", "_not_runnable", "isdir", "exec: CMD is a directory?"),
    Allowed("agent/launch/rank_exec.py", "_not_runnable", "access", "exec: CMD executable?"),
    Allowed("agent/launch/rank_exec.py", "check_command", "exists", "exec: CMD there?"),
    Allowed(
        "agent/launch/rank_exec.py", "check_command", "isfile", "exec: CMD on PATH, not runnable"
    ),
)


# --- the static half ------------------------------------------------------------------

# Calls that touch a filesystem: opening, reading, listing, stat-ing, resolving links.
OS_IO = {"open", "stat", "lstat", "scandir", "listdir", "readlink", "access", "walk"}
PATH_IO = {
    "read_text",
    "read_bytes",
    "open",
    "iterdir",
    "glob",
    "rglob",
    "stat",
    "lstat",
    "exists",
    "is_dir",
    "is_file",
    "is_symlink",
    "readlink",
    "resolve",
    "samefile",
}
# os.path's predicates stat the path they are given.
OS_PATH_IO = {"exists", "isdir", "isfile", "islink", "realpath", "getsize", "getmtime"}
# The node's sources: a function of checks/node taking one reads the node.
SOURCE_TYPES = {"NodeFS", "NodeSources", "NvmlSession"}
# NodeFS's methods that make a path of the node.
NODEFS_PATHS = {"sys", "proc", "host"}
# NvmlSession's methods that call NVML.
NVML_CALLS = {"call", "run", "run_many", "module"}
# Modules whose functions share a name with a reader of checks/node (json.load, not
# facts.load); their own file access is judged by the rules above.
NOT_OURS = {"os", "os.path", "json", "tomllib", "pickle", "shutil", "importlib", "metadata"}
# Functions of checks/node that write (nodecheck's own files), or look at where they will
# be written (checks/node/output.py: the rule of every output path), not read the node.
WRITERS = {"write_atomically", "write_output", "output_directory_problem"}


def product_modules(*, node: bool) -> list[Path]:
    """The .py files of agent/, checks/ and tuning/: those of checks/node/ when `node`,
    every other one otherwise."""
    found = [path for layer in LAYERS for path in sorted((PRODUCT / layer).rglob("*.py"))]
    return [path for path in found if _relative(path).startswith(NODE_PACKAGE) == node]


def _relative(path: Path) -> str:
    return path.relative_to(PRODUCT).as_posix()


def _call_name(call: ast.Call) -> str:
    function = call.func
    if isinstance(function, ast.Name):
        return function.id
    if isinstance(function, ast.Attribute):
        return function.attr
    return ""


def _dotted(node: ast.expr) -> str:
    """`os.path.exists` for an attribute chain on a name, "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _is_io(call: ast.Call) -> bool:
    """Whether this call touches the filesystem itself (os, os.path, open, Path methods)."""
    function = call.func
    if isinstance(function, ast.Name):
        return function.id == "open"
    if not isinstance(function, ast.Attribute):
        return False
    owner = _dotted(function.value)
    if owner == "os":
        return function.attr in OS_IO
    if owner == "os.path":
        return function.attr in OS_PATH_IO
    if owner == "io":
        return function.attr == "open"
    return function.attr in PATH_IO


def _annotated_types(annotation: ast.expr) -> set[str]:
    """The types an annotation says a value is: `NodeFS`, `NodeFS | None`, `Optional[X]`;
    not the types inside another (a `Callable[[NodeSources], object]` is a function)."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return _annotated_types(ast.parse(annotation.value, mode="eval").body)
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _annotated_types(annotation.left) | _annotated_types(annotation.right)
    if isinstance(annotation, ast.Subscript) and _dotted(annotation.value).split(".")[-1] in (
        "Optional",
        "Union",
    ):
        inner = annotation.slice
        arms = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        return {name for arm in arms for name in _annotated_types(arm)}
    name = _dotted(annotation)
    return {name.split(".")[-1]} if name else set()


def _takes_a_source(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    arguments = function.args
    return any(
        _annotated_types(argument.annotation) & SOURCE_TYPES
        for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
        if argument.annotation is not None
    )


def node_readers() -> set[str]:
    """The names of checks/node's top-level functions that read the node: those that touch
    the filesystem themselves, take the node's sources, or call such a function."""
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for path in product_modules(node=True):
        tree = ast.parse(path.read_text(), filename=str(path))
        for statement in tree.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[statement.name] = statement
    calls = {
        name: {_call_name(c) for c in ast.walk(function) if isinstance(c, ast.Call)}
        for name, function in functions.items()
    }
    readers = {
        name
        for name, function in functions.items()
        if _takes_a_source(function)
        or any(_is_io(c) for c in ast.walk(function) if isinstance(c, ast.Call))
    }
    while True:  # and whatever calls a reader, until nothing is added
        more = {name for name in functions if calls[name] & readers} - readers
        if not more:
            return readers - WRITERS
        readers |= more


CALLS_A_READER = "calls a reader of checks/node"
TOUCHES_A_FILE = "opens, lists or stats a file itself"
MAKES_A_NODE_PATH = "makes a path of the node (NodeFS)"
USES_THE_SOURCES = "uses the context's node sources (ctx.fs, ctx.nvml, ctx.sources)"
IMPORTS_PYNVML = "imports pynvml"
CALLS_NVML = "calls NVML through a session"
# What the LIVE modules may do: hold the node's sources and hand them to checks/node.
LIVE_RULES = {CALLS_A_READER, USES_THE_SOURCES}


@dataclass(frozen=True)
class Read:
    """A read found outside checks/node/: where, and what."""

    module: str
    function: str
    line: int
    call: str
    rule: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} in {self.function}(): {self.call} ({self.rule})"


def _is_context(node: ast.expr) -> bool:
    """`ctx`, `context`, `self.ctx`: a CheckContext by the names the code gives one."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return name in ("ctx", "context")


def _names_nvml(node: ast.expr) -> bool:
    """A receiver named for an NVML session: `session`, `ctx.nvml`, `self._nvml`."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return "nvml" in name.lower() or "session" in name.lower()


class _ReadFinder(ast.NodeVisitor):
    def __init__(self, module: str, readers: set[str]) -> None:
        self.module = module
        self.readers = readers
        self.function = ["<module>"]
        self.found: list[Read] = []
        self.aliases: dict[str, str] = {}

    def _add(self, node: ast.AST, call: str, rule: str) -> None:
        line = getattr(node, "lineno", 0)
        self.found.append(Read(self.module, self.function[-1], line, call, rule))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.function.append(node.name)
        self.generic_visit(node)
        self.function.pop()

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.function.append(node.name)
        self.generic_visit(node)
        self.function.pop()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == "pynvml":
                self._add(node, alias.name, IMPORTS_PYNVML)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if (node.module or "").split(".")[0] == "pynvml":
            self._add(node, node.module or "", IMPORTS_PYNVML)
        if (node.module or "").startswith("nodecheck.checks.node"):
            # `from ...fs import read_text as text_of`: text_of() is read_text().
            self.aliases.update({a.asname: a.name for a in node.names if a.asname})

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ("fs", "nvml", "sources") and _is_context(node.value):
            self._add(node, node.attr, USES_THE_SOURCES)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node)
        function = node.func
        if isinstance(function, ast.Name):
            name = self.aliases.get(name, name)
        if name in self.readers and not (
            isinstance(function, ast.Attribute) and _dotted(function.value) in NOT_OURS
        ):
            self._add(node, name, CALLS_A_READER)
        elif _is_io(node):
            self._add(node, name, TOUCHES_A_FILE)
        elif isinstance(function, ast.Attribute) and name in NODEFS_PATHS:
            self._add(node, name, MAKES_A_NODE_PATH)
        elif (
            isinstance(function, ast.Attribute)
            and name in NVML_CALLS
            and _names_nvml(function.value)
        ):
            self._add(node, name, CALLS_NVML)
        self.generic_visit(node)


def reads_outside_node() -> list[Read]:
    readers = node_readers()
    found: list[Read] = []
    for path in product_modules(node=False):
        finder = _ReadFinder(_relative(path), readers)
        finder.visit(ast.parse(path.read_text(), filename=str(path)))
        found += finder.found
    return found


def _matches(allowed: Allowed, read: Read) -> bool:
    return (
        allowed.module == read.module
        and allowed.function in ("*", read.function)
        and allowed.call == read.call
    )


def _is_live(module: str) -> bool:
    return any(
        module.startswith(live) and not (but and module.startswith(but))
        for live, but in LIVE.items()
    )


def permitted(read: Read) -> bool:
    if _is_live(read.module) and read.rule in LIVE_RULES:
        return True
    return any(_matches(allowed, read) for allowed in OWN_FILES)


def test_no_module_outside_checks_node_reads_the_node() -> None:
    found = reads_outside_node()
    assert found, "the agent reads its own files: a finder that finds nothing is broken"
    unused = [a for a in OWN_FILES if not any(_matches(a, r) for r in found)]
    assert unused == [], f"OWN_FILES entries that match no read (remove them): {unused}"
    unlisted = [str(read) for read in found if not permitted(read)]
    assert unlisted == [], "reads of the node outside checks/node/:\n" + "\n".join(unlisted)


LITERAL_MODULE = """
import os
import pynvml
from pynvml import nvmlInit
from pathlib import Path
from nodecheck.checks.node.gpu import read_driver_gpus as exposed_gpus

def judge(ctx, path, session):
    exposed_gpus(ctx.fs)
    open(path)
    os.open(path, os.O_RDONLY)
    Path(path).read_text()
    os.listdir(path)
    os.path.exists(path)
    ctx.fs.sys("class", "net")
    read_inventory(ctx.fs)
    ctx.nvml.call(lambda: 0, "x")
    session.run(lambda: 0, "x")
    return ctx.sources
"""

PURE_MODULE = """
import subprocess

def rule(ctx, inventory, variables, check):
    gpus = [d for d in inventory.gpus if d.numa_node is None]
    labels = [source.label for source in variables.sources]
    results = list(check.run(ctx))
    subprocess.run(["true"], check=False)
    return ctx.part("gpus"), ctx.inventory, gpus, labels, results, "a,b".split(",")
"""


def _finds(source: str) -> set[tuple[str, str, str]]:
    finder = _ReadFinder("literal.py", node_readers())
    finder.visit(ast.parse(source))
    return {(read.function, read.call, read.rule) for read in finder.found}


def test_the_finder_finds_every_kind_of_read_and_nothing_in_a_pure_rule() -> None:
    assert _finds(LITERAL_MODULE) == {
        ("<module>", "pynvml", IMPORTS_PYNVML),
        ("judge", "open", TOUCHES_A_FILE),
        ("judge", "read_text", CALLS_A_READER),
        ("judge", "listdir", TOUCHES_A_FILE),
        ("judge", "exists", TOUCHES_A_FILE),
        ("judge", "sys", MAKES_A_NODE_PATH),
        ("judge", "fs", USES_THE_SOURCES),
        ("judge", "read_inventory", CALLS_A_READER),
        ("judge", "read_driver_gpus", CALLS_A_READER),
        ("judge", "nvml", USES_THE_SOURCES),
        ("judge", "call", CALLS_NVML),
        ("judge", "run", CALLS_NVML),
        ("judge", "sources", USES_THE_SOURCES),
    }
    assert _finds(PURE_MODULE) == set()


def test_the_readers_of_checks_node_are_found_in_its_source() -> None:
    readers = node_readers()
    assert {
        "read_text",
        "read_prefix",
        "list_dir",
        "read_regular_file",
        "read_inventory",
        "read_gpus",
        "read_cpuset",
        "read_driver_gpus",
        "read_variables",
        "detect_virtualization",
    } <= readers
    pure = {"parse_link_speed", "parse_attr", "parse_cpulist", "format_cpulist", "decode_text"}
    assert readers & (pure | {"write_atomically", "dumps", "loads", "encode", "decode"}) == set()


# --- the dynamic half -----------------------------------------------------------------

FILE_EVENTS = {"open", "os.scandir", "os.listdir"}
# NVML asked: a call through pynvml (each goes through its _nvmlGetFunctionPointer), a
# library loaded or a symbol looked up (ctypes' audit events), pynvml imported.
NVML_CALL = "nvml call"
NVML_EVENTS = {NVML_CALL, "ctypes.dlopen", "ctypes.dlsym", "import pynvml"}
# This machine's own node files: a hard-coded path would read them, whatever the roots.
MACHINE_ROOTS = (Path("/sys"), Path("/proc"), Path("/dev"))
_PRODUCT_PREFIXES = tuple(
    {str(PRODUCT) + os.sep, os.path.dirname(os.path.dirname(nodecheck.checks.__file__)) + os.sep}
)


@dataclass(frozen=True)
class Touch:
    """A file opened or listed under a watched root, or NVML asked, and the product module
    responsible: the innermost one on the stack outside checks/node/ ("" if none)."""

    event: str
    target: str
    module: str


def _responsible_module() -> str:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        prefix = next((p for p in _PRODUCT_PREFIXES if name.startswith(p)), None)
        module = name[len(prefix) :] if prefix is not None else ""
        if module.split("/")[0] in LAYERS and not module.startswith(NODE_PACKAGE):
            return module
        frame = frame.f_back
    return ""


class NodeAudit:
    """An audit hook (PEP 578) that records, while `watching`, what the threads started
    since (and the watching thread) open or list under some roots, and every NVML call.
    A hook cannot be removed, so there is one per process, idle outside `watching`."""

    def __init__(self) -> None:
        self._watch: tuple[tuple[str, ...], set[int | None], list[Touch]] | None = None

    @contextlib.contextmanager
    def watching(self, roots: list[Path]) -> Iterator[list[Touch]]:
        touches: list[Touch] = []
        others = {thread.ident for thread in threading.enumerate()} - {threading.get_ident()}
        pynvml: Any = sys.modules.get("pynvml")
        lookup = getattr(pynvml, "_nvmlGetFunctionPointer", None)
        if pynvml is not None and lookup is not None:

            def recording(name: str) -> Any:
                self._note(NVML_CALL, name)
                return lookup(name)

            pynvml._nvmlGetFunctionPointer = recording
        self._watch = (tuple(os.path.abspath(root) for root in roots), others, touches)
        try:
            yield touches
        finally:
            self._watch = None
            if pynvml is not None and lookup is not None:
                pynvml._nvmlGetFunctionPointer = lookup

    def _note(self, event: str, target: str) -> None:
        watch = self._watch
        if watch is None or threading.get_ident() in watch[1]:
            return  # not watching, or a thread left running by an earlier test
        watch[2].append(Touch(event, target, _responsible_module()))

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        watch = self._watch
        if watch is None:
            return
        try:
            if event in FILE_EVENTS:
                if not args or args[0] is None or isinstance(args[0], int):
                    return
                target = os.path.abspath(os.fsdecode(args[0]))
                if any(target == root or target.startswith(root + os.sep) for root in watch[0]):
                    self._note(event, target)
            elif event in NVML_EVENTS:
                self._note(event, repr(args[:2]))
            elif event == "import" and args and args[0] == "pynvml":
                self._note("import pynvml", "pynvml")
        except Exception:  # a hook that raises breaks the call it audits
            return


_AUDIT: list[NodeAudit] = []


@pytest.fixture(scope="session")
def audit() -> NodeAudit:
    # Imported now, so that `watching` can see each NVML call however the session began.
    import pynvml  # noqa: F401

    if not _AUDIT:
        _AUDIT.append(NodeAudit())
        sys.addaudithook(_AUDIT[0].hook)
    return _AUDIT[0]


def _module_of(check: Check) -> str:
    return check.run.__module__.removeprefix("nodecheck.").replace(".", "/") + ".py"


def test_the_audit_sees_a_live_run_read_the_node_and_call_nvml(
    dgx: Node, copy_node: Callable[[Node], Node], audit: NodeAudit
) -> None:
    """The hook is no blindfold: a live pass opens the replica's files and calls NVML."""
    node = copy_node(dgx)
    live = node.context(environ=CLEAN_ENVIRON)
    with audit.watching([node.root]) as touches:
        run_checks(list(load_checks().values()), live)
    opened = [t for t in touches if t.event == "open"]
    assert any(t.target.startswith(str(node.root / "sys") + os.sep) for t in opened)
    assert any(t.target.startswith(str(node.root / "proc") + os.sep) for t in opened)
    assert any(t.event == NVML_CALL for t in touches)


@pytest.mark.parametrize("name", ["dgx-h100", "dgx-h100-faulty"])
def test_judging_a_capture_of_a_deleted_node_reads_nothing_and_says_the_same(
    name: str,
    build: Callable[..., Node],
    copy_node: Callable[[Node], Node],
    tmp_path: Path,
    audit: NodeAudit,
) -> None:
    node = copy_node(build(name))
    checks = list(load_checks().values())
    live = node.context(environ=CLEAN_ENVIRON)
    live_runs = run_checks(checks, live)
    live_plan = make_plan(live, TuneOptions())
    assert isinstance(live.facts, LiveFacts)
    text = dumps(live.facts.capture())
    shutil.rmtree(node.root)

    empty = tmp_path / "empty"
    empty.mkdir()
    # No NVML session at all: a check that asked NVML would fail, and the hook see it.
    judged = CheckContext(
        facts=loads(text),
        fs=NodeFS(sysfs=empty, procfs=empty, rootfs=empty),
        environ=dict(CLEAN_ENVIRON),
        uid=1000,
    )
    with audit.watching([node.root, empty, *MACHINE_ROOTS]) as touches:
        judged_runs = run_checks(checks, judged)
        judged_plan = make_plan(judged, TuneOptions())

    assert touches == [], "judging a capture read the node or called NVML"

    live_results = results_by_check(live_runs)
    judged_results = results_by_check(judged_runs)
    compared = [c.name for c in checks]
    for check in compared:
        assert comparable(judged_results[check]) == comparable(live_results[check]), (
            f"{check} judged the capture of a deleted node differently (left: judged, "
            f"right: live):\n{differences(judged_results[check], live_results[check])}"
        )
    assert comparable(judged_plan) == comparable(live_plan), differences(judged_plan, live_plan)
