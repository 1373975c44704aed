"""What a check returns: a status per subject, with a summary, a remedy and metric samples."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import field

from nodecheck.checks.record import record


class Status(str, enum.Enum):
    """The outcome of one judgement.

    `skip` means "not applicable on this node"; `error` means "could not
    determine". Neither is a pass.
    """

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    @property
    def severity(self) -> int:
        """Rank for "worst first" ordering: fail > error > warn > ok > skip."""
        return _SEVERITY[self]


_SEVERITY = {Status.SKIP: 0, Status.OK: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}


def worst(statuses: Iterable[Status]) -> Status:
    """The most severe status, `skip` when there is none."""
    return max(statuses, key=lambda s: s.severity, default=Status.SKIP)


NODE = "node"


def gpu_subject(bdf: str) -> str:
    return f"gpu {bdf}"


def bridge_subject(bdf: str) -> str:
    return f"bridge {bdf}"


def nic_subject(name: str) -> str:
    return f"nic {name}"


@record
class MetricSpec:
    """A metric family a check exports: name, Prometheus type, help text, label names."""

    name: str
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...] = ()


@record
class Sample:
    """One value of a metric family, with its label values."""

    metric: MetricSpec
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


@record
class Result:
    """One judgement about one subject (the node, a GPU, a bridge, a NIC)."""

    status: Status
    subject: str
    summary: str
    remedy: str = ""
    details: Mapping[str, object] = field(default_factory=dict)
    samples: tuple[Sample, ...] = ()
