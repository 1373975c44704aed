"""The agent's Kubernetes reporter: node conditions, Events and an opt-in taint.

After each run the daemon hands the reporter its latest results (`update`, which never
blocks); the reporter's own thread talks to the API server, so a slow or hung API server
never delays a check or a scrape.

Conditions, one per class of fault (checks/result.py's FaultClass, each finding's own),
`True` meaning a problem as node-problem-detector's are (its config/kernel-monitor.json;
NVSentinel does the same):
- `True` when a finding of the class fails on the node's own evidence (reason
  `<Check>Failed`, or `SeveralChecksFailed`); a job's failing finding (a variable a user
  set) is a warning, an Event, and never a condition or the taint,
- `Unknown` (reason `CouldNotDetermine`) when none fails but one could not determine
  (`error`), or nothing was judged (no check ran, or all skipped): an error must not
  read as healthy, and absence is no pass (agent/kubernetes/fault_classes.py, class_verdict, the
  verdict `nodecheck npd` gives too),
- `False` (reason `NoFailingCheck`) otherwise; a warning is an Event, not a condition.
The message lists the findings, at most 1,024 characters (NVSentinel's
maxNodeConditionMessageLength). The three are sent by a strategic merge patch of
nodes/status that names only their types, so other conditions are never touched
(conditions merge by type: k8s.io/api core/v1 NodeStatus, +patchMergeKey=type); when a
status or reason changes (a message alone, with its per-run numbers, waits), and all
three every `resend_interval` with the current message (node-problem-detector's
heartbeat, 5 min, pkg/exporters/k8sexporter/condition/manager.go). The API server keeps
what a patch leaves out and computes no transition time, so each condition carries
lastTransitionTime: the node's own when the status is unchanged, now when it changed;
hence no status patch before the node was read once since the start. The first report
after a start sends all three, so a condition left `True` by an agent that stopped
becomes `False` when the fault cleared meanwhile (a log-based NPD condition never
clears: kubernetes/node-problem-detector#215).

Events: a `Warning` Event on the Node, in namespace `default` as the kubelet's node
events are, for each new warn or fail finding (by check, subject and status), again at
most hourly while it stands (a new Event each time: the RBAC allows create only); a
finding that cleared and comes back is new again. involvedObject.uid is the node's name,
what `kubectl describe node` searches by. A refused Event backs off on its own and
delays neither the conditions nor the taint.

Hysteresis, on the agent's monotonic clock (`[kubernetes] taint_after`, `clear_after`):
a fault stands from the first report that sees a failing check until no report has seen
one for `clear_after` (300 s); the taint goes on once the fault has stood `taint_after`
(30 s) and a check fails, and comes off once it no longer stands. A condition turns
worse (False, Unknown, True) at once, and better, or to another reason, once nothing
worse was seen for `clear_after`; until then it keeps its status and reason, its message
saying so. A link that flaps every few seconds is one taint and one change of its
condition, not a write each way every run (Slurm's undrain_after_runs is the same idea).

The taint (`[kubernetes] taint = true`): `nodecheck.io/unhealthy=<class>:NoSchedule` while
a fault stands. Taints are replaced whole (NodeSpec.Taints is +listType=atomic), so each
change is the node's own list read by a fresh GET plus or minus ours, sent with that
GET's resourceVersion, and redone on a 409 Conflict. A taint is its key AND effect (the
API server's identity of one): nodecheck owns `nodecheck.io/unhealthy:NoSchedule` only,
and one with the key and another effect (an admin's NoExecute) is never touched. The
annotation `nodecheck.io/taint` says nodecheck applied it, for which fault (a
fingerprint of the failing findings, and their checks) and which taint it owns: the
taint is removed only when the annotation says it is nodecheck's, and kept while a check
of that fault could not determine (a check of another class that always errors says
nothing of it); it is not rewritten while the fault is the same (an admin's edit of it
stays); one an admin removed is not applied again until the fault changes, and an
`error` run does not forget that (NVSentinel's manual-untaint rule, fault-quarantine; it
once fought admins, NVIDIA/NVSentinel#1424). Other taints and `spec.unschedulable`
(cordon) are never touched.

The taint's circuit breaker (agent/breaker.py): before an untainted node is tainted, the
nodes' metadata is listed (paged, BREAKER_PAGE a page, at most BREAKER_PAGES pages, each
call bounded) and those whose `nodecheck.io/taint` annotation was applied within
`[remediation] breaker_window` are counted; at the cap, or when the list cannot be read
whole, the taint is withheld: logged (`breaker=open`), exported
(nodecheck_remediation_withheld), and decided again at the next report that is due.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from nodecheck.agent.config import (
    DEFAULT_POLICY,
    ConfigError,
    KubernetesSettings,
    RemediationSettings,
)
from nodecheck.agent.findings import Finding
from nodecheck.agent.kubernetes.api import KubeClient, Reply
from nodecheck.agent.kubernetes.fault_classes import (
    CONDITION_TYPES,
    ClassVerdict,
    checks_of,
    class_verdict,
)
from nodecheck.checks.lazy_logging import ERROR, INFO, get_logger
from nodecheck.checks.printable import printable
from nodecheck.checks.record import record
from nodecheck.checks.result import FaultClass, Status

log = get_logger(__name__)

TAINT_KEY = "nodecheck.io/unhealthy"
TAINT_EFFECT = "NoSchedule"
OWNED_TAINT = f"{TAINT_KEY}:{TAINT_EFFECT}"  # what the annotation says nodecheck owns
OWNERSHIP_ANNOTATION = "nodecheck.io/taint"
EVENTS_NAMESPACE = "default"
MESSAGE_MAX = 1024
EVENT_MESSAGE_MAX = 1024
REANNOUNCE_S = 3600.0
CONFLICT_RETRIES = 5
EVENTS_PER_REPORT = 50  # a first report on a broken node: the rest at the next one
RETRY_MAX_S = 60.0
OUR_TYPES = frozenset(CONDITION_TYPES.values())
# The breaker's list of the nodes: this many a page, at most this many pages (20,000
# nodes, past any one cluster's size limit of 5,000: kubernetes.io "Considerations for
# large clusters").
BREAKER_PAGE = 500
BREAKER_PAGES = 40


def camel_case(name: str) -> str:
    """ "gpu_xid" -> "GpuXid": a condition's or Event's reason is CamelCase."""
    return "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").split("_"))


def now_rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


CheckFindings = tuple[str, Sequence[Finding]]


# -- conditions (pure) -------------------------------------------------------------------


@record
class ConditionState:
    type: str
    status: str  # "True" (a problem), "False", "Unknown"
    reason: str
    message: str


def listed(parts: Sequence[str], limit: int = MESSAGE_MAX) -> str:
    """The parts joined by "; ", at most `limit` characters: the parts that fit, then
    "(+N more)" saying how many were left out (a first part too long alone is cut, "…")."""
    kept: list[str] = []
    for index, part in enumerate(parts):
        rest = len(parts) - index - 1
        tail = f"; (+{rest} more)" if rest else ""
        if len("; ".join([*kept, part])) + len(tail) <= limit:
            kept.append(part)
            continue
        if not kept:
            more = f" (+{rest} more)" if rest else ""
            return part[: limit - len(more) - 1] + "…" + more
        # The previous round made room for exactly this tail.
        return "; ".join(kept) + f"; (+{len(parts) - index} more)"
    return "; ".join(kept)


def _finding_text(finding: Finding) -> str:
    """A finding as a condition's or an event's message says it, escaped (checks/printable.py):
    `kubectl describe node` and `kubectl get events` show it on a terminal."""
    return printable(finding.line())


def judge_classes(checks: Iterable[CheckFindings]) -> list[ConditionState]:
    """One condition per class from the checks' latest findings, each finding under its
    own class (agent/findings.py). A job's failing finding counts as a warning: a
    condition True keeps the node from scheduling, and nothing a job's user sets does."""
    by_class: dict[FaultClass, list[Finding]] = {cls: [] for cls in FaultClass}
    ran: dict[FaultClass, list[str]] = {cls: [] for cls in FaultClass}
    for check, findings in checks:
        for finding in findings:
            by_class[finding.fault_class].append(finding)
            if check not in ran[finding.fault_class]:
                ran[finding.fault_class].append(check)
    states = []
    for cls in FaultClass:
        findings = by_class[cls]
        fails = [f for f in findings if f.node_failing]
        errors = [f for f in findings if f.status is Status.ERROR]
        warns = [f for f in findings if f.status_against_node is Status.WARN]
        condition = CONDITION_TYPES[cls]
        # The verdict `nodecheck npd` gives the class too (agent/kubernetes/fault_classes.py).
        verdict = class_verdict(f.status_against_node for f in findings)
        if verdict is ClassVerdict.FAILING:
            failing = sorted({f.check for f in fails})
            reason = (
                f"{camel_case(failing[0])}Failed" if len(failing) == 1 else "SeveralChecksFailed"
            )
            texts = [_finding_text(f) for f in fails] + [_finding_text(f) for f in errors]
            states.append(ConditionState(condition, "True", reason, listed(texts)))
        elif verdict is ClassVerdict.UNDETERMINED:
            names = ", ".join(sorted(ran[cls]))
            nothing = f"nothing judged: {names} skipped" if ran[cls] else ""
            texts = [_finding_text(f) for f in errors] or [
                nothing or f"no check of class {cls.value} ran"
            ]
            states.append(ConditionState(condition, "Unknown", "CouldNotDetermine", listed(texts)))
        else:
            names = ", ".join(sorted(ran[cls]))
            note = f"; {len(warns)} warning(s), reported as events" if warns else ""
            message = listed([f"no failing check ({names}){note}"])
            states.append(ConditionState(condition, "False", "NoFailingCheck", message))
    return states


