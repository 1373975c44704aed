"""Prometheus exposition of the cached results: a collector (served by agent/web/server.py)
and a textfile.

Built from the ResultStore (the prometheus_client custom-collector pattern): a
scrape never runs a check, and one check's odd sample never fails the scrape:
it is left out, logged once and counted in nodecheck_exposition_dropped_samples.
Whatever the checks or the root snapshot hand in, the exposition stays valid for
Prometheus and clean for `promtool check metrics`.
"""

from __future__ import annotations

import math
import platform
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import cast

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from nodecheck.agent.daemon.results_file import ResultsWrites
from nodecheck.agent.daemon.scheduler import ResultStore
from nodecheck.agent.findings import findings_of_check, fold
from nodecheck.checks.lazy_logging import get_logger
from nodecheck.checks.node.output import write_output
from nodecheck.checks.result import MetricSpec, Origin, Result, Sample, Status, worst

log = get_logger(__name__)
STATUSES = [status.value for status in Status]
TEXTFILE_NAME = "nodecheck.prom"

# -- what a sample must be to reach the exposition ----------------------------------

# The families the agent exports itself: a check's (or the snapshot's) family of the
# same name would make a second HELP/TYPE block, which Prometheus's text parser
# rejects for the whole scrape.
OWN_FAMILIES = frozenset(
    {
        "nodecheck_check_status",
        "nodecheck_check_verdict",
        "nodecheck_check_run_success",
        "nodecheck_check_duration_seconds",
        "nodecheck_check_last_run_timestamp_seconds",
        "nodecheck_check_interval_seconds",
        "nodecheck_build_info",
        "nodecheck_node_info",
        "nodecheck_config_last_reload_successful",
        "nodecheck_exposition_dropped_samples",
        "nodecheck_checks_failing",
        "nodecheck_agent_start_time_seconds",
        "nodecheck_results_last_write_successful",
        "nodecheck_results_write_failures_total",
        "nodecheck_remediation_withheld",
    }
)
METRIC_NAME = re.compile(r"nodecheck_[a-z0-9_]+")  # the project's convention, a subset of
# Prometheus's [a-zA-Z_:][a-zA-Z0-9_:]* without the camelCase and ':' promtool flags
LABEL_NAME = re.compile(r"[a-z_][a-z0-9_]*")  # Prometheus's [a-zA-Z_][a-zA-Z0-9_]*, snake_case
# promtool check metrics (prometheus/client_golang testutil/promlint, as in
# prometheus/prometheus util/promlint/promlint.go): reserved suffixes and labels, the
# type in the name, abbreviated and non-base units; plus the project's own unit list.
RESERVED_SUFFIXES = ("_bucket", "_count", "_sum")
RESERVED_LABELS = frozenset({"le", "quantile"})
TYPE_WORDS = ("counter", "gauge", "histogram", "summary", "gauge_histogram")
ABBREVIATED_UNITS = ("s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d")
NON_BASE_UNITS = frozenset(
    {"minutes", "hours", "days", "fahrenheit", "rankine", "inches", "yards", "miles", "bits"}
    | {"calories", "pounds", "ounces", "percent", "pct", "mhz", "gbps", "tflops", "mw"}
)
BASE_UNITS = (
    "amperes",
    "bytes",
    "candela",
    "grams",
    "celsius",
    "kelvin",
    "kelvins",
    "meters",
    "metres",
    "moles",
    "seconds",
    "joules",
)
UNIT_PREFIXES = (
    "pico",
    "nano",
    "micro",
    "milli",
    "centi",
    "deci",
    "deca",
    "hecto",
    "kilo",
    "kibi",
    "mega",
    "mibi",
    "giga",
    "gibi",
    "tera",
    "tebi",
    "peta",
    "pebi",
)


def _text_problem(text: object, what: str) -> str | None:
    if not isinstance(text, str):
        return f"{what} is a {type(text).__name__}, not a string"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} is not valid UTF-8"
    return None


def _name_problem(name: str, kind: str) -> str | None:
    if not METRIC_NAME.fullmatch(name):
        return "not a nodecheck_ snake_case metric name"
    if name.endswith("_total") != (kind == "counter"):
        return "counters and only counters end in _total"
    if name.endswith(RESERVED_SUFFIXES):
        return "a histogram or summary suffix"
    lowered = f"{name}_"
    if any(f"_{word}_" in lowered for word in TYPE_WORDS):
        return "the metric type in its name"
    words = name.split("_")
    if any(word in ABBREVIATED_UNITS for word in words[1:]):
        return "an abbreviated unit"
    for word in words:
        if word in NON_BASE_UNITS:
            return f"a non-base unit ({word})"
        for prefix in UNIT_PREFIXES:
            if word.startswith(prefix) and word[len(prefix) :] in BASE_UNITS + tuple(
                NON_BASE_UNITS
            ):
                return f"a prefixed unit ({word})"
    return None


