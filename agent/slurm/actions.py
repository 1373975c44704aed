"""What `slurm health-check` does to a node: scontrol update and scontrol reboot, bounded.

The argv is built here, never through a shell: a reason is one argument whatever it holds.
scontrol.1: State=DRAIN takes the node out of scheduling (running jobs finish) and needs a
Reason; State=UNDRAIN clears DRAIN "but will not change the node's base state (e.g. DOWN)",
unlike RESUME, which also returns a DOWN node to service.

A reboot is a drain, then `scontrol reboot reason=... <node>`, which reboots the node
once it is idle. Neither ASAP nor nextstate: with either, slurmctld clears DRAIN when the
node registers after the reboot (scontrol.1: "The node's DRAIN state flag will be cleared
if the reboot was ASAP, nextstate=resume or down"; SchedMD/slurm
src/slurmctld/node_mgr.c, validate_node_specs: `if (node_ptr->next_state != NO_VAL)
node_flags &= (~NODE_STATE_DRAIN)`, and ASAP sets next_state to RESUME when none is
given: proc_req.c, _slurm_rpc_reboot_nodes), and a node
rebooted for a fault would be back in service before a single healthy run. Without
them the drain outlives the reboot, and health-check undrains it after its healthy runs
like any drain of its own (agent/slurm/ownership.py follows its reason through the
reboot).
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
    return [scontrol, "reboot", f"reason={reason}", node]


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
