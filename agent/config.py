"""The agent's configuration: embedded defaults, optionally overridden by a TOML file.

An example (a file names only what it changes; `nodecheck config show` on an empty
file prints every default, and checks/config.py is where the checks' are declared):

    [agent]
    listen = ":19410"            # host:port for /metrics, /healthz, /results; "" for none
    textfile_dir = ""            # also write nodecheck.prom there (node_exporter's textfile)
    expected_gpus = 8            # 0 to 1024; unset: the GPUs on the PCI bus
    kernel_log = "/dev/kmsg"
    nvml_timeout = 3             # seconds, 0.1 to 8
    state_dir = "/var/lib/nodecheck"
    snapshot = "/run/nodecheck/snapshot.json"   # root-only checks, from nodecheck snapshot
    results_file = "/run/nodecheck/agent/results.json"  # for slurm health-check; "" for none
    tls_cert_file = ""           # HTTPS when both are set
    tls_key_file = ""
    basic_auth_file = ""         # "user:<bcrypt hash>" lines, as htpasswd -B writes them
    web_config_file = ""         # or node_exporter's web-config.yml (agent/web/config.py)
                                 # instead of the three keys above

    [checks.pcie_acs]            # any registered check
    enabled = true
    interval = 300               # seconds, 1 to 30 days
    timeout = 10                 # seconds, above 0 and at most an hour

    [benchmarks]
    enabled = true
    interval = 86400             # seconds, 1 to 30 days
    duration = 10                # seconds, 0.1 to 600
    device = "cuda"
    idle_window = 120            # seconds every GPU must be idle before one starts, 0 to 3600
    warn_below = 0.95            # ratio to the node's median GPU and to the baseline, (0, 1]
    fail_below = 0.85
    memory_fraction = 0.4        # of each GPU's free memory, 0.01 to 0.95
    network_max_age = 259200     # seconds a cross-node sweep's record (network.json) judges
                                 # the node, 1 hour to 30 days; older: could not determine

    [slurm]                      # nodecheck slurm health-check (HealthCheckProgram)
    results_max_age = 300        # seconds the agent's results file may be old, 1 to 86400
    budget = 20                  # seconds for the quick checks when it runs them itself, 1 to 55
    scontrol_timeout = 5         # seconds for each scontrol call, 0.5 to 30
    drain_on_error = false       # drain on `error` (could not determine) too
    undrain_after_runs = 3       # healthy runs in a row before UNDRAIN, 1 to 1000
    undrain_after = 0            # or seconds healthy since the first of them; 0: runs only
    reboot_on_xid = false        # reboot-class faults: drain, then scontrol reboot

    [remediation]                # what takes the node out of service (Slurm drain, taint)
    performance = true           # a GPU performance failure does; hardware always, the node's
                                 # configuration and a job's variables never (README.md)
    dry_run = false              # log what it would do to the node, and do nothing
    breaker_fraction = 0.1       # at most this share of the cluster's nodes, (0, 1],
    breaker_nodes = 50           # and this many, 1 to 100000, drained by nodecheck
    breaker_window = 3600        # in this many seconds, 60 to 7 days; past it: reported

    [labels]                     # this node's place in the fleet, on nodecheck_node_info
    cluster = "c1"               # any names (at most 16), string values of 1 to 128
    partition = "gpu"            # printable characters; the fleet rules group by
    rack = "r07"                 # cluster, partition and rack where they are set

    [kubernetes]                 # node conditions, events, a taint (agent/kubernetes/reporter.py)
    enabled = false
    taint = false                # nodecheck.io/unhealthy=<class>:NoSchedule on a failing check
    events = true                # Warning events for warn and fail findings
    node_name = ""               # "": the NODE_NAME variable (the downward API's spec.nodeName)
    api_server = ""              # "": https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    resend_interval = 300        # seconds between heartbeats of unchanged conditions, 1 to 3600
    taint_after = 30             # seconds a fault stands before the taint, 0 to 3600
    clear_after = 300            # seconds clear before the taint goes, or a condition turns
                                 # better, 0 to 86400
    timeout = 10                 # seconds for each call to the API server, 0.5 to 60
    token_reread = 60            # seconds a token is used before the file is read again, 1 to 60

A bad file is refused whole, with the file, line and key named: the agent
keeps running on what it had. Every way a file can be bad is a ConfigError:
unreadable, not a regular file, over 1 MiB, not UTF-8, not TOML, nested too
deeply, a value of the wrong type or out of its range (NaN and infinities
included: TOML has `nan` and `inf`), or a file it names that cannot be used.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import stat
import sys
from collections.abc import Mapping
from dataclasses import field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodecheck.checks.config import (
    AGENT_IDLE_WINDOW_S,
    BENCH_DURATION_RANGE_S,
    IDLE_WINDOW_RANGE_S,
    MEMORY_FRACTION_RANGE,
    NETWORK_MAX_AGE_RANGE_S,
    NVML_TIMEOUT_RANGE_S,
    RATIO_RANGE,
    BenchOptions,
    CheckConfig,
    Thresholds,
    default_state_dir,
    is_default_state_dir,
)
from nodecheck.checks.node.fs import (
    NotRegularFileError,
    file_kind,
    read_regular_file,
)
from nodecheck.checks.node.output import NO_SUCH_DIRECTORY, output_directory_problem
from nodecheck.checks.printable import printable
from nodecheck.checks.record import record
from nodecheck.checks.result import FaultClass

if TYPE_CHECKING:
    from nodecheck.agent.findings import Finding
    from nodecheck.checks.registry import Check

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_PATH = Path("/etc/nodecheck/config.toml")
DEFAULT_PORT = 19410
# A configuration, a users file or a PEM file above this is not one: refused unread.
MAX_FILE_BYTES = 1 << 20
DAY_S = 86400.0
INTERVAL_RANGE_S = (1.0, 30 * DAY_S)
CHECK_TIMEOUT_MAX_S = 3600.0
MAX_EXPECTED_GPUS = 1024
# [labels]: exported once, on nodecheck_node_info, and joined onto other series by the
# fleet's rules (group_left): a bounded set of short values, as Prometheus's own
# label_limit, label_name_length_limit and label_value_length_limit scrape options
# bound them (prometheus docs/configuration/configuration.md).
MAX_NODE_LABELS = 16
MAX_NODE_LABEL_VALUE = 128
NODE_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*", re.ASCII)  # Prometheus's label names
# Names a join of nodecheck_node_info onto nodecheck's series (or an alert) would clash
# with: Prometheus's target labels and histogram/summary labels, the labels its alerts
# add, and every label of nodecheck's own series (tests/agent/test_node_labels.py checks
# that this covers each MetricSpec's labels). Scraped through a Prometheus Operator
# ServiceMonitor or PodMonitor, the target also gets namespace, service, pod, container
# and endpoint, and node where the endpoint's address targets a Node (the relabelings
# prometheus-operator's pkg/prometheus/promcfg.go generates): an exported label of such
# a name would come out renamed exported_<name> (honor_labels: false).
RESERVED_NODE_LABELS = frozenset(
    {"instance", "job", "le", "quantile", "alertname", "alertstate", "severity"}
    | {"namespace", "pod", "container", "service", "endpoint", "node"}
    | {"check", "subject", "status", "version", "python", "benchmark"}
    | {"gpu", "bus_id", "model", "uuid", "vbios", "driver_version", "dtype", "shape"}
    | {"payload_bytes", "algorithm", "ranks", "xid", "sxid", "action", "kind", "nvlink"}
    | {"bridge", "device", "port", "link_layer", "role", "reason", "cause", "error"}
    | {"backend", "nodes", "statistic", "peer", "round", "culprit", "confidence"}
)


class ConfigError(Exception):
    """A configuration that cannot be used: where, and why."""

    def __init__(self, path: Path | str, line: int | None, key: str, reason: str) -> None:
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {key}: {reason}" if key else f"{where}: {reason}")


class UnreadableFileError(Exception):
    """A file that cannot be read as text: why, and the line of a decoding error."""

    def __init__(self, reason: str, line: int | None = None, missing: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.line, self.missing = reason, line, missing


def read_text_file(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; UnreadableFileError if not.

    Opened only once stat says it is a regular file (open_regular_file), non-blocking:
    a FIFO in its place would otherwise block the caller until a writer comes (for the
    agent, a SIGHUP that never returns), and /dev/zero would never end.
    """
    try:
        data = read_regular_file(path, limit)
    except FileNotFoundError:
        raise UnreadableFileError("no such file", missing=True) from None
    except NotRegularFileError as err:
        raise UnreadableFileError(f"{err.kind}, not a regular file") from None
    except OSError as err:  # EACCES, EIO from a dying disk, ...
        raise UnreadableFileError(err.strerror or str(err)) from None
    except ValueError:  # os.stat refuses a path with a NUL byte
        raise UnreadableFileError("the path has a NUL character") from None
    if len(data) > limit:
        size_text = f"{limit / 2**20:g} MiB" if limit >= 2**20 else f"{limit} bytes"
        raise UnreadableFileError(f"larger than {size_text}: not a file of this kind")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise UnreadableFileError(f"not UTF-8 text (byte 0x{data[err.start]:02x})", line) from None
    return text.removeprefix("\ufeff")  # a byte-order mark some editors write


