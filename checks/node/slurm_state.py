"""The node's state as Slurm's controller sees it: `scontrol show node NAME`, parsed.

Running scontrol reads the node's state, so it lives here, bounded in time and output
(NHC #161: sinfo and scontrol hang under controller load). The text form is parsed, as
Slurm 22.05 (Debian's) prints it (src/scontrol/info_node.c, slurm_sprint_node_table):

    NodeName=gpu01 Arch=x86_64 CoresPerSocket=4
       ...
       State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
       ...
       Reason=nodecheck: gpu_xid gpu 0000:3a:00.0: XID 79 [root@2026-12-01T15:00:00]

State is the base state (IDLE, ALLOCATED, MIXED, DOWN, ERROR, FUTURE, UNKNOWN), a `*`
when the node does not respond, then `+`-joined flags (DRAIN, COMPLETING, REBOOT_REQUESTED,
REBOOT_ISSUED, MAINTENANCE, POWERED_DOWN, FAIL, ...). The Reason line ends with
`[user@time]`, who set it and when, printed only when Slurm has a reason time; the user
is a name, or the uid where it has none (uid_to_string).
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from nodecheck.checks.record import record

SCONTROL_OUTPUT_LIMIT = 64 << 10  # bytes; one node's record is about 1 kB
DEFAULT_TIMEOUT_S = 5.0


class SlurmStateError(Exception):
    """The node's Slurm state could not be read or understood: why, in one sentence."""


@record
class SlurmNodeState:
    name: str
    base: str  # IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: frozenset[str]  # DRAIN, REBOOT_REQUESTED, ...
    not_responding: bool  # the "*" after the base state
    reason: str | None
    reason_user: str | None  # who set the reason, as scontrol names them
    reason_time: str | None  # as scontrol prints it

    @property
    def drained(self) -> bool:
        """DRAIN set: DRAINED (idle) or DRAINING (jobs still running)."""
        return "DRAIN" in self.flags


_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_NODE_NAME = re.compile(r"^NodeName=(\S+)")
_REASON = re.compile(r"^\s*Reason=(.*)$", re.MULTILINE)
_FREE_TEXT = re.compile(r"^\s*(Reason|Comment|Extra)=")
_SET_BY = re.compile(r"^(.*?)\s*\[([^\[\]@]+)@([^\[\]]+)\]\s*$")


def parse_state(text: str) -> tuple[str, frozenset[str], bool]:
    """(base state, flags, not responding) of a State= value such as IDLE+DRAIN or
    IDLE+DRAIN+NOT_RESPONDING. scontrol names a node that does not respond with the
    NOT_RESPONDING flag (src/common/slurm_protocol_defs.c, node_state_flag_string); a
    "*" after the base state is sinfo's form of the same, accepted too."""
    base, *flags = text.split("+")
    not_responding = base.endswith("*") or "NOT_RESPONDING" in flags
    base = base.rstrip("*~#!%$@^-")  # sinfo-style suffixes, should scontrol print one
    if not re.fullmatch(r"[A-Z_]+", base) or not all(re.fullmatch(r"[A-Z_]+", f) for f in flags):
        raise SlurmStateError(f"cannot read the node state {text[:60]!r}")
    return base, frozenset(flags), not_responding


def parse_scontrol_node(text: str, node: str) -> SlurmNodeState:
    """The state of `node` in `scontrol show node NODE` output; SlurmStateError when the
    output is not one record of that node with a readable State."""
    records = [line for line in text.splitlines() if _NODE_NAME.match(line)]
    if len(records) != 1:
        raise SlurmStateError(
            f"expected one NodeName= record for {node} in scontrol's output, got {len(records)}"
        )
    name_match = _NODE_NAME.match(records[0])
    assert name_match is not None
    name = name_match.group(1)
    if name != node:
        raise SlurmStateError(f"scontrol answered for node {name[:60]!r}, not {node!r}")
    # Free text (a reason, a comment) may hold " State=" itself: only the other lines count.
    fields = [line for line in text.splitlines() if not _FREE_TEXT.match(line)]
    states = [state for line in fields for state in _STATE.findall(line)]
    if len(states) != 1:
        raise SlurmStateError(f"expected one State= in scontrol's output, got {len(states)}")
    base, flags, not_responding = parse_state(states[0])
    reason = user = when = None
    reason_match = _REASON.search(text)
    if reason_match is not None:
        reason = reason_match.group(1).rstrip()
        set_by = _SET_BY.match(reason)
        if set_by is not None:
            reason, user, when = set_by.group(1), set_by.group(2), set_by.group(3)
        if reason in ("", "(null)"):
            reason = None
    return SlurmNodeState(name, base, flags, not_responding, reason, user, when)


