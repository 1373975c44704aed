"""What each check declares beside itself (registry.register: needs, root) agrees with the
parts it reads: the agent takes a root check's facts from the root snapshot, so a check
that needs a part complete only as root and is not itself root must say how it copes."""

from __future__ import annotations

from nodecheck.checks.node.facts import PARTS
from nodecheck.checks.registry import load_benchmarks, load_checks

# Checks that need a root part but run in the unprivileged agent on purpose, and why.
UNPRIVILEGED_ON_PURPOSE = {
    # The agent may not read the kernel log (ProtectKernelLogs=): it listens to NVML's XID
    # events instead, and says which source each result rests on.
    "gpu_xid": {"kernel_log"},
    # The AER counters in sysfs are anyone's to read and judged without the log; the log's
    # AER groups add when and which error, and a one-shot run's corrected rate, as root.
    "pcie_aer": {"kernel_log"},
}


def test_every_need_is_a_part() -> None:
    for check in [*load_checks().values(), *load_benchmarks().values()]:
        assert check.needs, f"{check.name} declares no part it judges"
        assert set(check.needs) <= set(PARTS), check.name


def test_a_check_that_needs_a_root_part_is_root_or_says_why_not() -> None:
    for name, check in load_checks().items():
        root_parts = {part for part in check.needs if PARTS[part].root}
        if check.root:
            assert root_parts, f"{name} is root but needs no root part"
            continue
        assert root_parts == UNPRIVILEGED_ON_PURPOSE.get(name, set()), name