_LISTEN = re.compile(
    r"(?:\[(?P<ipv6>[^\[\]]+)\]|(?P<host>[^\[\]:]*)):(?P<port>[0-9]{1,5})", re.ASCII
)
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)


def parse_listen(listen: str) -> tuple[str, int]:
    """(host, port) of a `host:port`, `:port` (every interface) or `[IPv6]:port` address;
    ValueError saying what is wrong. The same rules for the file and `--listen`."""
    match = _LISTEN.fullmatch(listen)
    if match is None:
        raise ValueError(f"expected host:port, :port or [IPv6]:port, got {_shown(listen)}")
    port = int(match.group("port"))
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range (1 to 65535) in {listen!r}")
    if match.group("ipv6") is not None:
        try:
            ipaddress.IPv6Address(match.group("ipv6"))
        except ValueError:
            raise ValueError(f"not an IPv6 address in brackets: {listen!r}") from None
        return match.group("ipv6"), port
    host = match.group("host")
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"not an IPv4 address: {host!r}") from None
    elif host and (
        len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in host.split("."))
    ):
        raise ValueError(f"not a host name or address: {_shown(host)}")
    return host, port


def _toml_escape(char: str) -> str:
    """One character as a TOML basic string escapes it (TOML 1.0, "String": \\uXXXX or
    \\UXXXXXXXX; it has no \\x)."""
    return f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}"


def toml_basic_string(value: str) -> str:
    """`value` as a TOML basic string that shows as text on a terminal: JSON's escapes are
    TOML's for the quote, the backslash and the C0 controls; every other character
    printable() escapes (DEL, the C1 controls, the bidi overrides: TOML allows them raw,
    a terminal acts on them) in TOML's notation, which reads back as the same value."""
    return printable(json.dumps(value, ensure_ascii=False), _toml_escape)


_TOO_DEEP = "a deeply nested value"


def _shown(value: object, limit: int = 60) -> str:
    """repr(value), cut short: a 1 MiB string or a table nested 10,000 deep is not an
    error message (repr of the latter raises RecursionError)."""
    try:
        text = repr(value)
    except RecursionError:
        return _TOO_DEEP
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _described(value: object) -> str:
    """A TOML value as its kind and a short rendering: "an array [1, 2]", "a date-time
    1979-05-27T07:32:00+00:00"."""
    import datetime

    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (datetime.date, datetime.time)):
        return f"a date or time {value.isoformat()}"
    kinds = ((str, "a string"), (int, "an integer"), (float, "a number"), (list, "an array"))
    kind = next((name for cls, name in kinds if isinstance(value, cls)), "a table")
    shown = _shown(value)
    return f"{kind} nested too deeply to show" if shown == _TOO_DEEP else f"{kind} {shown}"


def _expected(kinds: tuple[type, ...]) -> str:
    if set(kinds) == {int, float}:
        return "a number"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return " or ".join(names.get(kind, "a table") for kind in kinds)