def run_bounded_command(
    argv: Sequence[str],
    timeout_s: float,
    limit: int = SCONTROL_OUTPUT_LIMIT,
    env: Mapping[str, str] | None = None,
) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `argv`, each stream cut at `limit` bytes;
    SlurmStateError when it cannot start, writes more than `limit`, or runs past
    `timeout_s` (its process group is killed: a hung scontrol must not outlive us)."""
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=None if env is None else dict(env),
        )
    except OSError as err:
        raise SlurmStateError(f"cannot run {argv[0]}: {err.strerror or err}") from None
    assert process.stdout is not None and process.stderr is not None
    out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
    outputs = {out_fd: bytearray(), err_fd: bytearray()}
    deadline = time.monotonic() + timeout_s
    problem = None
    status = -1
    with selectors.DefaultSelector() as selector:
        selector.register(out_fd, selectors.EVENT_READ)
        selector.register(err_fd, selectors.EVENT_READ)
        while selector.get_map() and problem is None:
            left = deadline - time.monotonic()
            if left <= 0:
                problem = f"{argv[0]} did not finish within {timeout_s:g} s"
                break
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                outputs[key.fd] += chunk
                if len(outputs[key.fd]) > limit:
                    problem = f"{argv[0]} wrote over {limit} bytes"
    if problem is None:
        try:
            status = process.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            problem = f"{argv[0]} did not finish within {timeout_s:g} s"
    if problem is not None:
        with contextlib.suppress(OSError):  # already gone
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    process.stdout.close()
    process.stderr.close()
    if problem is not None:
        raise SlurmStateError(problem)
    return (
        status,
        outputs[out_fd].decode("utf-8", "replace"),
        outputs[err_fd].decode("utf-8", "replace"),
    )


def read_slurm_node(
    node: str, scontrol: str = "scontrol", timeout_s: float = DEFAULT_TIMEOUT_S
) -> SlurmNodeState:
    """`scontrol show node NODE`, parsed; SlurmStateError when scontrol fails, hangs,
    says too much or answers something else. Never a default: an unreadable state is
    "unknown", and the caller changes nothing (NHC #134)."""
    status, out, err = run_bounded_command([scontrol, "show", "node", node], timeout_s)
    if status != 0:
        said = (err.strip() or out.strip()).splitlines()[:1]
        raise SlurmStateError(
            f"scontrol show node {node} exited {status}" + (f": {said[0][:200]}" if said else "")
        )
    return parse_scontrol_node(out, node)


# `scontrol show node` for every node: about 1.5 KiB a node, so a cap of 32 MiB holds
# some twenty thousand nodes, and bounds what a broken scontrol can make us read.
FLEET_OUTPUT_LIMIT = 32 << 20


def parse_scontrol_nodes(text: str) -> list[SlurmNodeState]:
    """Every node of `scontrol show node` (no name: all of them); SlurmStateError when a
    record cannot be read (one node's, named)."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if _NODE_NAME.match(line):
            records.append([line])
        elif records:
            records[-1].append(line)
        elif line.strip():
            raise SlurmStateError("scontrol's output does not begin with a NodeName= record")
    nodes = []
    for lines in records:
        name_match = _NODE_NAME.match(lines[0])
        assert name_match is not None
        nodes.append(parse_scontrol_node("\n".join(lines), name_match.group(1)))
    return nodes


def read_slurm_nodes(
    scontrol: str = "scontrol", timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[SlurmNodeState]:
    """`scontrol show node`, every node, in one bounded read; SlurmStateError when
    scontrol fails, hangs, says too much or something unreadable."""
    status, out, err = run_bounded_command(
        [scontrol, "show", "node"], timeout_s, limit=FLEET_OUTPUT_LIMIT
    )
    if status != 0:
        said = (err.strip() or out.strip()).splitlines()[:1]
        raise SlurmStateError(
            f"scontrol show node exited {status}" + (f": {said[0][:200]}" if said else "")
        )
    return parse_scontrol_nodes(out)
