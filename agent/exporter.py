"""Prometheus exposition of the cached results: over HTTP and as a textfile.

Built from the ResultStore (the prometheus_client custom-collector pattern): a
scrape never runs a check, and one check's odd sample never fails the scrape:
it is left out, logged once and counted in nodecheck_exposition_dropped_samples.
Whatever the checks or the root snapshot hand in, the exposition stays valid for
Prometheus and clean for `promtool check metrics`.

The HTTP server is written for hostile clients too: a real listen backlog, a
bounded number of handler threads that only complete requests reach (one thread
holds the connections still sending theirs: agent/http_intake.py), one deadline
from accept() to the end of the request head (TLS handshake included) and one
for the whole response, bcrypt work bounded to one core, and every connection
failure one key=value log line, never a traceback.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import hashlib
import io
import ipaddress
import json
import logging
import math
import os
import platform
import re
import socket
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from nodecheck.agent.findings import findings_of_check, fold
from nodecheck.agent.http_intake import REQUEST_DEADLINE_S, Arrival, KnownClients, RequestIntake
from nodecheck.agent.results_file import ResultsWrites
from nodecheck.agent.scheduler import ResultStore
from nodecheck.checks.node.fs import NotRegularFileError, read_regular_file
from nodecheck.checks.node.output import write_output
from nodecheck.checks.record import record
from nodecheck.checks.result import MetricSpec, Sample, Status, worst

log = logging.getLogger(__name__)
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
    ) -> None:
        """`node_labels`: the configuration's [labels] now (a reload changes them);
        `started_at`: when the agent started (wall clock), else when this was made;
        `results_writes`: how writing the results file goes (None: there is none)."""
        self.store = store
        self.version = version
        self.reload_ok = reload_ok
        self.node_labels = node_labels
        self.results_writes = results_writes
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
        # threshold. One series per check and subject, value 1.
        verdict = GaugeMetricFamily(
            "nodecheck_check_verdict",
            "1 for the latest finding of this check on this subject: its status, fault class, "
            "the action it asks for and whether the evidence is the node's or a job's",
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
            failing_checks += any(result.status is Status.FAIL for result in run.results)
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
            for one in findings_of_check(run.check, fold(run.results)):
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
        # reduce the node's ~117 status series (nodecheck:node_failing).
        failing = GaugeMetricFamily(
            "nodecheck_checks_failing",
            "How many checks have fail as the status of at least one subject in their latest "
            "result",
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


# -- basic auth -------------------------------------------------------------------------

# "$2b$" + two-digit cost + "$" + 22 characters of salt and 31 of hash, in bcrypt's own
# base64 alphabet: what htpasswd -B and bcrypt.hashpw write.
BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
# htpasswd -B takes costs 4 to 17 (Apache's htpasswd(1), -C); bcrypt's time doubles with
# each step, and the agent pays it at start-up (the dummy hash) and on a scraper's first
# request: a cost of 20 would take minutes, past the unit's TimeoutStartSec.
BCRYPT_MAX_COST = 17
# bcrypt uses the first 72 bytes of a password; bcrypt >= 4.1 (pyca/bcrypt CHANGELOG)
# raises ValueError for a longer one instead of truncating it, so none can match.
BCRYPT_MAX_PASSWORD = 72
BCRYPT_SLOTS = 1  # bcrypt releases the GIL: one check at a time is at most one core
BCRYPT_WAIT_S = 1.0  # then 429: a scraper retries, a guesser waits
FAILURES_ALLOWED = 10  # wrong passwords per client address and window, then 429 at once
FAILURE_WINDOW_S = 60.0
TRACKED_CLIENTS = 4096


def parse_basic_auth(text: str, source: str) -> dict[str, bytes]:
    """ "user:<bcrypt hash>" lines (htpasswd -B; blank lines and # comments skipped)."""
    users: dict[str, bytes] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, _, hashed = line.partition(":")
        if not user or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ValueError(f"{source}:{number}: expected user:<bcrypt hash>")
        if not BCRYPT_HASH.fullmatch(hashed):
            raise ValueError(f"{source}:{number}: {user}: not a whole bcrypt hash (htpasswd -B)")
        cost = _bcrypt_cost(hashed.encode())
        if cost > BCRYPT_MAX_COST:
            raise ValueError(
                f"{source}:{number}: {user}: bcrypt cost {cost} is above {BCRYPT_MAX_COST} "
                f"(htpasswd -B's maximum): every check would take minutes; "
                f"hash it again with htpasswd -B -C 12"
            )
        users[user] = hashed.encode()
    if not users:
        raise ValueError(f"{source}: no users")
    return users


class AuthVerdict(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"  # 401
    BUSY = "busy"  # 429: too many checks at once, or this client failed too often


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) from "Basic <base64 of user:password>" (RFC 7617), or None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        # validate: only the base64 alphabet, so one password has one header
        decoded = base64.b64decode(token.strip(), validate=True)
        user, colon, password = decoded.partition(b":")
        return (user.decode(), password) if colon else None
    except ValueError:  # not base64 (binascii.Error), not ASCII, a user not UTF-8
        return None


def _bcrypt_cost(hashed: bytes) -> int:
    match = BCRYPT_HASH.fullmatch(hashed.decode("ascii", "replace"))
    return int(match.group(1)) if match else 12


# One dummy hash per cost for the agent's life: computing one costs as much as a check,
# and a reload (SIGHUP, on the main thread) must not pay it again.
_dummy_hashes: dict[int, bytes] = {}
_dummy_hashes_lock = threading.Lock()


def _dummy_hash(users: Mapping[str, bytes]) -> bytes:
    """A hash nobody's password matches, as costly as the real ones: an unknown user
    pays the same bcrypt time as a wrong password, so timing does not tell who exists."""
    import bcrypt

    cost = max((_bcrypt_cost(hashed) for hashed in users.values()), default=12)
    with _dummy_hashes_lock:
        known = _dummy_hashes.get(cost)
        if known is None:
            known = bcrypt.hashpw(os.urandom(18), bcrypt.gensalt(rounds=cost))
            _dummy_hashes[cost] = known
        return known


class BasicAuth:
    """Checks Authorization headers against bcrypt hashes. A good pair is remembered (by a
    salted digest, never the password), so a scrape does not pay bcrypt's cost again;
    bcrypt itself runs one check at a time, and a client address that keeps failing is
    told to wait (429) without any."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self._users = users
        self._dummy = _dummy_hash(users)
        self._good: set[bytes] = set()
        self._salt = os.urandom(16)
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(BCRYPT_SLOTS)
        self._failures: dict[str, deque[float]] = {}

    @property
    def users(self) -> dict[str, bytes]:
        return self._users

    @users.setter
    def users(self, users: dict[str, bytes]) -> None:
        """New users (a reload): every remembered password is forgotten with the old ones."""
        dummy = _dummy_hash(users)
        with self._lock:
            self._users = users
            self._dummy = dummy
            self._good.clear()

    def allows(self, header: str | None) -> bool:
        return self.check(header, "") is AuthVerdict.ALLOW

    def check(self, header: str | None, client: str) -> AuthVerdict:
        credentials = _credentials(header)
        if credentials is None:
            return AuthVerdict.DENY
        user, password = credentials
        encoded = user.encode()
        digest = hashlib.sha256(
            self._salt + len(encoded).to_bytes(4, "big") + encoded + password
        ).digest()
        with self._lock:
            if digest in self._good:
                return AuthVerdict.ALLOW
            users, dummy = self._users, self._dummy
        if len(password) > BCRYPT_MAX_PASSWORD:
            return AuthVerdict.DENY
        if self._failing(client):
            return AuthVerdict.BUSY
        hashed = users.get(user)
        if not self._slots.acquire(timeout=BCRYPT_WAIT_S):
            return AuthVerdict.BUSY
        try:
            matched = _bcrypt_matches(password, dummy if hashed is None else hashed)
        finally:
            self._slots.release()
        if hashed is None or not matched:
            self._failed(client)
            return AuthVerdict.DENY
        with self._lock:
            if self._users is users:  # not a password of users replaced meanwhile
                self._good.add(digest)
        return AuthVerdict.ALLOW

    def _failing(self, client: str) -> bool:
        now = time.monotonic()
        with self._lock:
            failures = self._failures.get(client)
            while failures and now - failures[0] > FAILURE_WINDOW_S:
                failures.popleft()
            return failures is not None and len(failures) >= FAILURES_ALLOWED

    def _failed(self, client: str) -> None:
        with self._lock:
            if client not in self._failures and len(self._failures) >= TRACKED_CLIENTS:
                now = time.monotonic()
                for address in [
                    a for a, f in self._failures.items() if not f or now - f[-1] > FAILURE_WINDOW_S
                ]:
                    del self._failures[address]
                if len(self._failures) >= TRACKED_CLIENTS:
                    self._failures.pop(next(iter(self._failures)))
            self._failures.setdefault(client, deque(maxlen=FAILURES_ALLOWED)).append(
                time.monotonic()
            )


def _bcrypt_matches(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError as err:  # a hash bcrypt cannot read (BasicAuth built by hand)
        log.warning("event=bad_bcrypt_hash error=%r", str(err))
        return False


# -- TLS ---------------------------------------------------------------------------------

PEM_FILE_LIMIT = 1 << 20  # a certificate chain or a key is a few kB
PEM_CERTIFICATE_BLOCK = re.compile(
    r"-----BEGIN CERTIFICATE-----\r?\n.*?-----END CERTIFICATE-----", re.DOTALL
)


class _PassPhraseWantedError(Exception):
    pass


def _refuse_pass_phrase() -> str:
    """OpenSSL would prompt on the terminal for an encrypted key without a password
    callback (ssl.SSLContext.load_cert_chain); the agent has no terminal to ask on."""
    raise _PassPhraseWantedError


def _read_pem(path: Path, what: str) -> str:
    """The file's text; ValueError naming it when it is no regular, readable, small file.
    Opened only once stat says it is a regular file (never a device: opening one has
    side effects), non-blocking. Bytes outside ASCII (a UTF-8 "Bag Attributes:
    friendlyName" line of openssl pkcs12's output) become U+FFFD."""
    try:
        data = read_regular_file(path, PEM_FILE_LIMIT)
    except NotRegularFileError as err:
        raise ValueError(f"{path}: the {what} is {err.kind}") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot read the {what}: {err.strerror}") from err
    except ValueError:  # a NUL in the path
        raise ValueError(f"{path!r}: cannot read the {what}: a NUL in the path") from None
    if len(data) > PEM_FILE_LIMIT:
        raise ValueError(f"{path}: the {what} is over {PEM_FILE_LIMIT} bytes")
    return data.decode("ascii", "replace")


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The server's context, TLS 1.2 or later; ValueError naming the file and why when the
    certificate or key cannot be used (missing, unreadable, not PEM, an encrypted key,
    a key that is not the certificate's)."""
    cert_text = _read_pem(cert, "certificate")
    key_text = _read_pem(key, "private key")
    if "-----BEGIN CERTIFICATE-----" not in cert_text:
        raise ValueError(f"{cert}: not a PEM certificate (no BEGIN CERTIFICATE line)")
    key_header = re.search(r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----", key_text)
    if key_header is None:
        raise ValueError(f"{key}: not a PEM private key (no BEGIN PRIVATE KEY line)")
    # PKCS#8 "BEGIN ENCRYPTED PRIVATE KEY", or the legacy "Proc-Type: 4,ENCRYPTED" header
    encrypted_hint = (
        f"{key}: the private key is encrypted and the agent cannot ask for its pass phrase: "
        "store it unencrypted (openssl pkey -in KEY -out KEY.plain), readable only by the agent"
    )
    if "ENCRYPTED" in key_header.group(1) or "Proc-Type: 4,ENCRYPTED" in key_text:
        raise ValueError(encrypted_hint)
    # Only the certificate blocks (RFC 7468 §2: text outside them is explanatory and may be
    # anything): cadata takes an ASCII string only, and raises TypeError otherwise.
    blocks = PEM_CERTIFICATE_BLOCK.findall(cert_text)
    if not blocks:
        raise ValueError(f"{cert}: not a PEM certificate (no END CERTIFICATE line)")
    for number, block in enumerate(blocks, start=1):
        if not block.isascii():
            raise ValueError(
                f"{cert}: certificate {number} of the file has bytes outside ASCII inside "
                "its BEGIN/END CERTIFICATE lines: not base64"
            )
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata="\n".join(blocks))
    except ssl.SSLError as err:
        raise ValueError(f"{cert}: not a usable PEM certificate: {err.reason or err}") from err
    except (TypeError, UnicodeError) as err:
        raise ValueError(f"{cert}: not a usable PEM certificate: {err}") from err
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key, password=_refuse_pass_phrase)
    except _PassPhraseWantedError as err:
        raise ValueError(encrypted_hint) from err
    except ssl.SSLError as err:
        if err.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(
                f"{key}: the private key does not match the certificate {cert}"
            ) from err
        raise ValueError(
            f"{key}: not a usable private key for {cert}: {err.reason or err}"
        ) from err
    except OSError as err:  # replaced between the reads above and OpenSSL's
        raise ValueError(f"{cert}, {key}: cannot read: {err.strerror}") from err
    return context


# -- the server --------------------------------------------------------------------------

# listen(2): a backlog above /proc/sys/net/core/somaxconn is silently capped to it
# (4096 since Linux 5.4); socketserver's default of 5 refuses a burst of connections.
LISTEN_BACKLOG = 1024
HANDLER_THREADS = 64  # beyond these, complete requests wait for a free one
# Threads beyond HANDLER_THREADS that only a known good client (KnownClients: answered
# lately) may take: a scraper is answered while others hold every other thread.
RESERVED_THREADS = 4
# A client address (an IPv6 client: its /64, what one host is usually given) holds this
# many connections at most, open or waiting; beyond them a new one is closed at once.
# Prometheus needs one per target; 8 leave room for a second scraper and curl.
CONNECTIONS_PER_CLIENT = 8
# Complete requests waiting for a handler thread, all clients together. With the
# connections still sending their head (http_intake.PRE_REQUEST_CONNECTIONS) and the
# threads, under the 1024 file descriptors systemd gives a service by default
# (DefaultLimitNOFILE's soft limit, systemd-system.conf(5)).
WAITING_CONNECTIONS = 256
# A kept-alive connection is closed after this many requests or this long (the response
# says Connection: close), so no client holds a thread for ever by asking in time.
REQUESTS_PER_CONNECTION = 100
CONNECTION_LIFETIME_S = 300.0
RESPONSE_DEADLINE_S = 30.0  # the whole response written, however slowly the client reads
SEND_CHUNK = 1 << 16
UNAUTHENTICATED_PATHS = ("/healthz", "/livez")  # the probes: they tell no results


class _DeadlineReader(io.RawIOBase):
    """The socket read under one deadline for the whole request: a socket timeout alone
    restarts at every byte, so a client dripping a header line every few seconds would
    hold its thread for ever."""

    def __init__(
        self,
        connection: socket.socket,
        deadline: float,
        on_idle: Callable[[bool], None] | None = None,
        head: bytes = b"",
    ) -> None:
        self._connection = connection
        self.deadline = deadline
        self._head = head  # what the intake read already (agent/http_intake.py), first
        # Set between two requests of a kept-alive connection: the next read waits for
        # a request that may never come, and the server may close it when it needs the
        # thread (on_idle(True) before that read, on_idle(False) after).
        self.idle = False
        self._on_idle = on_idle

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            with memoryview(buffer) as view, view.cast("B") as octets:
                size = min(len(octets), len(self._head))
                octets[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"request not complete within {REQUEST_DEADLINE_S:g} s")
        self._connection.settimeout(remaining)
        if not (self.idle and self._on_idle is not None):
            return self._connection.recv_into(buffer)
        self._on_idle(True)
        try:
            return self._connection.recv_into(buffer)
        finally:
            self.idle = False
            self._on_idle(False)


class _DeadlineWriter(io.BufferedIOBase):
    """The socket written under one deadline for the whole response, started at its
    first byte: a client that reads slowly or never holds its thread
    RESPONSE_DEADLINE_S at most (a socket timeout bounds each send call, not the
    response)."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self._deadline: float | None = None

    def writable(self) -> bool:
        return True

    def restart(self) -> None:
        """The next response's deadline starts at its first byte."""
        self._deadline = None

    def write(self, data: Any) -> int:
        if self._deadline is None:
            self._deadline = time.monotonic() + RESPONSE_DEADLINE_S
        with memoryview(data) as view, view.cast("B") as octets:
            sent = 0
            while sent < len(octets):
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"response not read within {RESPONSE_DEADLINE_S:g} s")
                self._connection.settimeout(remaining)
                sent += self._connection.send(octets[sent : sent + SEND_CHUNK])
            return sent


def _client(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "unknown"
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if type(error).__name__ not in text else text


def client_key(address: Any) -> str:
    """Whose connection this is, for CONNECTIONS_PER_CLIENT: the IPv4 address (also
    when IPv4-mapped), an IPv6 address's /64."""
    host = str(address[0]) if isinstance(address, tuple) and address else str(address)
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@record(frozen=False)
class _Waiting:
    request: Any
    address: Any
    key: str
    since: float  # accepted (time.monotonic())
    head: bytes  # the request head, or its first HEAD_BUFFER_LIMIT bytes


class AgentServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a real backlog, bounded handler threads shared fairly
    between client addresses, TLS that can be reloaded, and connection failures logged as
    one line each.

    The accept loop never waits for a thread: it closes a connection beyond a client's
    CONNECTIONS_PER_CLIENT at once and hands the others to the intake
    (agent/http_intake.py), one thread that holds every connection until its request
    head is complete (within REQUEST_DEADLINE_S of accept(), PRE_REQUEST_CONNECTIONS at
    most): a silent or dripping client never holds a handler thread. A complete request
    is queued; a free thread goes to the queued connection of a known good client
    (KnownClients) first, then of the client with the fewest connections being served
    (the oldest first among equals), and RESERVED_THREADS beyond HANDLER_THREADS serve
    known good clients only; while requests wait, kept-alive connections idle between
    two requests are closed to free their threads. Every served connection frees its
    thread within REQUEST_DEADLINE_S of its last response (and RESPONSE_DEADLINE_S of
    writing), and after a 4xx or 5xx at once.
    """

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = True
    block_on_close = False  # stop() must not wait for a slow client's deadline
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        tls: tuple[Path, Path] | None,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._tls_paths = tls
        self._tls = tls_context(*tls) if tls is not None else None
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._served = 0  # connections on a handler thread
        self._connections: dict[str, int] = {}  # per client key: served or waiting
        self._served_by: dict[str, int] = {}  # per client key: served
        self._waiting: list[_Waiting] = []
        self._idle: dict[int, tuple[socket.socket, str]] = {}  # between two requests
        self._heads: dict[int, tuple[bytes, float]] = {}  # a started connection's head
        self.known = KnownClients()
        self._intake = RequestIntake(self._head_received, self._dropped, self.known)
        super().__init__(address, handler)
        self._intake.start()

    def reload_tls(self) -> None:
        """Re-read the certificate and key (replaced by cert-manager or certbot, then
        SIGHUP) for new connections; ValueError naming the file, and the old ones kept,
        when they are unusable. Nothing to do when serving plain HTTP."""
        if self._tls_paths is None:
            return
        self._tls = tls_context(*self._tls_paths)
        log.info("event=tls_reloaded cert=%s key=%s", *self._tls_paths)

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = self.socket.accept()
        context = self._tls
        if context is not None:
            # The handshake happens on the request's own thread, under its deadline,
            # never in accept(): a client that connects and stays silent must not
            # stop the server (or its shutdown).
            connection = context.wrap_socket(
                connection, server_side=True, do_handshake_on_connect=False
            )
        return connection, address

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accept loop: refuse, or hand to the intake until the request head is
        complete; never waits."""
        key = client_key(client_address)
        accepted = time.monotonic()
        with self._lock:
            count = self._connections.get(key, 0)
            refused = self._closing.is_set() or count >= CONNECTIONS_PER_CLIENT
            if not refused:
                self._connections[key] = count + 1
        if refused:
            log.debug(
                "event=connection_refused client=%s reason=%r",
                _client(client_address),
                f"{CONNECTIONS_PER_CLIENT} connections from {key} already",
            )
            self.shutdown_request(request)
            return
        self._intake.admit(Arrival(request, client_address, key, accepted))

    def _head_received(self, arrival: Arrival) -> None:
        """On the intake's thread: a complete request head, queued for a handler thread."""
        evicted: _Waiting | None = None
        waiting = _Waiting(
            arrival.connection, arrival.address, arrival.key, arrival.accepted, bytes(arrival.head)
        )
        with self._lock:
            self._waiting.append(waiting)
            if len(self._waiting) > WAITING_CONNECTIONS:
                evicted = self._evict_locked()
        if evicted is not None:
            self._close_waiting(evicted, "too many connections waiting")
        self._dispatch()

    def _dropped(self, arrival: Arrival, reason: str, error: BaseException | None) -> None:
        """On the intake's thread: a connection closed before its request was whole."""
        if error is not None:
            log.debug(
                "event=connection_error client=%s error=%r",
                _client(arrival.address),
                _describe(error),
            )
        elif not reason.startswith("closed by the client"):
            log.debug(
                "event=connection_dropped client=%s reason=%r", _client(arrival.address), reason
            )
        self.shutdown_request(arrival.connection)
        self._forget(arrival.key, served=False)

    def _evict_locked(self) -> _Waiting:
        """The newest waiting connection of the client with the most connections, a
        known good client's last."""
        most = max(
            self._waiting,
            key=lambda w: (w.key not in self.known, self._connections.get(w.key, 0), w.since),
        )
        self._waiting.remove(most)
        return most

    def _close_waiting(self, waiting: _Waiting, reason: str) -> None:
        log.debug("event=connection_dropped client=%s reason=%r", _client(waiting.address), reason)
        self.shutdown_request(waiting.request)
        self._forget(waiting.key, served=False)

    def _forget(self, key: str, *, served: bool) -> None:
        with self._lock:
            counters = (self._connections, self._served_by) if served else (self._connections,)
            for counter in counters:
                counter[key] -= 1
                if counter[key] <= 0:
                    del counter[key]
            if served:
                self._served -= 1

    def _dispatch(self) -> None:
        """Free threads to the waiting connections, known good clients' first, then fewest
        served per client; while some still wait, close as many idle kept-alive
        connections."""
        start: list[_Waiting] = []
        idle: list[socket.socket] = []
        with self._lock:
            while self._waiting:
                known = {w.key for w in self._waiting if w.key in self.known}
                chosen = min(
                    self._waiting,
                    key=lambda w: (w.key not in known, self._served_by.get(w.key, 0), w.since),
                )
                threads = HANDLER_THREADS + (RESERVED_THREADS if chosen.key in known else 0)
                if self._served >= threads:
                    break
                self._waiting.remove(chosen)
                self._served += 1
                self._served_by[chosen.key] = self._served_by.get(chosen.key, 0) + 1
                self._heads[id(chosen.request)] = (chosen.head, chosen.since)
                start.append(chosen)
            if self._waiting and self._idle:
                ranked = sorted(
                    self._idle.items(), key=lambda item: -self._served_by.get(item[1][1], 0)
                )
                for ident, (connection, _) in ranked[: len(self._waiting)]:
                    del self._idle[ident]
                    idle.append(connection)
        for connection in idle:
            # The bare socket's shutdown: the handler's blocked read returns at once (an
            # SSLSocket's own shutdown would drop its SSL object under the reading thread).
            with contextlib.suppress(OSError):
                socket.socket.shutdown(connection, socket.SHUT_RDWR)
        for waiting in start:
            thread = threading.Thread(
                target=self._serve_connection,
                args=(waiting.request, waiting.address, waiting.key),
                name="http-connection",
                daemon=True,
            )
            try:
                thread.start()
            except RuntimeError as err:  # no thread to be had (RLIMIT_NPROC)
                log.warning(
                    "event=connection_dropped client=%s reason=%r",
                    _client(waiting.address),
                    str(err),
                )
                with self._lock:
                    self._heads.pop(id(waiting.request), None)
                self.shutdown_request(waiting.request)
                self._forget(waiting.key, served=True)

    def request_head(self, request: Any) -> tuple[bytes, float]:
        """For a handler starting on `request`: its head as the intake read it, and when
        it was accepted (its deadline counts from then)."""
        with self._lock:
            return self._heads.pop(id(request), (b"", time.monotonic()))

    def _serve_connection(self, request: Any, client_address: Any, key: str) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._lock:
                self._idle.pop(id(request), None)
                self._heads.pop(id(request), None)
            self._forget(key, served=True)
            if not self._closing.is_set():
                self._dispatch()

    def connection_idle(self, connection: socket.socket, client_address: Any, idle: bool) -> None:
        """A handler says its kept-alive connection waits for a next request (or no more)."""
        with self._lock:
            if idle:
                self._idle[id(connection)] = (connection, client_key(client_address))
            else:
                self._idle.pop(id(connection), None)
        if idle:
            self._dispatch()  # connections waiting now may take its thread

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line per failed connection (socketserver prints a traceback): plain HTTP
        to the TLS port, a client that hangs up or resets, a deadline passed."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug(
                "event=connection_error client=%s error=%r",
                _client(client_address),
                _describe(error),
            )
        else:
            log.warning(
                "event=handler_failed client=%s error=%r", _client(client_address), _describe(error)
            )

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """socketserver's loop, restarted after anything unexpected (one log line), so the
        agent never stops answering while it lives."""
        while not self._closing.is_set():
            try:
                super().serve_forever(poll_interval)
                return
            except Exception as err:
                log.error("event=http_loop_failed error=%r", _describe(err))
                time.sleep(poll_interval)

    def _close_all_waiting(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for entry in waiting:
            self.shutdown_request(entry.request)
            self._forget(entry.key, served=False)

    def shutdown(self) -> None:
        self._closing.set()
        super().shutdown()
        self._intake.close()
        self._close_all_waiting()

    def server_close(self) -> None:
        super().server_close()
        self._intake.close()
        self._close_all_waiting()


def serve(
    listen: str,
    metrics: Callable[[], bytes],
    results: Callable[[], dict[str, Any]],
    healthy: Callable[[], bool],
    tls: tuple[Path, Path] | None = None,
    auth: BasicAuth | None = None,
    problems: Callable[[], Sequence[str]] = tuple,
) -> AgentServer:
    """Start the HTTP(S) server on a thread: /metrics, /results (behind basic auth when
    configured), /livez and /healthz (never: they tell nothing but whether the agent does
    its work). /livez is 503 "scheduler stalled" when not `healthy()` (a restart mends
    that: the liveness probe); /healthz also with `problems()`, one a line (what a restart
    would not mend: the readiness probe). ValueError naming the file when the TLS
    certificate or key is unusable."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"

    class Handler(BaseHTTPRequestHandler):
        server_version = "nodecheck"
        # Keep-alive: a scraper (or wrk) reuses its connection instead of a new TCP
        # (and TLS) handshake and thread per scrape. An idle connection waits for its
        # next request REQUEST_DEADLINE_S at most, as a new one does.
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            self.connection = self.request
            # Headers and body are two writes: without TCP_NODELAY, Nagle's algorithm
            # holds the body until the client's delayed ACK of the headers (tcp(7)),
            # 40 ms a response on a kept-alive connection.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection, client = self.connection, self.client_address
            server = cast(AgentServer, self.server)
            # The intake did the TLS handshake and read the head, or its first part.
            head, accepted = server.request_head(connection)
            self._reader = _DeadlineReader(
                connection,
                accepted + REQUEST_DEADLINE_S,
                lambda idle: server.connection_idle(connection, client, idle),
                head,
            )
            self._writer = _DeadlineWriter(self.connection)
            self.rfile = io.BufferedReader(self._reader)
            self.wfile = self._writer
            self._requests = 0
            self._opened = time.monotonic()

        def handle_one_request(self) -> None:
            if self._requests:  # the first one's deadline began at accept()
                self._reader.deadline = time.monotonic() + REQUEST_DEADLINE_S
                self._reader.idle = True
                self._writer.restart()
            self._requests += 1
            try:
                super().handle_one_request()
            finally:
                self._reader.idle = False

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if auth is not None and path not in UNAUTHENTICATED_PATHS:
                verdict = auth.check(self.headers.get("Authorization"), self.client_address[0])
                if verdict is AuthVerdict.BUSY:
                    self._send(
                        429,
                        b"too many authentication attempts\n",
                        "text/plain",
                        ("Retry-After", "5"),
                    )
                    return
                if verdict is AuthVerdict.DENY:
                    self._send(
                        401, b"", "text/plain", ("WWW-Authenticate", 'Basic realm="nodecheck"')
                    )
                    return
            try:
                code, body, kind = self._route(path)
            except Exception as err:  # a bug behind one endpoint: a 500, never a dead socket
                log.error("event=request_failed path=%r error=%r", path, _describe(err))
                code, body, kind = 500, b"internal error: see the agent's log\n", "text/plain"
            if code < 400 and (auth is None or path not in UNAUTHENTICATED_PATHS):
                # Answered, and past the password where there is one: known good.
                cast(AgentServer, self.server).known.answered(client_key(self.client_address))
            self._send(code, body, kind)

        def _route(self, path: str) -> tuple[int, bytes, str]:
            if path == "/metrics":
                return 200, metrics(), "text/plain; version=0.0.4; charset=utf-8"
            if path in UNAUTHENTICATED_PATHS:
                found = [] if healthy() else ["scheduler stalled"]
                if path == "/healthz":
                    found += problems()
                if not found:
                    return 200, b"ok\n", "text/plain"
                return 503, "".join(f"{problem}\n" for problem in found).encode(), "text/plain"
            if path == "/results":
                return (
                    200,
                    json.dumps(results(), indent=2, default=str).encode(),
                    "application/json",
                )
            return 404, b"not found: try /metrics, /healthz, /livez or /results\n", "text/plain"

        def _send(self, code: int, body: bytes, kind: str, *headers: tuple[str, str]) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers:
                self.send_header(name, value)
            # An error (a 401 or 429 above all) ends the connection: a client without the
            # password must not keep a thread by asking again and again; so do the
            # request and lifetime caps of a kept-alive connection.
            if (
                code >= 400
                or self._requests >= REQUESTS_PER_CONNECTION
                or time.monotonic() - self._opened >= CONNECTION_LIFETIME_S
            ):
                self.send_header("Connection", "close")  # sets close_connection
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            if log.isEnabledFor(logging.DEBUG):  # every request: format only when shown
                log.debug(
                    "event=http client=%s message=%r", _client(self.client_address), format % args
                )

    server = AgentServer((host, int(port)), Handler, tls)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