@record
class CheckSettings:
    enabled: bool = True
    interval_s: float | None = None  # None: the check's own default
    timeout_s: float | None = None


@record
class BenchmarkSettings:
    """[benchmarks]: the schedule, and the BenchOptions the file may change (their
    defaults are checks/config.py's, but for the idle window: the agent waits longer)."""

    enabled: bool = False
    interval_s: float = DAY_S
    duration_s: float = BenchOptions.duration_s
    device: str = BenchOptions.device
    idle_window_s: float = AGENT_IDLE_WINDOW_S
    warn_below: float = Thresholds.warn  # ratios to the node's median and the baseline
    fail_below: float = Thresholds.fail
    memory_fraction: float = BenchOptions.memory_fraction
    network_max_age_s: float = BenchOptions.network_max_age_s


# nodecheck.service's RuntimeDirectory=nodecheck/agent: the agent's own (DynamicUser) folder
# under the snapshot's /run/nodecheck, which root owns.
DEFAULT_RESULTS_FILE = Path("/run/nodecheck/agent/results.json")
RESULTS_MAX_AGE_RANGE_S = (1.0, DAY_S)
# HealthCheckProgram is killed at HealthCheckTimeout, 60 s and fixed before Slurm 26.05
# (slurm.conf.5): the budget leaves room for scontrol on either side.
HEALTH_BUDGET_RANGE_S = (1.0, 55.0)
SCONTROL_TIMEOUT_RANGE_S = (0.5, 30.0)
UNDRAIN_RUNS_RANGE = (1, 1000)


@record
class SlurmSettings:
    """[slurm]: how `nodecheck slurm health-check` judges and acts."""

    results_max_age_s: float = 300.0
    budget_s: float = 20.0
    scontrol_timeout_s: float = 5.0
    drain_on_error: bool = False
    undrain_after_runs: int = 3
    undrain_after_s: float = 0.0  # 0: by runs only
    reboot_on_xid: bool = False


# -- [remediation] -------------------------------------------------------------------


@record
class RemediationSettings:
    """[remediation]: which findings take the node out of service, the same for every way
    nodecheck does (`slurm health-check`'s drain, the Kubernetes taint), and whether it
    only says what it would do.

    Only a failure the node's own evidence shows ever does (Finding.node_failing: a job's
    variable never). Of those: a GPU hardware fault always (a GPU lost, an XID whose
    resolution is a reset or reboot, uncorrectable memory, NVLinks or NVSwitches down);
    a GPU performance failure when `performance` is on (a PCIe link trained below its
    width or speed, a compute RDMA rail down or slow, a GPU throttled by hardware, a
    benchmark far below its peers or its baseline): the node runs jobs, at a pace that
    holds every collective job spanning it back; the node's configuration (ACS on, a CPU
    governor, NUMA balancing, NCCL and allocator variables in /etc) never: often a
    fleet-wide default, reported (the log line, the metrics and alerts, the results file,
    a Kubernetes condition) and never a reason for a wave of drains."""

    performance: bool = True
    dry_run: bool = False
    # The fleet-wide circuit breaker (agent/slurm/breaker.py): at most this share of the
    # cluster's nodes, and this many, drained by nodecheck within the window; past it a
    # drain is withheld and reported.
    breaker_fraction: float = 0.1
    breaker_nodes: int = 50
    breaker_window_s: float = 3600.0

    def takes_out_of_service(self, finding: Finding) -> bool:
        if not finding.node_failing:
            return False
        if finding.fault_class is FaultClass.GPU_HARDWARE:
            return True
        return finding.fault_class is FaultClass.GPU_PERFORMANCE and self.performance


DEFAULT_POLICY = RemediationSettings()


# -- [kubernetes] --------------------------------------------------------------------
# The in-cluster service account's files (kubernetes-client/python
# kubernetes/config/incluster_config.py; Kubernetes docs, "Accessing the Kubernetes API
# from a Pod").
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
KUBE_RESEND_RANGE_S = (1.0, 3600.0)
KUBE_TAINT_AFTER_RANGE_S = (0.0, 3600.0)
KUBE_CLEAR_AFTER_RANGE_S = (0.0, DAY_S)
KUBE_TIMEOUT_RANGE_S = (0.5, 60.0)
# Projected service-account tokens are rotated by the kubelet (at 80 % of their life, an
# hour by default): the official client re-reads the file every minute, so no more than 60.
KUBE_TOKEN_REREAD_RANGE_S = (1.0, 60.0)
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", re.ASCII)  # RFC 1123 subdomain


@record
class KubernetesSettings:
    """[kubernetes]: what the agent tells the API server about its node."""

    enabled: bool = False
    taint: bool = False
    events: bool = True
    node_name: str | None = None  # None: $NODE_NAME
    api_server: str | None = None  # None: $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    token_file: Path = SERVICE_ACCOUNT_DIR / "token"
    ca_file: Path = SERVICE_ACCOUNT_DIR / "ca.crt"
    resend_interval_s: float = 300.0  # node-problem-detector's heartbeat period
    # The hysteresis (agent/kubernetes/reporter.py, FaultHold and ConditionHold): a fault stands
    # from its first sighting until it has been clear for clear_after_s; the taint goes
    # on once it has stood taint_after_s, off once clear for clear_after_s; a condition
    # turns worse at once, better once nothing worse was seen for clear_after_s. A link
    # that flaps every few seconds is one taint and one condition change, not dozens.
    taint_after_s: float = 30.0
    clear_after_s: float = 300.0
    timeout_s: float = 10.0
    token_reread_s: float = 60.0


