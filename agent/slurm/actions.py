"""What `slurm health-check` does to a node: scontrol update and scontrol reboot, bounded.

The argv is built here, never through a shell: a reason is one argument whatever it holds.
scontrol.1: State=DRAIN takes the node out of scheduling (running jobs finish) and needs a
Reason; State=UNDRAIN clears DRAIN "but will not change the node's base state (e.g. DOWN)",
unlike RESUME, which also returns a DOWN node to service; `reboot ASAP nextstate=RESUME
reason=...` drains the node, reboots it once idle and returns it to service after.
"""

from __future__ import annotations

from collections.abc import Sequence

from nodecheck.checks.node.slurm_state import SlurmStateError, run_bounded_command
from nodecheck.checks.record import record


@record
class ActionOutcome:
    done: bool
    argv: tuple[str, ...]
    problem: str = ""  # why it was not done


def drain_argv(scontrol: str, node: str, reason: str) -> list[str]:
    return [scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]


def undrain_argv(scontrol: str, node: str) -> list[str]:
    return [scontrol, "update", f"NodeName={node}", "State=UNDRAIN"]


def reboot_argv(scontrol: str, node: str, reason: str) -> list[str]:
    return [scontrol, "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", node]


def run_action(argv: Sequence[str], timeout_s: float) -> ActionOutcome:
    """Run one scontrol action; its failure (exit status, stderr, a hang) said, not raised."""
    try:
        status, out, err = run_bounded_command(argv, timeout_s)
    except SlurmStateError as problem:
        return ActionOutcome(False, tuple(argv), str(problem))
    if status != 0:
        said = (err.strip() or out.strip()).splitlines()[:1]
        detail = f": {said[0][:200]}" if said else ""
        return ActionOutcome(False, tuple(argv), f"{argv[0]} exited {status}{detail}")
    return ActionOutcome(True, tuple(argv))