def spec_problem(spec: object) -> str | None:
    """Why a check's metric family cannot be exported, or None."""
    if not isinstance(spec, MetricSpec):
        return f"the metric is a {type(spec).__name__}, not a MetricSpec"
    if spec.kind not in ("gauge", "counter"):
        return f"type {spec.kind!r} is neither gauge nor counter"
    problem = _text_problem(spec.name, "the name") or _text_problem(spec.help, "the help text")
    if problem is None:
        problem = _name_problem(spec.name, spec.kind)
    if problem is None and not spec.help.strip():
        problem = "no help text"
    if problem is None and not isinstance(spec.labels, tuple):
        problem = "label names are not a tuple"
    if problem is not None:
        return problem
    for label in spec.labels:
        if not isinstance(label, str) or not LABEL_NAME.fullmatch(label):
            return f"label name {label!r} breaks Prometheus's label name rules"
        if label.startswith("__") or label in RESERVED_LABELS:
            return f"label name {label!r} is reserved"
    if len(set(spec.labels)) != len(spec.labels):
        return "a label name repeated"
    return None


def sample_values(sample: object) -> tuple[tuple[str, ...], float] | str:
    """(label values in the family's order, value), or why the sample cannot be exported."""
    if not isinstance(sample, Sample):
        return f"a {type(sample).__name__}, not a Sample"
    spec = sample.metric
    value = sample.value
    # NaN and the infinities are valid Prometheus values (a bool is an int: 0 or 1);
    # strings and None are not, and prometheus_client fails the whole rendering on them.
    if not isinstance(value, (int, float)):
        return f"the value is a {type(value).__name__}, not a number"
    try:
        number = float(value)
    except OverflowError:
        return "value too large for a float"
    labels = sample.labels
    if not isinstance(labels, Mapping):
        return "labels are not a mapping"
    if set(labels) - set(spec.labels):
        return f"labels {sorted(map(str, set(labels) - set(spec.labels)))} not declared"
    values: list[str] = []
    for name in spec.labels:
        text = labels.get(name, "")
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            text = str(text)  # a GPU index given as a number
        problem = _text_problem(text, f"label {name}")
        if problem is not None:
            return problem
        values.append(text)
    if spec.kind == "counter" and not (number >= 0 or math.isnan(number)):
        return "a negative counter"
    return tuple(values), number


