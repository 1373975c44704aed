"""The configuration every check is judged under, each default declared once.

CheckConfig reaches every check as `ctx.config`: the GPU count the node should have,
the NVML deadline, and how benchmarks run (devices, durations, the gate's limits,
thresholds). This module is the only place those defaults are written: the agent's
TOML (agent/config.py: AgentConfig, `nodecheck config show`) and the command's options
(agent/cli/options.py: --nvml-timeout, --expected-gpus; agent/cli/bench.py: `nodecheck
bench`'s options) take theirs from the fields below (a field's default is the class
attribute of the same name: `BenchOptions.duration_s`), and tests/agent/test_defaults.py
checks that they do.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import field
from pathlib import Path

from nodecheck.checks.record import record

# The agent's, as root (nodecheck.service's StateDirectory=nodecheck makes it too).
ROOT_STATE_DIR = Path("/var/lib/nodecheck")


def default_state_dir() -> Path:
    """/var/lib/nodecheck for root (the agent), else $XDG_STATE_HOME/nodecheck."""
    if os.geteuid() == 0:
        return ROOT_STATE_DIR
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "nodecheck"


def is_default_state_dir(path: Path) -> bool:
    """Whether `path` is nodecheck's own state directory (root's, or this user's
    default): the one benchmark folder nodecheck creates when it is missing. A state
    directory it is given must exist, as every folder it is told to write in."""
    return path in (ROOT_STATE_DIR, default_state_dir())


# NVML calls are answered in milliseconds; past this a call is hung (a GPU off the bus can
# hold the driver for tens of seconds). The agent's nvml_timeout and --nvml-timeout.
DEFAULT_NVML_TIMEOUT_S = 5.0
# A GPU pass waits at most three NVML deadlines (init, listing, reads): the cap keeps
# that inside the GPU checks' own 30 s timeout. The agent's file and the command line
# use the same range.
NVML_TIMEOUT_RANGE_S = (0.1, 8.0)
# The ranges of the benchmark settings, for the file and `nodecheck bench`'s options alike.
BENCH_DURATION_RANGE_S = (0.1, 600.0)
IDLE_WINDOW_RANGE_S = (0.0, 3600.0)
MEMORY_FRACTION_RANGE = (0.01, 0.95)
# warn_below and fail_below: above 0 and at most 1.
RATIO_RANGE = (0, 1)
# `nodecheck slurm prolog` and `epilog`: the whole run's budget (a job waits on the
# prolog, at allocation with PrologFlags=Alloc: a few seconds).
DEFAULT_PROLOG_BUDGET_S = 5.0
# The epilog holds the node in COMPLETING, the next job waits for it.
DEFAULT_EPILOG_BUDGET_S = 15.0
BUDGET_RANGE_S = (0.5, 60.0)

# How long every GPU must be idle before a benchmark the agent schedules starts. The
# agent runs benchmarks unattended, so it waits a minute of idleness (a job between two
# steps is idle for seconds); `nodecheck bench`, run by someone watching a drained node,
# waits BenchOptions.idle_window_s.
AGENT_IDLE_WINDOW_S = 60.0

# How old a cross-node sweep's record (network.json) may be and still judge the node: a
# nightly sweep (README.md's cron line) that found no idle nodes for two nights running
# is still within it; past it the node's last sweep says nothing of its links now (a cable
# reseated since, a switch replaced), and the check says so instead of failing on it.
# The agent's [benchmarks] network_max_age; sweeps run weekly need more than a week.
NETWORK_MAX_AGE_S = 3 * 86400.0
NETWORK_MAX_AGE_RANGE_S = (3600.0, 30 * 86400.0)


@record
class Thresholds:
    """Ratios below which a result warns or fails.

    Against the peer median and the GPU's own baseline: 0.9 and 0.8 (margins
    wider than the 5 % spread stas00 finds normal between GPUs of one node). Against
    a published typical rate (MAMF, busbw tables), which is one good node's
    figure rather than a guarantee: 0.85 and 0.7 (docs/hardware.md §13).
    """

    warn: float = 0.9
    fail: float = 0.8
    reference_warn: float = 0.85
    reference_fail: float = 0.7


@record
class BenchOptions:
    device: str = "cuda"  # or "cpu"
    gpus: tuple[int, ...] | None = None  # NVML indices; None: every GPU
    dtype: str = "bf16"
    duration_s: float = 4.0  # per benchmark, all devices at once
    processes: int = 2  # all_reduce ranks with --device cpu
    force: bool = False  # skip the idle gate (a drained node); the in-run watch stays
    state_dir: Path = field(default_factory=default_state_dir)
    idle_window_s: float = 2.0
    idle_utilization_pct: int = 5
    memory_fraction: float = 0.5  # of each GPU's free memory
    maintenance_file: str = "/run/nodecheck/maintenance"  # under the rootfs
    watch_interval_s: float = 0.25
    thresholds: Thresholds = field(default_factory=Thresholds)
    baseline_runs: int = 10  # the rolling median's window
    on_progress: Callable[[str, float], None] | None = None
    timeout_s: float | None = None  # the child's deadline; None: child_timeout_s's default
    # How old the last cross-node sweep's record may be and still judge the node.
    network_max_age_s: float = NETWORK_MAX_AGE_S

    @property
    def child_timeout_s(self) -> float:
        """The child's hard deadline: torch import and set-up take seconds of their own."""
        return self.timeout_s if self.timeout_s is not None else 60.0 + 3 * self.duration_s


@record
class CheckConfig:
    """What checks are told rather than read: the one configuration object they get.

    Frozen, as BenchOptions is: the agent builds one from its configuration (again on
    each reload) and every context of every check shares it.
    """

    # How many GPUs this node should have; None: as many as the PCI bus shows.
    expected_gpus: int | None = None
    nvml_timeout_s: float = DEFAULT_NVML_TIMEOUT_S
    bench: BenchOptions = field(default_factory=BenchOptions)