def condition_patch(
    states: Sequence[ConditionState], on_node: Mapping[str, Mapping[str, Any]], now: str
) -> dict[str, Any]:
    """The strategic merge patch of nodes/status for `states`: only our types, each with
    lastTransitionTime kept from the node's condition of that type when its status is
    unchanged (`on_node`: type -> that condition as the node has it) and now otherwise."""
    conditions = []
    for state in states:
        previous = on_node.get(state.type, {})
        unchanged = previous.get("status") == state.status and previous.get("lastTransitionTime")
        conditions.append(
            {
                "type": state.type,
                "status": state.status,
                "reason": state.reason,
                "message": state.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": previous["lastTransitionTime"] if unchanged else now,
            }
        )
    return {"status": {"conditions": conditions}}


# -- the taint (pure) --------------------------------------------------------------------


@record
class Fault:
    """The failing findings as the taint sees them: the class its value names (the first
    failing one, in FaultClass order), their fingerprint and the checks they are of."""

    fault_class: FaultClass
    fingerprint: str
    checks: tuple[str, ...] = ()


def fault_of(
    checks: Iterable[CheckFindings], policy: RemediationSettings = DEFAULT_POLICY
) -> Fault | None:
    fails: list[tuple[FaultClass, str, str]] = []
    for check, findings in checks:
        # Only what takes the node out of service taints it ([remediation], the same as
        # Slurm's drain): the node's own evidence of a GPU fault, never its configuration
        # or a job's variable, which the conditions and Events report.
        fails += [
            (f.fault_class, check, f.subject) for f in findings if policy.takes_out_of_service(f)
        ]
    if not fails:
        return None
    order = list(FaultClass)
    first = min(fails, key=lambda fail: order.index(fail[0]))[0]
    digest = hashlib.sha256("\n".join(sorted(f"{c}\0{s}" for _, c, s in fails)).encode())
    return Fault(first, digest.hexdigest()[:16], tuple(sorted({c for _, c, _ in fails})))