def _label_value(text: str) -> str:
    """A label value from our own results (check names, subjects): never dropped, made
    encodable instead (a subject from a damaged snapshot)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ResultCollector(Collector):
    def __init__(
        self,
        store: ResultStore,
        version: str,
        reload_ok: Callable[[], bool],
        node_labels: Callable[[], Mapping[str, str]] = dict,
        started_at: float | None = None,
        results_writes: Callable[[], ResultsWrites | None] = lambda: None,
        remediation_withheld: Callable[[], Mapping[str, bool]] = dict,
    ) -> None:
        """`node_labels`: the configuration's [labels] now (a reload changes them);
        `started_at`: when the agent started (wall clock), else when this was made;
        `results_writes`: how writing the results file goes (None: there is none);
        `remediation_withheld`: by integration, whether the circuit breaker holds back
        taking the node out of service."""
        self.store = store
        self.version = version
        self.reload_ok = reload_ok
        self.node_labels = node_labels
        self.results_writes = results_writes
        self.remediation_withheld = remediation_withheld
        self.started_at = time.time() if started_at is None else started_at
        # (check, metric, reason) already logged: a bad sample comes back on every
        # render of the exposition, its log line once (bounded, for a sample whose
        # labels change every run).
        self._logged: set[tuple[str, str, str]] = set()
        self._logged_lock = threading.Lock()

    def _dropped(self, check: str, metric: str, reason: str, counts: dict[str, int]) -> None:
        counts[check] = counts.get(check, 0) + 1
        key = (check, metric, reason)
        with self._logged_lock:
            if key in self._logged:
                return
            if len(self._logged) >= 1000:
                self._logged.clear()
            self._logged.add(key)
        log.warning("event=sample_dropped check=%s metric=%r reason=%r", check, metric, reason)

    def collect(self) -> Iterator[Metric]:
        runs = self.store.all()
        status = GaugeMetricFamily(
            "nodecheck_check_status",
            "1 for the status of the latest result of this check on this subject",
            labels=["check", "subject", "status"],
        )
        # What each subject's latest finding means, as the check declared it or the result
        # set it (agent/findings.py): what the alert rules read instead of re-judging a
        # threshold. One series per check, subject and origin, value 1: the node's own
        # findings apart from a job's, so a job's failure on a subject never hides the
        # node's (or stands in for it) where the alerts page on origin="node".
        verdict = GaugeMetricFamily(
            "nodecheck_check_verdict",
            "1 for the latest finding of this check on this subject from the node's or a "
            "job's evidence (origin): its status, fault class and the action it asks for",
            labels=["check", "subject", "status", "class", "action", "origin"],
        )
        success = GaugeMetricFamily(
            "nodecheck_check_run_success",
            "1 when the check ran to completion (no crash, no timeout)",
            labels=["check"],
        )
        duration = GaugeMetricFamily(
            "nodecheck_check_duration_seconds", "How long the last run took", labels=["check"]
        )
        last = GaugeMetricFamily(
            "nodecheck_check_last_run_timestamp_seconds",
            "When the last run finished",
            labels=["check"],
        )
        interval = GaugeMetricFamily(
            "nodecheck_check_interval_seconds", "How often the check runs", labels=["check"]
        )
        # One family per exported name: the first spec seen for a name wins, in check
        # order; a sample of the same name with another type, help or label set is
        # dropped (two HELP/TYPE blocks would fail the whole scrape).
        families: dict[str, tuple[MetricSpec, dict[tuple[str, ...], float]]] = {}
        dropped: dict[str, int] = {}
        failing_checks = 0
        for stored in runs:
            run = stored.run
            name = run.check.name
            dropped[name] = 0
            meant = [run.check.meant(result) for result in run.results]
            # A check fails the node when a finding of the node's own evidence fails; a
            # job's failure (a variable a user set) never counts (Finding.node_failing).
            failing_checks += any(
                result.status is Status.FAIL and result.origin is Origin.NODE for result in meant
            )
            success.add_metric([name], 1 if run.completed else 0)
            duration.add_metric([name], run.duration_s)
            last.add_metric([name], stored.finished_at)
            interval.add_metric([name], stored.interval_s)
            # A check may judge one subject several ways (cpu: governor and SMT on
            # "node"): one series per subject, with the worst of its statuses.
            by_subject: dict[str, Status] = {}
            for result in run.results:
                subject = _label_value(str(result.subject))
                previous = by_subject.get(subject, Status.SKIP)
                by_subject[subject] = worst([previous, result.status])
                for sample in result.samples:
                    self._add_sample(name, sample, families, dropped)
            for subject, current in by_subject.items():
                for value in STATUSES:
                    status.add_metric([name, subject, value], int(current.value == value))
            by_origin: dict[Origin | None, list[Result]] = {}
            for result in meant:
                by_origin.setdefault(result.origin, []).append(result)
            folded = [one for results in by_origin.values() for one in fold(results)]
            for one in findings_of_check(run.check, folded):
                verdict.add_metric(
                    [
                        name,
                        _label_value(str(one.subject)),
                        one.status.value,
                        one.fault_class.value,
                        one.action.value,
                        one.origin.value,
                    ],
                    1,
                )
        yield from (status, verdict, success, duration, last, interval)
        # One series a node for the fleet's "is it failing": a rule that reads it need not
        # reduce the node's ~117 verdict series (instance:nodecheck_checks_failing:bool).
        failing = GaugeMetricFamily(
            "nodecheck_checks_failing",
            "How many checks have a failing finding of the node's own evidence (origin node) "
            "in their latest result; a job's failure does not count",
        )
        failing.add_metric([], failing_checks)
        yield failing
        started = GaugeMetricFamily(
            "nodecheck_agent_start_time_seconds",
            "When the agent started (Unix time): with the benchmarks' last success, tells a "
            "node never measured since it started from one measured long ago",
        )
        started.add_metric([], self.started_at)
        yield started
        for spec, values in families.values():
            yield _family(spec, values)
        info = GaugeMetricFamily(
            "nodecheck_build_info", "nodecheck's version, value 1", labels=["version", "python"]
        )
        info.add_metric([self.version, platform.python_version()], 1)
        yield info
        yield node_info(self.node_labels())
        reload_ok = GaugeMetricFamily(
            "nodecheck_config_last_reload_successful",
            "1 when the last configuration (re)load succeeded",
        )
        reload_ok.add_metric([], 1 if self.reload_ok() else 0)
        yield reload_ok
        yield from self._results_file_families()
        withheld = GaugeMetricFamily(
            "nodecheck_remediation_withheld",
            "1 while taking this node out of service (integration: slurm's drain, kubernetes' "
            "taint) is held back by the fleet-wide circuit breaker ([remediation] breaker_*)",
            labels=["integration"],
        )
        for integration, held in sorted(self.remediation_withheld().items()):
            withheld.add_metric([integration], 1 if held else 0)
        yield withheld
        left_out = GaugeMetricFamily(
            "nodecheck_exposition_dropped_samples",
            "Samples of this check's latest run left out of this exposition (not a number, "
            "a bad metric or label name, a name taken by another family); logged once each",
            labels=["check"],
        )
        for name, count in dropped.items():
            left_out.add_metric([name], count)
        yield left_out

    def _results_file_families(self) -> Iterator[Metric]:
        writes = self.results_writes()
        if writes is None:
            return
        written = GaugeMetricFamily(
            "nodecheck_results_last_write_successful",
            "1 when the last write of the results file (for slurm health-check and npd) "
            "succeeded, or none was due yet",
        )
        written.add_metric([], 1 if writes.problem is None else 0)
        yield written
        failures = CounterMetricFamily(
            "nodecheck_results_write_failures",
            "Writes of the results file that failed since the agent started",
        )
        failures.add_metric([], writes.failures)
        yield failures

    def _add_sample(
        self,
        check: str,
        sample: object,
        families: dict[str, tuple[MetricSpec, dict[tuple[str, ...], float]]],
        dropped: dict[str, int],
    ) -> None:
        spec = getattr(sample, "metric", None)
        metric = str(getattr(spec, "name", "?"))
        problem = spec_problem(spec)
        if problem is None:
            spec = cast(MetricSpec, spec)
            if spec.name in OWN_FAMILIES:
                problem = "the name of one of the agent's own families"
            else:
                family = families.setdefault(spec.name, (spec, {}))
                if family[0] != spec:
                    problem = "the name of another family (other type, help or labels)"
        if problem is None:
            values = sample_values(sample)
            if isinstance(values, str):
                problem = values
            else:
                key, value = values
                series = families[cast(MetricSpec, spec).name][1]
                # The same series from two checks (the benchmarks' shared skip
                # counters): the larger value, which for a counter is the fresher.
                previous = series.get(key)
                series[key] = (
                    value if previous is None or math.isnan(previous) else max(previous, value)
                )
                return
        self._dropped(check, metric, problem, dropped)


def node_info(labels: Mapping[str, str]) -> Metric:
    """nodecheck_node_info{<[labels]>} 1: the node's place in the fleet, once per scrape
    rather than on every sample (the info-metric pattern of Prometheus's instrumentation
    practices: `* on(instance) group_left(rack) nodecheck_node_info` brings a label in).
    Always present, without labels when none are configured, so a join never loses a node.
    The configuration validated the names and values (agent/config.py)."""
    names = sorted(labels)
    family = GaugeMetricFamily(
        "nodecheck_node_info",
        "The operator's labels for this node ([labels] of the agent's configuration), value 1",
        labels=names,
    )
    family.add_metric([_label_value(labels[name]) for name in names], 1)
    return family


def _family(spec: MetricSpec, values: dict[tuple[str, ...], float]) -> Metric:
    family: GaugeMetricFamily | CounterMetricFamily
    if spec.kind == "counter":
        family = CounterMetricFamily(
            spec.name.removesuffix("_total"), spec.help, labels=spec.labels
        )
    else:
        family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
    for key, value in values.items():
        family.add_metric(list(key), value)
    return family


def make_registry(collector: ResultCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


class CachedExposition:
    """The rendered /metrics, rebuilt only when a result changed: results change once per
    check interval, scrapes come far more often (and from several Prometheus servers).
    Every value in it is absolute (timestamps, not ages), so a cached copy is exact."""

    def __init__(self, registry: CollectorRegistry, store: ResultStore, key: Callable[[], object]):
        self.registry = registry
        self.store = store
        self.key = key  # anything else the text depends on (the reload flag)
        self._cached: tuple[object, bytes] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> bytes:
        key = (self.store.generation, self.key())
        with self._lock:
            if self._cached is None or self._cached[0] != key:
                self._cached = (key, exposition(self.registry))
            return self._cached[1]


def write_textfile(directory: Path, registry: CollectorRegistry) -> None:
    """node_exporter's textfile collector reads *.prom: replaced atomically, so it never
    reads half a file; world-readable, as node_exporter runs as another user. By the rule
    of every output path (checks/node/output.py): the folder must exist."""
    write_output(directory / TEXTFILE_NAME, exposition(registry).decode(), 0o644)