@record
class AgentConfig:
    source: str = "embedded defaults"
    listen: str = f":{DEFAULT_PORT}"
    textfile_dir: Path | None = None
    expected_gpus: int | None = CheckConfig.expected_gpus
    kernel_log: Path | None = None
    nvml_timeout_s: float = CheckConfig.nvml_timeout_s
    state_dir: Path | None = None
    # The root snapshot (nodecheck-snapshot.timer) the agent serves root-only checks from.
    snapshot: Path | None = None
    # The latest results, written after every run for `slurm health-check` (None: not written).
    results_file: Path | None = DEFAULT_RESULTS_FILE
    # HTTPS and basic auth for /metrics and /results (as Prometheus exporters' web config).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    basic_auth_file: Path | None = None  # "user:<bcrypt hash>" lines (htpasswd -B)
    # Or all of that from the exporter toolkit's web configuration (agent/web/config.py).
    web_config_file: Path | None = None
    checks: dict[str, CheckSettings] = field(default_factory=dict)
    benchmarks: BenchmarkSettings = field(default_factory=BenchmarkSettings)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
    # [labels]: the operator's names for this node's place (cluster, partition, rack, ...).
    labels: dict[str, str] = field(default_factory=dict)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)

    def check(self, name: str) -> CheckSettings:
        return self.checks.get(name, CheckSettings())

    @property
    def state_folder(self) -> Path:
        """Where nodecheck keeps its state: state_dir, else checks/config.py's default
        (root's /var/lib/nodecheck), the same for the agent, slurm health-check and the
        prolog, which leave one another notes there."""
        return self.state_dir if self.state_dir is not None else default_state_dir()

    def check_config(self) -> CheckConfig:
        """The one CheckConfig of an AgentConfig, for the daemon, `npd` and `slurm`: what
        the file (or the command line) set, and checks/config.py's defaults for the rest."""
        bench = self.benchmarks
        options = BenchOptions(
            device=bench.device,
            duration_s=bench.duration_s,
            idle_window_s=bench.idle_window_s,
            memory_fraction=bench.memory_fraction,
            network_max_age_s=bench.network_max_age_s,
            thresholds=Thresholds(warn=bench.warn_below, fail=bench.fail_below),
        )
        if self.state_dir is not None:
            options = replace(options, state_dir=self.state_dir)
        return CheckConfig(
            expected_gpus=self.expected_gpus, nvml_timeout_s=self.nvml_timeout_s, bench=options
        )

    def show(self, registered: Mapping[str, Check] | None = None) -> str:
        """The effective configuration as TOML (strings quoted as TOML basic strings):
        every key the file may set, with its value. A key the file may leave unset (its
        value then worked out on the node, such as "the GPUs on the PCI bus", or a default
        that depends on who runs nodecheck) is a comment saying what unset means, so the
        text is still a configuration that reads back to this one. `registered`: the
        registered checks, each shown under [checks.NAME] with its own interval and
        timeout where the file leaves them; None shows only the checks the file names."""

        def quoted(value: object) -> str:
            return toml_basic_string(str(value))

        def unset(key: str, meaning: str) -> str:
            return f"# {key} = ...  (unset: {meaning})"

        def optional(key: str, value: object, meaning: str) -> str:
            if value is None:
                return unset(key, meaning)
            return f"{key} = {value if isinstance(value, int) else quoted(value)}"

        lines = [
            f"# effective configuration ({self.source}); a key commented out is unset",
            "[agent]",
        ]
        lines.append(f"listen = {quoted(self.listen)}")
        lines.append(f"textfile_dir = {quoted(self.textfile_dir or '')}")
        lines += [
            optional("expected_gpus", self.expected_gpus, "the GPUs on the PCI bus; 0 to 1024"),
            optional("kernel_log", self.kernel_log, "/dev/kmsg under --rootfs"),
            f"nvml_timeout = {self.nvml_timeout_s}",
            optional(
                "state_dir",
                self.state_dir,
                "/var/lib/nodecheck as root, else $XDG_STATE_HOME/nodecheck",
            ),
            optional(
                "snapshot",
                self.snapshot,
                "none; the root-only checks read the node as the agent's user",
            ),
            f"results_file = {quoted(self.results_file or '')}",
            optional(
                "tls_cert_file", self.tls_cert_file, "none; HTTPS when both TLS files are set"
            ),
            optional("tls_key_file", self.tls_key_file, "none; HTTPS when both TLS files are set"),
            optional("basic_auth_file", self.basic_auth_file, "none; no authentication"),
            optional(
                "web_config_file",
                self.web_config_file,
                "none; TLS and basic auth from the keys above",
            ),
        ]
        names = sorted(set(self.checks) | set(registered or {}))
        for name in names:
            settings = self.check(name)
            declared = (registered or {}).get(name)
            interval = settings.interval_s or (declared.interval_s if declared else None)
            timeout = settings.timeout_s or (declared.timeout_s if declared else None)
            lines += ["", f"[checks.{name}]", f"enabled = {str(settings.enabled).lower()}"]
            lines.append(
                unset("interval", "the check's own")
                if interval is None
                else f"interval = {float(interval)}"
            )
            lines.append(
                unset("timeout", "the check's own")
                if timeout is None
                else f"timeout = {float(timeout)}"
            )
        bench = self.benchmarks
        lines += [
            "",
            "[benchmarks]",
            f"enabled = {str(bench.enabled).lower()}",
            f"interval = {bench.interval_s}",
            f"duration = {bench.duration_s}",
            f"device = {quoted(bench.device)}",
            f"idle_window = {bench.idle_window_s}",
            f"warn_below = {bench.warn_below}",
            f"fail_below = {bench.fail_below}",
            f"memory_fraction = {bench.memory_fraction}",
            f"network_max_age = {bench.network_max_age_s}",
        ]
        slurm = self.slurm
        lines += [
            "",
            "[slurm]",
            f"results_max_age = {slurm.results_max_age_s}",
            f"budget = {slurm.budget_s}",
            f"scontrol_timeout = {slurm.scontrol_timeout_s}",
            f"drain_on_error = {str(slurm.drain_on_error).lower()}",
            f"undrain_after_runs = {slurm.undrain_after_runs}",
            f"undrain_after = {slurm.undrain_after_s}",
            f"reboot_on_xid = {str(slurm.reboot_on_xid).lower()}",
        ]
        remediation = self.remediation
        lines += [
            "",
            "[remediation]",
            f"performance = {str(remediation.performance).lower()}",
            f"dry_run = {str(remediation.dry_run).lower()}",
            f"breaker_fraction = {remediation.breaker_fraction}",
            f"breaker_nodes = {remediation.breaker_nodes}",
            f"breaker_window = {remediation.breaker_window_s}",
        ]
        lines += ["", "[labels]"]
        lines += [f"{name} = {quoted(value)}" for name, value in sorted(self.labels.items())]
        if not self.labels:
            lines.append(unset("NAME", 'no labels; any names, cluster = "c1" for one'))
        kube = self.kubernetes
        lines += [
            "",
            "[kubernetes]",
            f"enabled = {str(kube.enabled).lower()}",
            f"taint = {str(kube.taint).lower()}",
            f"events = {str(kube.events).lower()}",
            f"node_name = {quoted(kube.node_name or '')}",
            f"api_server = {quoted(kube.api_server or '')}",
            f"token_file = {quoted(kube.token_file)}",
            f"ca_file = {quoted(kube.ca_file)}",
            f"resend_interval = {kube.resend_interval_s}",
            f"taint_after = {kube.taint_after_s}",
            f"clear_after = {kube.clear_after_s}",
            f"timeout = {kube.timeout_s}",
            f"token_reread = {kube.token_reread_s}",
        ]
        return "\n".join(lines) + "\n"