def undetermined_checks(checks: Iterable[CheckFindings]) -> frozenset[str]:
    """The checks that could not determine (an `error` finding) in this run."""
    return frozenset(
        check for check, findings in checks if any(f.status is Status.ERROR for f in findings)
    )


@record
class TaintPlan:
    """What to write to the node: its new taints (None: leave them), the ownership
    annotation's new value (None: leave it; "" delete it), and why, for the log."""

    taints: list[dict[str, Any]] | None
    annotation: str | None
    action: str  # applied, removed, left_alone, forgotten, nothing
    why: str

    @property
    def writes(self) -> bool:
        return self.taints is not None or self.annotation is not None


def _ownership(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ownership annotation's record, or None (absent or not ours to read)."""
    metadata = node.get("metadata") or {}
    value = (metadata.get("annotations") or {}).get(OWNERSHIP_ANNOTATION)
    if not isinstance(value, str):
        return None
    try:
        owned = json.loads(value)
    except ValueError:
        return None
    return owned if isinstance(owned, dict) and isinstance(owned.get("fingerprint"), str) else None


def is_owned_taint(taint: Mapping[str, Any]) -> bool:
    """The taint nodecheck owns: its key with effect NoSchedule. A taint with the key and
    another effect (an admin's NoExecute) is never nodecheck's: left as it is."""
    return taint.get("key") == TAINT_KEY and taint.get("effect") == TAINT_EFFECT


def _blocking_checks(owned: Mapping[str, Any]) -> frozenset[str] | None:
    """The checks whose `error` keeps nodecheck's taint: those of the tainted fault, as
    the annotation names them, else those of its class; None when it names neither."""
    checks = owned.get("checks")
    if isinstance(checks, list) and checks and all(isinstance(c, str) for c in checks):
        return frozenset(checks)
    try:
        return frozenset(checks_of(FaultClass(owned.get("class"))))
    except ValueError:
        return None


def _unsure_of(owned: Mapping[str, Any], undetermined: frozenset[str]) -> bool:
    """Whether the tainted fault may still stand: one of its checks could not determine.
    A check of another class that always errors (pcie_acs unprivileged, behind a PCIe
    switch) says nothing of it, and must not keep the taint forever."""
    blocking = _blocking_checks(owned)
    return bool(undetermined) if blocking is None else bool(blocking & undetermined)


def plan_taint(
    node: Mapping[str, Any],
    fault: Fault | None,
    enabled: bool,
    undetermined: frozenset[str],
    now: str,
) -> TaintPlan:
    """The taint decision, a pure function of the node as just read, the current fault,
    whether tainting is on and which checks could not determine in this run."""
    spec = node.get("spec") or {}
    taints = [t for t in (spec.get("taints") or []) if isinstance(t, dict)]
    ours = [t for t in taints if is_owned_taint(t)]
    others = [t for t in taints if not is_owned_taint(t)]
    owned = _ownership(node)
    if fault is None or not enabled:
        if owned is None:
            why = "a taint with nodecheck's key that nodecheck did not apply" if ours else ""
            return TaintPlan(None, None, "left_alone" if ours else "nothing", why)
        if fault is None and _unsure_of(owned, undetermined):
            # Kept, and so is the annotation when an admin removed the taint: forgetting
            # it on one `error` run would apply the taint again at the next `fail`.
            why = "no check fails, but one of the tainted fault's could not determine"
            return TaintPlan(None, None, "nothing", why)
        if not ours:  # ours was removed by someone: forget it
            return TaintPlan(None, "", "forgotten", "no fault now; the taint was gone")
        why = "the fault cleared" if fault is None else "tainting was turned off"
        return TaintPlan(others, "", "removed", why)
    wanted = {"key": TAINT_KEY, "value": fault.fault_class.value, "effect": TAINT_EFFECT}
    if ours:
        if owned is None:
            return TaintPlan(None, None, "left_alone", "someone else's taint with nodecheck's key")
        if owned["fingerprint"] == fault.fingerprint:
            # As it stands on the node: an admin's edit of it (its value) is not reverted.
            return TaintPlan(None, None, "nothing", "applied already")
        record_ = _ownership_value(fault, now)
        return TaintPlan([*others, wanted], record_, "applied", "the fault changed")
    if owned is not None and owned["fingerprint"] == fault.fingerprint:
        return TaintPlan(
            None, None, "left_alone", "removed by someone else for this fault: not applied again"
        )
    return TaintPlan([*taints, wanted], _ownership_value(fault, now), "applied", "a check fails")


def _ownership_value(fault: Fault, now: str) -> str:
    return json.dumps(
        {
            "fingerprint": fault.fingerprint,
            "class": fault.fault_class.value,
            "checks": list(fault.checks),
            "taint": OWNED_TAINT,
            "applied_at": now,
        },
        separators=(",", ":"),
    )


def _applied_at(owned: Mapping[str, Any]) -> float:
    """When nodecheck applied the taint an ownership record names (seconds since the
    epoch, now_rfc3339's form). One that cannot be read counts as just now: the breaker
    errs towards holding back."""
    try:
        stamp = datetime.strptime(owned["applied_at"], "%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, KeyError, TypeError):
        return float("inf")
    return stamp.replace(tzinfo=timezone.utc).timestamp()


def tainted_recently(items: Iterable[Any], now: float, window_s: float, node: str) -> int:
    """Of a node list's items (whole Nodes or their metadata), those nodecheck tainted
    within `window_s` of `now`, but `node` (the one about to be tainted: its own earlier
    taint is no other node's)."""
    count = 0
    for item in items:
        if not isinstance(item, dict) or (item.get("metadata") or {}).get("name") == node:
            continue
        owned = _ownership(item)
        if owned is not None and now - _applied_at(owned) <= window_s:
            count += 1
    return count


def taint_patch(node: Mapping[str, Any], plan: TaintPlan) -> dict[str, Any]:
    """A JSON merge patch of the node carrying its resourceVersion: the API server then
    refuses it with 409 if the node changed since it was read."""
    metadata: dict[str, Any] = {
        "resourceVersion": (node.get("metadata") or {}).get("resourceVersion")
    }
    patch: dict[str, Any] = {"metadata": metadata}
    if plan.annotation is not None:
        metadata["annotations"] = {OWNERSHIP_ANNOTATION: plan.annotation or None}
    if plan.taints is not None:
        patch["spec"] = {"taints": plan.taints}
    return patch


# -- hysteresis (pure but for the clock given) -------------------------------------------


class TaintStep(enum.Enum):
    APPLY = "apply"  # the fault has stood long enough: the taint for it
    CLEAR = "clear"  # no fault for long enough: the taint comes off
    HOLD = "hold"  # either is still pending: the taint stays as it is


class FaultHold:
    """When the taint follows the fault: APPLY once a fault has stood `taint_after_s`
    (and one is seen now), CLEAR once none was seen for `clear_after_s`, HOLD between.
    A fault stands from its first sighting until it has been clear for `clear_after_s`:
    a fault that flaps keeps standing, so it is tainted once and stays tainted. After a
    start, a taint left by the agent before is removed only once clear for
    `clear_after_s`, and kept while a fault pends."""

    def __init__(self, taint_after_s: float, clear_after_s: float) -> None:
        self.taint_after_s, self.clear_after_s = taint_after_s, clear_after_s
        self._since: float | None = None  # the standing fault's first sighting
        self._clear_since: float | None = None  # the first report without a fault
        self._cleared = False  # CLEAR given since a fault was last seen
        self._applied = False  # APPLY given since the fault began to stand

    def observe(self, fault: Fault | None, now: float) -> TaintStep:
        if fault is not None:
            self._clear_since, self._cleared = None, False
            if self._since is None:
                self._since = now
            if now - self._since >= self.taint_after_s:
                self._applied = True
                return TaintStep.APPLY
            return TaintStep.HOLD
        if self._clear_since is None:
            self._clear_since = now
        if now - self._clear_since >= self.clear_after_s:
            self._since, self._cleared, self._applied = None, True, False
            return TaintStep.CLEAR
        return TaintStep.HOLD

    def due_at(self) -> float | None:
        """When a pending step falls due with no news (None: nothing pends)."""
        if self._clear_since is not None:
            return None if self._cleared else self._clear_since + self.clear_after_s
        if self._since is None or self._applied:
            return None
        return self._since + self.taint_after_s


_WORSE = {"False": 0, "Unknown": 1, "True": 2}


class ConditionHold:
    """What each condition says: a worse status than the one reported goes out at once;
    a better one, or another reason, once nothing worse than it was seen for
    `clear_after_s` (the held status and reason stay, the message says why)."""

    def __init__(self, clear_after_s: float) -> None:
        self.clear_after_s = clear_after_s
        self._reported: dict[str, ConditionState] = {}
        self._better_since: dict[str, float] = {}

    def observe(self, states: Sequence[ConditionState], now: float) -> list[ConditionState]:
        shown = []
        for state in states:
            held = self._reported.get(state.type)
            if held is None or (
                _WORSE.get(state.status, 2) > _WORSE.get(held.status, 2)
                or (state.status, state.reason) == (held.status, held.reason)
            ):
                self._reported[state.type] = state
                self._better_since.pop(state.type, None)
                shown.append(state)
                continue
            since = self._better_since.setdefault(state.type, now)
            if now - since >= self.clear_after_s:
                self._reported[state.type] = state
                del self._better_since[state.type]
                shown.append(state)
                continue
            note = (
                f"now {state.status} ({state.reason}) for {now - since:.0f} s: "
                f"{held.status} until {self.clear_after_s:g} s without it; was: {held.message}"
            )
            shown.append(ConditionState(held.type, held.status, held.reason, listed([note])))
        return shown

    def due_at(self) -> float | None:
        """When a held condition may turn better with no news (None: none is held)."""
        if not self._better_since:
            return None
        return min(self._better_since.values()) + self.clear_after_s


# -- events (pure but for the clock given) -----------------------------------------------


class EventMemory:
    """Which warn and fail findings were announced, and when: one Event per new finding,
    again at most every `reannounce_s` while it stands."""

    def __init__(self, reannounce_s: float = REANNOUNCE_S) -> None:
        self.reannounce_s = reannounce_s
        self.announced: dict[tuple[str, str, str], float] = {}

    def due(self, checks: Iterable[CheckFindings], now: float) -> list[Finding]:
        current: dict[tuple[str, str, str], Finding] = {}
        for _, findings in checks:
            for finding in findings:
                if finding.status in (Status.WARN, Status.FAIL):
                    current.setdefault(
                        (finding.check, finding.subject, finding.status.value), finding
                    )
        for key in set(self.announced) - set(current):
            del self.announced[key]  # cleared: announced again if it comes back
        return [
            finding
            for key, finding in sorted(current.items())
            if now - self.announced.get(key, -self.reannounce_s - 1) >= self.reannounce_s
        ]

    def sent(self, finding: Finding, now: float) -> None:
        self.announced[(finding.check, finding.subject, finding.status.value)] = now


def event_body(finding: Finding, node: str, now: str) -> dict[str, Any]:
    """A core/v1 Event on the Node, as the kubelet writes node events: involvedObject of
    kind Node whose uid is the node's NAME, in namespace default. `kubectl describe node`
    looks its events up by that uid (kubectl pkg/describe/describe.go, NodeDescriber:
    `ref.UID = types.UID(ref.Name)`), and the kubelet's and node-problem-detector's node
    recorders write it so; an Event with the Node's real uid is never shown there."""
    # A job's failing finding is a warning about the node (Finding.status_against_node).
    suffix = "Failed" if finding.status_against_node is Status.FAIL else "Warning"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.nodecheck.", "namespace": EVENTS_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "type": "Warning",
        "reason": f"{camel_case(finding.check)}{suffix}",
        "message": listed([_finding_text(finding)], EVENT_MESSAGE_MAX),
        "source": {"component": "nodecheck", "host": node},
        "reportingComponent": "nodecheck",
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


# -- the reporter ------------------------------------------------------------------------


def _verdicts(states: Sequence[ConditionState]) -> list[tuple[str, str, str]]:
    """What a condition says, its message aside: a change of it is a report."""
    return [(state.type, state.status, state.reason) for state in states]


def api_server_of(settings: KubernetesSettings, environ: Mapping[str, str]) -> str | None:
    if settings.api_server:
        return settings.api_server
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class KubernetesReporter:
    """Reports the latest results to the API server from its own thread."""

    def __init__(
        self,
        settings: KubernetesSettings,
        node: str,
        client: KubeClient,
        clock: Callable[[], float] = time.monotonic,
        policy: RemediationSettings = DEFAULT_POLICY,
    ) -> None:
        self.settings, self.node, self.client = settings, node, client
        self.policy = policy  # what the taint is for, and whether it is only said
        self._clock = clock  # monotonic: the holds, the heartbeat, the retries
        self._lock = threading.Lock()
        self._latest: Sequence[CheckFindings] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sent: list[ConditionState] | None = None  # None: nothing sent since the start
        self._sent_at = 0.0
        self._sent_conditions: dict[str, dict[str, Any]] = {}
        self._fault_hold = FaultHold(settings.taint_after_s, settings.clear_after_s)
        self._condition_hold = ConditionHold(settings.clear_after_s)
        self._taint_seen: tuple[TaintStep, Fault | None, frozenset[str]] | None = None
        self._events = EventMemory()
        self._retry_at = 0.0
        self._backoff = 1.0
        # Events back off on their own: a refused Event (403 when the RBAC lacks it)
        # delays neither the conditions nor the taint, and re-reads no node.
        self._events_retry_at = 0.0
        self._events_backoff = 1.0
        self._problems: dict[str, str] = {}
        self.reports = 0
        # Whether the last taint decision was a taint the circuit breaker held back.
        self.withheld = False

    @classmethod
    def from_settings(
        cls,
        settings: KubernetesSettings,
        environ: Mapping[str, str],
        policy: RemediationSettings = DEFAULT_POLICY,
    ) -> KubernetesReporter:
        """ConfigError when the node or the API server cannot be named."""
        node = settings.node_name or environ.get("NODE_NAME", "")
        if not node:
            raise ConfigError(
                "[kubernetes]",
                None,
                "node_name",
                "not set, and NODE_NAME is not in the "
                "environment (the DaemonSet sets it from the downward API's spec.nodeName)",
            )
        server = api_server_of(settings, environ)
        if server is None:
            raise ConfigError(
                "[kubernetes]",
                None,
                "api_server",
                "not set, and KUBERNETES_SERVICE_HOST "
                "and KUBERNETES_SERVICE_PORT are not in the environment (not in a pod?)",
            )
        client = KubeClient(
            server,
            settings.token_file,
            settings.ca_file,
            settings.timeout_s,
            settings.token_reread_s,
        )
        return cls(settings, node, client, policy=policy)

    @classmethod
    def from_environment(
        cls, settings: KubernetesSettings, policy: RemediationSettings = DEFAULT_POLICY
    ) -> KubernetesReporter:
        # NODE_NAME and the KUBERNETES_SERVICE_* variables are read, never logged (no log
        # line names the node: the pod's log is the node's already).
        return cls.from_settings(settings, os.environ, policy)

    # -- called by the daemon ------------------------------------------------------

    def update(self, checks: Sequence[CheckFindings]) -> None:
        """The latest findings of every enabled check; never blocks."""
        with self._lock:
            self._latest = checks
        self._wake.set()

    def start(self) -> None:
        log.info("event=kubernetes_reporting taint=%s", self.settings.taint)
        self._thread = threading.Thread(target=self._loop, name="kubernetes-reporter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # -- the thread ------------------------------------------------------------------

    def _wait(self) -> float | None:
        """Seconds until the next report is due without news: None before the first
        results; until the retry while calls fail; else until the heartbeat, or a held
        taint or condition falling due."""
        with self._lock:
            if self._latest is None:
                return None
        now = self._clock()
        if self._retry_at:
            return max(0.0, self._retry_at - now)
        due = [self._sent_at + self.settings.resend_interval_s]
        holds = (self._fault_hold.due_at(), self._condition_hold.due_at())
        due += [at for at in holds if at is not None]
        return max(0.0, min(due) - now)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._wait())
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                latest = self._latest
            if latest is None or (self._retry_at and self._clock() < self._retry_at):
                continue  # news while calls fail waits for the retry, which sends the latest
            try:
                complete = self.report_once(latest)
            except Exception as err:  # this thread must outlive anything a report meets
                log.error("event=kubernetes_report_failed error=%r", f"{type(err).__name__}: {err}")
                complete = False
            if complete:
                self._retry_at, self._backoff = 0.0, 1.0
            else:
                self._retry_at = self._clock() + self._backoff
                self._backoff = min(self._backoff * 2, RETRY_MAX_S)

    def report_once(self, checks: Sequence[CheckFindings]) -> bool:
        """One report; True when every call it needed for the conditions and the taint
        succeeded (an Event refused is retried on its own, later)."""
        now = self._clock()
        states = self._condition_hold.observe(judge_classes(checks), now)
        fault, unsure = fault_of(checks, self.policy), undetermined_checks(checks)
        # Tainting off: no hold, any taint of ours is removed (plan_taint).
        step = self._fault_hold.observe(fault, now) if self.settings.taint else TaintStep.APPLY
        taint_fault = fault if step is TaintStep.APPLY else None
        heartbeat_due = now - self._sent_at >= self.settings.resend_interval_s
        # On a change of status or reason: a message with per-run numbers in it would
        # patch a standing condition every run. The heartbeat sends the current message.
        conditions_due = (
            self._sent is None or _verdicts(states) != _verdicts(self._sent) or heartbeat_due
        )
        taint_due = step is not TaintStep.HOLD and (
            (step, taint_fault, unsure) != self._taint_seen or heartbeat_due
        )
        complete = True
        if conditions_due or taint_due:
            reply = self.client.get_node(self.node)
            node = reply.body if reply.ok else None
            complete &= self._outcome("get_node", reply)
            if conditions_due and node is None and not self._sent_conditions:
                # Neither the node read nor anything sent since the start: a patch now
                # would carry lastTransitionTime = now for every condition, a transition
                # that never happened. Wait for a read.
                complete = False
            elif conditions_due:
                sent, after = self._send_conditions(states, node)
                complete &= sent
                # The status patch bumped the node's resourceVersion: its answer is the node now.
                node = after if after is not None else None
            if taint_due:
                done = self._taint(node, taint_fault, unsure)
                if done:
                    self._taint_seen = (step, taint_fault, unsure)
                complete &= done
        if self.settings.events and self._clock() >= self._events_retry_at:
            self._send_events(checks)
        self.reports += 1
        return complete

    def _send_events(self, checks: Sequence[CheckFindings]) -> None:
        for finding in self._events.due(checks, time.time())[:EVENTS_PER_REPORT]:
            stamp = now_rfc3339(time.time())
            reply = self.client.create_event(
                EVENTS_NAMESPACE, event_body(finding, self.node, stamp)
            )
            if not self._outcome("create_event", reply):
                self._events_retry_at = self._clock() + self._events_backoff
                self._events_backoff = min(self._events_backoff * 2, RETRY_MAX_S)
                return
            self._events.sent(finding, time.time())
        self._events_backoff = 1.0

    def _send_conditions(
        self, states: list[ConditionState], node: dict[str, Any] | None
    ) -> tuple[bool, dict[str, Any] | None]:
        """Whether the patch was taken, and the node as it answered (None: read it again)."""
        on_node: dict[str, dict[str, Any]] = {}
        if node is not None:
            for condition in (node.get("status") or {}).get("conditions") or []:
                if isinstance(condition, dict) and condition.get("type") in OUR_TYPES:
                    on_node[str(condition["type"])] = condition
        else:
            # No fresh read: what was sent last stands for the node's.
            on_node = dict(self._sent_conditions)
        patch = condition_patch(states, on_node, now_rfc3339(time.time()))
        reply = self.client.patch_node_status(self.node, patch)
        if not self._outcome("patch_node_status", reply):
            return False, None
        if self._sent is None or _verdicts(self._sent) != _verdicts(states):
            log.info(
                "event=kubernetes_conditions %s",
                " ".join(f"{s.type}={s.status}:{s.reason}" for s in states),
            )
        self._sent, self._sent_at = states, self._clock()
        self._sent_conditions = {c["type"]: c for c in patch["status"]["conditions"]}
        return True, reply.body if reply.body and "metadata" in reply.body else None

    def _taint(
        self, node: dict[str, Any] | None, fault: Fault | None, unsure: frozenset[str]
    ) -> bool:
        """The taint and its annotation brought in line with the fault; read-modify-write
        with the node's resourceVersion, again from a fresh read on 409."""
        for attempt in range(CONFLICT_RETRIES):
            if node is None:
                reply = self.client.get_node(self.node)
                if not self._outcome("get_node", reply):
                    return False
                node = reply.body or {}
            plan = plan_taint(node, fault, self.settings.taint, unsure, now_rfc3339(time.time()))
            if not plan.writes:
                if plan.action == "left_alone":
                    self._note("taint", f"left alone: {plan.why}", INFO)
                self.withheld = False
                return True
            taints = (node.get("spec") or {}).get("taints") or []
            entering = plan.action == "applied" and not any(
                is_owned_taint(t) for t in taints if isinstance(t, dict)
            )
            held = self._breaker_holds() if entering else ""
            self.withheld = bool(held)
            if held:
                log.warning(
                    "event=kubernetes_taint action=withheld breaker=open fault=%s why=%r held=%r",
                    fault.fault_class.value if fault else "none",
                    plan.why,
                    held,
                )
                return True
            if self.policy.dry_run:
                log.info(
                    "event=kubernetes_taint action=%s fault=%s why=%r dry_run=true "
                    "(would write; [remediation] dry_run)",
                    plan.action,
                    fault.fault_class.value if fault else "none",
                    plan.why,
                )
                return True
            reply = self.client.patch_node(self.node, taint_patch(node, plan))
            if reply.status == 409:
                log.info("event=kubernetes_conflict attempt=%d", attempt + 1)
                node = None
                continue
            if not self._outcome("patch_node", reply):
                return False
            self._problems.pop("taint", None)
            log.info(
                "event=kubernetes_taint action=%s fault=%s why=%r",
                plan.action,
                fault.fault_class.value if fault else "none",
                plan.why,
            )
            return True
        self._note("patch_node", f"still conflicting after {CONFLICT_RETRIES} tries", ERROR)
        return False

    def _breaker_holds(self) -> str:
        """Why the circuit breaker holds a new taint back ("" when it lets it through):
        open, or the nodes not read whole (it cannot tell)."""
        from nodecheck.agent.breaker import breaker_reading

        now = time.time()
        nodes, recent, token = 0, 0, ""
        for _ in range(BREAKER_PAGES):
            reply = self.client.list_nodes_metadata(BREAKER_PAGE, token)
            if not self._outcome("list_nodes", reply):
                return f"the nodes could not be read for the circuit breaker ({reply.describe()})"
            items = (reply.body or {}).get("items") or []
            nodes += len(items)
            recent += tainted_recently(items, now, self.policy.breaker_window_s, self.node)
            token = str(((reply.body or {}).get("metadata") or {}).get("continue") or "")
            if not token:
                break
        else:
            counted = BREAKER_PAGE * BREAKER_PAGES
            return f"more than {counted} nodes: the circuit breaker cannot count them"
        reading = breaker_reading(recent, nodes, self.policy)
        return reading.says(self.policy.breaker_window_s, "tainted") if reading.open else ""

    def _outcome(self, call: str, reply: Reply) -> bool:
        """Log a call's failure once while it lasts, and its recovery."""
        if reply.ok:
            if self._problems.pop(call, None) is not None:
                log.info("event=kubernetes_call_recovered call=%s", call)
            return True
        self._note(call, reply.describe(), ERROR)
        return False

    def _note(self, call: str, problem: str, level: int) -> None:
        if self._problems.get(call) != problem:
            self._problems[call] = problem
            event = "kubernetes_call_failed" if level >= ERROR else "kubernetes_note"
            log.log(level, "event=%s call=%s error=%r", event, call, problem)