def key_line(text: str, table: tuple[str, ...], key: str | None) -> int | None:
    """The line of `key` in `[table]` (or of the table header when key is None)."""
    current: tuple[str, ...] = ()
    header = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
    for number, line in enumerate(text.splitlines(), start=1):
        match = header.match(line)
        if match:
            current = tuple(part.strip().strip('"') for part in match.group(1).split("."))
            if key is None and current == table:
                return number
            continue
        if (
            key is not None
            and current == table
            and re.match(rf"^\s*\"?{re.escape(key)}\"?\s*[=.]", line)
        ):
            return number
    return None


def _range_text(low: float, high: float, low_open: bool, unit: str) -> str:
    """ "from 1 to 2592000 seconds (30 days)", "above 0 and at most 1"."""

    def number(value: float) -> str:
        return f"{value:g}" if value < 1e6 else f"{value:.0f}"

    start, end = (
        (f"above {number(low)} and at most", "") if low_open else (f"from {number(low)}", "to")
    )
    allowed = " ".join(part for part in (start, end, number(high), unit) if part)
    if unit == "seconds" and high >= DAY_S:
        allowed += f" ({high / DAY_S:g} days)"
    return allowed


class _Reader:
    """Takes values out of one parsed table, checking each one's type and range."""

    def __init__(self, path: Path, text: str, table: tuple[str, ...], data: dict[str, Any]):
        self.path, self.text, self.table, self.data = path, text, table, dict(data)

    def fail(self, key: str | None, reason: str) -> ConfigError:
        line = key_line(self.text, self.table, key)
        if line is None and key is not None:  # a table, not a value: [agent.extra]
            line = key_line(self.text, (*self.table, key), None)
        dotted = ".".join((*self.table, key) if key else self.table)
        return ConfigError(self.path, line, dotted, reason)

    def take(self, key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        if key not in self.data:
            return default
        value = self.data.pop(key)
        # bool is an int in Python; a number where a bool goes (or the reverse) is a mistake.
        kinds = kind if isinstance(kind, tuple) else (kind,)
        wrong_bool = isinstance(value, bool) and bool not in kinds
        if wrong_bool or not isinstance(value, kinds):
            raise self.fail(key, f"expected {_expected(kinds)}, got {_described(value)}")
        return value

    def text_value(self, key: str, default: str | None) -> str | None:
        value: str | None = self.take(key, str, default)
        if value is not None and "\x00" in value:
            raise self.fail(key, "contains a NUL character")
        return value

    def path_value(self, key: str) -> Path | None:
        """A path value: "" or absent for none; absolute, since the agent does not run in
        the directory `config check` was run from."""
        value = self.text_value(key, None)
        if not value:
            return None
        if not value.startswith("/"):
            raise self.fail(key, f"must be an absolute path, got {_shown(value)}")
        return Path(value)

    def number(
        self,
        key: str,
        default: float,
        low: float,
        high: float,
        *,
        low_open: bool = False,
        unit: str = "seconds",
    ) -> float:
        """A finite number in [low, high] (or (low, high]); NaN and infinities refused."""
        value = self.optional_number(key, low, high, low_open=low_open, unit=unit)
        return default if value is None else value

    def optional_number(
        self, key: str, low: float, high: float, *, low_open: bool = False, unit: str = "seconds"
    ) -> float | None:
        if key not in self.data:
            return None
        value = self.take(key, (int, float), None)
        allowed = _range_text(low, high, low_open, unit)
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(key, f"must be a finite number {allowed}, got {value}")
        # int compared with float is exact in Python, even for a 30-digit int.
        if (value <= low if low_open else value < low) or value > high:
            raise self.fail(key, f"must be {allowed}, got {_shown(value)}")
        return float(value)

    def done(self) -> None:
        for key in self.data:
            raise self.fail(key, "unknown key")


WEB_KEYS = ("tls_cert_file", "tls_key_file", "basic_auth_file")


def web_config_conflict(config: AgentConfig) -> tuple[str, str] | None:
    """(key, why) when web_config_file is set with a key it replaces, else None."""
    if config.web_config_file is None:
        return None
    given = [key for key in WEB_KEYS if getattr(config, key) is not None]
    if not given:
        return None
    moves = {
        "tls_cert_file": "tls_server_config: cert_file",
        "tls_key_file": "tls_server_config: key_file",
        "basic_auth_file": "basic_auth_users (user: <bcrypt hash>)",
    }
    return given[0], (
        f"set with web_config_file: write {', '.join(moves[key] for key in given)} in "
        f"{config.web_config_file} and remove {', '.join(given)}"
    )


def web_config_problem(path: Path) -> str | None:
    """Why the web configuration file cannot be used (file:line: key: why), or None."""
    from nodecheck.agent.web.config import WebConfigError, load_web_config

    try:
        load_web_config(path)
    except WebConfigError as err:
        return str(err)
    return None


def _named_file_problem(key: str, path: Path) -> str | None:
    """Why a file the configuration names cannot be used, or None."""
    try:
        text = read_text_file(path)
    except UnreadableFileError as err:
        where = f"{path}:{err.line}" if err.line else str(path)
        return f"{where}: {err.reason}"
    if key == "basic_auth_file":
        from nodecheck.agent.web.auth import parse_basic_auth

        try:
            parse_basic_auth(text, str(path))
        except ValueError as err:
            return str(err)
    if key == "tls_cert_file" and "BEGIN CERTIFICATE" not in text:
        return f"{path}: not a PEM certificate"
    if key == "tls_key_file" and "PRIVATE KEY" not in text:
        return f"{path}: not a PEM private key"
    return None


# The kmsg device: character major 1, minor 11 (the kernel's
# Documentation/admin-guide/devices.txt); any other device is no kernel log.
KMSG_DEVICE = (1, 11)


def kernel_log_problem(path: Path) -> str | None:
    """A kernel log must be there to be read: a regular file (a log) or the kmsg device
    (/dev/kmsg, by its numbers, wherever its node is); a directory, a FIFO or another
    device (/dev/null, a tty) is a mistake."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return f"{path}: no such file"
    except OSError as err:
        return f"{path}: {err.strerror or err}"
    except ValueError:  # a NUL in the path
        return f"{path!r}: the path has a NUL character"
    mode = info.st_mode
    if stat.S_ISCHR(mode):
        numbers = (os.major(info.st_rdev), os.minor(info.st_rdev))
        if numbers != KMSG_DEVICE:
            return (
                f"{path}: a character device {numbers[0]}:{numbers[1]}, not the kmsg device "
                f"(1:11, /dev/kmsg) or a log file"
            )
    elif not stat.S_ISREG(mode):
        return f"{path}: {file_kind(mode)}, not a log file or /dev/kmsg"
    if not os.access(path, os.R_OK):
        return f"{path}: not readable by this user (uid {os.geteuid()})"
    return None


def snapshot_problem(path: Path) -> str | None:
    """The snapshot is written later, by nodecheck-snapshot.timer (whose RuntimeDirectory=
    creates /run/nodecheck), so neither it nor its directory need exist yet; until it does
    the agent reports the snapshot's checks as an error. Something other than a file in
    its place is a mistake now."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"{path}: {err.strerror or err}"
    if not stat.S_ISREG(mode):
        return f"{path}: {file_kind(mode)}, not a snapshot file"
    return None


# No configuration of nodecheck's nests deeper than three levels.
MAX_NESTING = 32


def nesting_problem(text: str) -> tuple[int, str] | None:
    """(line, what) when the TOML text nests keys or brackets deeper than MAX_NESTING.

    tomllib takes time quadratic in a dotted key's depth (20,000 levels: half a minute)
    and recursion for brackets, so depth is checked first, outside strings and comments,
    in one pass. Dots count towards a key's depth between two of `= , { } [ ]` or a
    line end (a float's one dot, or a date's, never comes near the limit)."""
    if text.count(".") <= MAX_NESTING and text.count("[") + text.count("{") <= MAX_NESTING:
        return None
    line, depth, dots, index, size = 1, 0, 0, 0, len(text)
    while index < size:
        char = text[index]
        if char in "\"'":
            quote = char * 3 if text.startswith(char * 3, index) else char
            end = index + len(quote)
            while end < size:
                if quote[0] == '"' and text[end] == "\\":
                    end += 2
                    continue
                if text.startswith(quote, end):
                    break
                if text[end] == "\n" and len(quote) == 1:
                    break  # an unclosed string: tomllib will say so
                end += 1
            line += text.count("\n", index, end)
            index = end + len(quote)
            continue
        if char == "#":
            end = text.find("\n", index)
            index = size if end < 0 else end
            continue
        if char == "\n":
            line, dots = line + 1, 0
        elif char == ".":
            dots += 1
            if dots > MAX_NESTING:
                return line, f"nested too deeply: a key of more than {MAX_NESTING} levels"
        elif char in "[{":
            depth, dots = depth + 1, 0
            if depth > MAX_NESTING:
                what = f"arrays or inline tables of more than {MAX_NESTING} levels"
                return line, f"nested too deeply: {what}"
        elif char in "]}":
            depth, dots = max(depth - 1, 0), 0
        elif char in "=,":
            dots = 0
        index += 1
    return None


def parse_config(text: str, path: Path, known_checks: set[str]) -> AgentConfig:
    """AgentConfig from TOML text; ConfigError naming the file, line and key."""
    deep = nesting_problem(text)
    if deep is not None:
        raise ConfigError(path, deep[0], "", deep[1])
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        match = re.search(r"line (\d+)", str(err))
        raise ConfigError(path, int(match.group(1)) if match else None, "", str(err)) from None
    except RecursionError:
        raise ConfigError(
            path, None, "", "nested too deeply (arrays, inline tables or dotted keys)"
        ) from None
    except ValueError as err:  # an integer of over 4300 digits, for one
        raise ConfigError(path, None, "", f"not usable TOML: {err}") from None
    config = AgentConfig(source=str(path))
    root = _Reader(path, text, (), document)
    agent = root.take("agent", dict, {})
    checks = root.take("checks", dict, {})
    benchmarks = root.take("benchmarks", dict, {})
    slurm = root.take("slurm", dict, {})
    remediation = root.take("remediation", dict, {})
    labels = root.take("labels", dict, {})
    kubernetes = root.take("kubernetes", dict, {})
    root.done()

    section = _Reader(path, text, ("agent",), agent)
    listen = section.text_value("listen", config.listen) or ""
    if listen:
        try:
            parse_listen(listen)
        except ValueError as err:
            raise section.fail("listen", str(err)) from None
    textfile = section.path_value("textfile_dir")
    if textfile is not None:
        problem = output_directory_problem(textfile, writable=True)
        if problem:
            raise section.fail("textfile_dir", f"{textfile}: {problem}")
    expected = section.take("expected_gpus", int, None)
    if expected is not None and not 0 <= expected <= MAX_EXPECTED_GPUS:
        raise section.fail(
            "expected_gpus", f"must be from 0 to {MAX_EXPECTED_GPUS}, got {_shown(expected)}"
        )
    kernel_log = section.path_value("kernel_log")
    if kernel_log is not None:
        problem = kernel_log_problem(kernel_log)
        if problem:
            raise section.fail("kernel_log", problem)
    timeout = section.number("nvml_timeout", config.nvml_timeout_s, *NVML_TIMEOUT_RANGE_S)
    state_dir = section.path_value("state_dir")
    # A folder it is given must exist, as every folder nodecheck writes in; only its own
    # default one is created (and not yet when the configuration is checked).
    if state_dir is not None:
        problem = output_directory_problem(state_dir)
        if problem and not (problem == NO_SUCH_DIRECTORY and is_default_state_dir(state_dir)):
            raise section.fail("state_dir", f"{state_dir}: {problem}")
    snapshot = section.path_value("snapshot")
    if snapshot is not None:
        problem = snapshot_problem(snapshot)
        if problem:
            raise section.fail("snapshot", problem)
    results_file: Path | None = DEFAULT_RESULTS_FILE
    if "results_file" in section.data:
        results_file = section.path_value("results_file")
    web = {
        key: section.path_value(key) for key in ("tls_cert_file", "tls_key_file", "basic_auth_file")
    }
    cert, key = web["tls_cert_file"], web["tls_key_file"]
    web_config = section.path_value("web_config_file")
    conflict = web_config_conflict(
        AgentConfig(
            tls_cert_file=cert,
            tls_key_file=key,
            basic_auth_file=web["basic_auth_file"],
            web_config_file=web_config,
        )
    )
    if conflict is not None:
        raise section.fail(*conflict)
    if (cert is None) != (key is None):
        missing = "tls_key_file" if cert else "tls_cert_file"
        raise section.fail(missing, "TLS needs both tls_cert_file and tls_key_file")
    for name, value in web.items():
        if value is not None:
            problem = _named_file_problem(name, value)
            if problem:
                raise section.fail(name, problem)
    if cert is not None and key is not None:
        # The server's own loader: a key that does not match the certificate, or one
        # encrypted with a pass phrase (which would make the agent prompt on a terminal).
        from nodecheck.agent.web.tls import tls_context

        try:
            tls_context(cert, key)
        except (ValueError, TypeError) as err:  # tls_context names the file
            blamed = "tls_cert_file" if str(cert) in str(err) and str(key) not in str(err) else ""
            raise section.fail(blamed or "tls_key_file", str(err)) from None
    if web_config is not None:
        problem = web_config_problem(web_config)
        if problem:
            raise section.fail("web_config_file", problem)
    section.done()

    settings: dict[str, CheckSettings] = {}
    for name, values in checks.items():
        table = _Reader(path, text, ("checks", name), {})
        if name not in known_checks:
            raise table.fail(
                None,
                f"no check named {_shown(name)} (checks: {', '.join(sorted(known_checks))})",
            )
        if not isinstance(values, dict):
            raise _Reader(path, text, ("checks",), {}).fail(
                name, f"expected a table, got {_described(values)}"
            )
        table = _Reader(path, text, ("checks", name), values)
        settings[name] = CheckSettings(
            enabled=table.take("enabled", bool, True),
            interval_s=table.optional_number("interval", *INTERVAL_RANGE_S),
            timeout_s=table.optional_number("timeout", 0, CHECK_TIMEOUT_MAX_S, low_open=True),
        )
        table.done()

    bench = _Reader(path, text, ("benchmarks",), benchmarks)
    defaults = BenchmarkSettings()
    device = bench.text_value("device", defaults.device)
    if device not in ("cuda", "cpu"):
        raise bench.fail("device", f'expected "cuda" or "cpu", got {_shown(device)}')
    warn_below = bench.number(
        "warn_below", defaults.warn_below, *RATIO_RANGE, low_open=True, unit=""
    )
    fail_below = bench.number(
        "fail_below", defaults.fail_below, *RATIO_RANGE, low_open=True, unit=""
    )
    if fail_below > warn_below:
        raise bench.fail("fail_below", "must not be above warn_below")
    bench_settings = BenchmarkSettings(
        enabled=bench.take("enabled", bool, defaults.enabled),
        interval_s=bench.number("interval", defaults.interval_s, *INTERVAL_RANGE_S),
        duration_s=bench.number("duration", defaults.duration_s, *BENCH_DURATION_RANGE_S),
        device=device or defaults.device,
        idle_window_s=bench.number("idle_window", defaults.idle_window_s, *IDLE_WINDOW_RANGE_S),
        warn_below=warn_below,
        fail_below=fail_below,
        memory_fraction=bench.number(
            "memory_fraction", defaults.memory_fraction, *MEMORY_FRACTION_RANGE, unit=""
        ),
        network_max_age_s=bench.number(
            "network_max_age", defaults.network_max_age_s, *NETWORK_MAX_AGE_RANGE_S
        ),
    )
    bench.done()
    return replace(
        _with_kubernetes(
            _with_labels(
                _with_remediation(_with_slurm(config, path, text, slurm), path, text, remediation),
                path,
                text,
                labels,
            ),
            path,
            text,
            kubernetes,
        ),
        listen=listen,
        textfile_dir=textfile,
        expected_gpus=expected,
        kernel_log=kernel_log,
        nvml_timeout_s=timeout,
        state_dir=state_dir,
        snapshot=snapshot,
        results_file=results_file,
        tls_cert_file=cert,
        tls_key_file=key,
        basic_auth_file=web["basic_auth_file"],
        web_config_file=web_config,
        checks=settings,
        benchmarks=bench_settings,
    )


def _with_slurm(config: AgentConfig, path: Path, text: str, values: dict[str, Any]) -> AgentConfig:
    table = _Reader(path, text, ("slurm",), values)
    defaults = SlurmSettings()
    runs = table.take("undrain_after_runs", int, defaults.undrain_after_runs)
    if not UNDRAIN_RUNS_RANGE[0] <= runs <= UNDRAIN_RUNS_RANGE[1]:
        raise table.fail(
            "undrain_after_runs",
            f"must be from {UNDRAIN_RUNS_RANGE[0]} to {UNDRAIN_RUNS_RANGE[1]}, got {_shown(runs)}",
        )
    settings = SlurmSettings(
        results_max_age_s=table.number(
            "results_max_age", defaults.results_max_age_s, *RESULTS_MAX_AGE_RANGE_S
        ),
        budget_s=table.number("budget", defaults.budget_s, *HEALTH_BUDGET_RANGE_S),
        scontrol_timeout_s=table.number(
            "scontrol_timeout", defaults.scontrol_timeout_s, *SCONTROL_TIMEOUT_RANGE_S
        ),
        drain_on_error=table.take("drain_on_error", bool, defaults.drain_on_error),
        undrain_after_runs=runs,
        undrain_after_s=table.number("undrain_after", defaults.undrain_after_s, 0, 30 * DAY_S),
        reboot_on_xid=table.take("reboot_on_xid", bool, defaults.reboot_on_xid),
    )
    table.done()
    return replace(config, slurm=settings)


def _with_remediation(
    config: AgentConfig, path: Path, text: str, values: dict[str, Any]
) -> AgentConfig:
    table = _Reader(path, text, ("remediation",), values)
    defaults = RemediationSettings()
    nodes = table.take("breaker_nodes", int, defaults.breaker_nodes)
    if not 1 <= nodes <= 100_000:
        raise table.fail("breaker_nodes", f"must be from 1 to 100000, got {_shown(nodes)}")
    fraction = table.number(
        "breaker_fraction", defaults.breaker_fraction, 0.0, 1.0, low_open=True, unit=""
    )
    settings = RemediationSettings(
        performance=table.take("performance", bool, defaults.performance),
        dry_run=table.take("dry_run", bool, defaults.dry_run),
        breaker_fraction=fraction,
        breaker_nodes=nodes,
        breaker_window_s=table.number("breaker_window", defaults.breaker_window_s, 60.0, 7 * DAY_S),
    )
    table.done()
    return replace(config, remediation=settings)


def node_label_problem(name: str, value: object) -> str | None:
    """Why `name = value` cannot be a label of nodecheck_node_info, or None."""
    if not NODE_LABEL_NAME.fullmatch(name):
        return "not a Prometheus label name (letters, digits and _, not starting with a digit)"
    if name.startswith("__"):
        return "names starting with __ are reserved for Prometheus's internal use"
    if name in RESERVED_NODE_LABELS:
        return f"{name!r} is a label nodecheck's series or Prometheus already use"
    if not isinstance(value, str) or isinstance(value, bool):
        return f"expected a string, got {_described(value)}"
    if not value:
        return "empty: leave the label out instead (an empty value is no label in Prometheus)"
    if len(value) > MAX_NODE_LABEL_VALUE:
        return f"at most {MAX_NODE_LABEL_VALUE} characters, got {len(value)}"
    if not value.isprintable():
        return f"only printable characters, got {_shown(value)}"
    return None


def _with_labels(config: AgentConfig, path: Path, text: str, values: dict[str, Any]) -> AgentConfig:
    table = _Reader(path, text, ("labels",), values)
    if len(values) > MAX_NODE_LABELS:
        raise table.fail(None, f"at most {MAX_NODE_LABELS} labels, got {len(values)}")
    labels: dict[str, str] = {}
    for name, value in values.items():
        problem = node_label_problem(name, value)
        if problem is not None:
            raise table.fail(name, problem)
        labels[name] = table.take(name, str, "")
    table.done()
    return replace(config, labels=labels)


def _with_kubernetes(
    config: AgentConfig, path: Path, text: str, values: dict[str, Any]
) -> AgentConfig:
    table = _Reader(path, text, ("kubernetes",), values)
    defaults = KubernetesSettings()
    node_name = table.text_value("node_name", None) or None
    if node_name is not None and not _NODE_NAME.fullmatch(node_name):
        raise table.fail(
            "node_name", f"not a Kubernetes node name (RFC 1123 subdomain): {_shown(node_name)}"
        )
    api_server = table.text_value("api_server", None) or None
    if api_server is not None:
        from urllib.parse import urlsplit

        parts = urlsplit(api_server)
        try:
            port_ok = parts.port is None or 0 < parts.port < 65536
        except ValueError:
            port_ok = False
        if (
            parts.scheme != "https"
            or not parts.hostname
            or not port_ok
            or parts.path not in ("", "/")
        ):
            raise table.fail(
                "api_server", f"expected https://host[:port], got {_shown(api_server)}"
            )
    settings = KubernetesSettings(
        enabled=table.take("enabled", bool, defaults.enabled),
        taint=table.take("taint", bool, defaults.taint),
        events=table.take("events", bool, defaults.events),
        node_name=node_name,
        api_server=api_server,
        token_file=table.path_value("token_file") or defaults.token_file,
        ca_file=table.path_value("ca_file") or defaults.ca_file,
        resend_interval_s=table.number(
            "resend_interval", defaults.resend_interval_s, *KUBE_RESEND_RANGE_S
        ),
        taint_after_s=table.number(
            "taint_after", defaults.taint_after_s, *KUBE_TAINT_AFTER_RANGE_S
        ),
        clear_after_s=table.number(
            "clear_after", defaults.clear_after_s, *KUBE_CLEAR_AFTER_RANGE_S
        ),
        timeout_s=table.number("timeout", defaults.timeout_s, *KUBE_TIMEOUT_RANGE_S),
        token_reread_s=table.number(
            "token_reread", defaults.token_reread_s, *KUBE_TOKEN_REREAD_RANGE_S
        ),
    )
    table.done()
    return replace(config, kubernetes=settings)


def load_config(path: Path | None, known_checks: set[str]) -> AgentConfig:
    """The file's configuration; the embedded defaults when `path` is None, or when it is
    the default path and absent (a node set up without a file)."""
    if path is None:
        return AgentConfig()
    try:
        text = read_text_file(path)
    except UnreadableFileError as err:
        if err.missing and path == DEFAULT_PATH:
            return AgentConfig()
        raise ConfigError(path, err.line, "", err.reason) from None
    return parse_config(text, path, known_checks)
