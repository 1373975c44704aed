"""`nodecheck agent`: the checks on their schedule, exported to Prometheus, under systemd.

- READY=1 is sent to systemd once every enabled check has a first result, and
  STATUS= carries a one-line summary after each run.
- WATCHDOG=1 is sent only while the scheduler loop turns: a stalled scheduler
  stops the pings and systemd restarts the agent.
- SIGTERM/SIGINT stop it within 2 s; SIGHUP reloads the configuration, the basic-auth
  users and the TLS certificate and key, or the web configuration file (its TLS
  settings, headers and users); nvml_timeout applies to the next NVML call.
  A bad file (or any failure while reloading) keeps the old configuration, says so in
  the log (event=reload_failed) and in nodecheck_config_last_reload_successful 0; the
  agent keeps serving. Changing listen, or turning TLS or basic auth on or off, takes
  a restart (refused the same way).
- An address it cannot listen on is a ListenError naming it (the command exits 2).
- An NVML XID event re-runs gpu_xid at once instead of at the next poll.
- With [kubernetes] enabled, the latest results go to the Kubernetes reporter after each
  run once every enabled check has one (agent/kubernetes/reporter.py, on its own thread).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import signal
import socket
import threading
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol

from nodecheck.agent.config import (
    AgentConfig,
    ConfigError,
    UnreadableFileError,
    load_config,
    parse_listen,
    read_text_file,
    web_config_conflict,
)
from nodecheck.agent.daemon.exporter import (
    CachedExposition,
    ResultCollector,
    make_registry,
    write_textfile,
)
from nodecheck.agent.daemon.results_file import ResultsFile, served_document, stored_document
from nodecheck.agent.daemon.scheduler import ResultStore, Scheduler
from nodecheck.agent.daemon.snapshot import from_snapshot
from nodecheck.agent.findings import StoredRun, findings_of
from nodecheck.agent.web.auth import BasicAuth, parse_basic_auth
from nodecheck.agent.web.config import WebConfig, WebConfigError, load_web_config
from nodecheck.agent.web.server import serve
from nodecheck.checks.context import CheckContext, SharedReads
from nodecheck.checks.lazy_logging import get_logger
from nodecheck.checks.node.aer import AerHistory
from nodecheck.checks.node.facts import LiveFacts, NodeSources, hostname_shown
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.gpu import GpuHistory
from nodecheck.checks.node.net import PortCounterHistory
from nodecheck.checks.node.nvml import NvmlSession
from nodecheck.checks.node.xid import XidEvent, XidListener, XidLog
from nodecheck.checks.registry import Check, load_benchmarks, load_checks
from nodecheck.checks.result import Status
from nodecheck.checks.runner import CheckRun

if TYPE_CHECKING:
    from nodecheck.agent.kubernetes.reporter import KubernetesReporter

log = get_logger(__name__)
TEXTFILE_EVERY_S = 15.0
# The GPU checks fall due within seconds of each other: one NVML read serves them all.
# Below the 30 s of gpu_throttle, so rates are still taken between distinct readings.
SHARED_READS_TTL_S = 10.0


def notify(message: str) -> None:
    """sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET, if set."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), address)
    except OSError as err:
        log.warning("event=notify_failed error=%r", str(err))


class ListenError(Exception):
    """The agent cannot serve on the address it was given: which, and why."""


class HttpServing(Protocol):
    """What the agent needs of the server web.server.serve() started."""

    def shutdown(self) -> None: ...

    def server_close(self) -> None: ...

    def reload_tls(self) -> None:
        """Re-read the certificate and key it was started with; ValueError naming the
        file when they are unusable (the old ones stay)."""

    def apply_web_config(self, web: WebConfig) -> None:
        """Serve a web configuration read again: its TLS context and headers."""


# What errno means to an operator choosing an address (errno(3), bind(2), getaddrinfo(3)).
_BIND_REASONS = {
    errno.EADDRINUSE: "address in use (another process listens there)",
    errno.EADDRNOTAVAIL: "address not available: no interface of this host has it",
    errno.EACCES: "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)",
}


def listen_failure(listen: str, err: Exception) -> ListenError:
    """A bind or resolution failure as one sentence naming the address."""
    if isinstance(err, ValueError):  # web.server.serve(): the TLS files it was given
        return ListenError(f"cannot serve on {listen}: {err}")
    if isinstance(err, socket.gaierror):
        reason = f"host not found ({err.strerror or err})"
    elif isinstance(err, OSError) and err.errno in _BIND_REASONS:
        reason = _BIND_REASONS[err.errno]
    elif isinstance(err, OSError):
        reason = err.strerror or str(err)
    else:
        reason = str(err)
    return ListenError(f"cannot listen on {listen}: {reason}")


def watchdog_interval(value: str | None) -> float | None:
    """Seconds of systemd's watchdog from WATCHDOG_USEC (sd_watchdog_enabled(3): a
    positive decimal number of microseconds), or None. Anything else is logged and
    ignored: an exception here would end the thread that also writes the textfile."""
    if not value:
        return None
    if not (value.isascii() and value.isdigit() and 0 < int(value) < 10**12):
        # The value itself is not logged: only audited variables' values ever are.
        log.warning("event=watchdog_ignored reason=%r", "WATCHDOG_USEC is not microseconds")
        return None
    return int(value) / 1e6


def _reaches_other_hosts(host: str) -> bool:
    """False only for loopback: "" (every interface) and any other address do."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host.partition("%")[0]).is_loopback
    except ValueError:
        return True  # a host name: whatever it resolves to


def _version() -> str:
    try:
        return metadata.version("nodecheck")
    except metadata.PackageNotFoundError:
        return "unknown"


def _log_web_notes(web: WebConfig) -> None:
    """What the agent serves differently from node_exporter for this file (http2)."""
    for note in web.notes:
        log.info("event=web_config_note file=%s note=%r", web.source, note)


class Agent:
    def __init__(
        self,
        fs: NodeFS,
        config_path: Path | None,
        nvml_library: str | None,
        overrides: dict[str, object] | None = None,
    ) -> None:
        self.fs = fs
        self.started_at = time.time()  # nodecheck_agent_start_time_seconds
        self.config_path = config_path
        self.nvml_library = nvml_library
        # Command-line settings over the file's, kept across reloads.
        self.overrides = overrides or {}
        self.available = load_checks()
        self.benchmarks = load_benchmarks()
        self.config = self._load()
        # What every check is judged under: built once per configuration (again on each
        # reload), shared by every context.
        self.check_config = self.config.check_config()
        self.web = self._web(self.config)
        self.auth = self._auth(self.config, self.web)
        self.reload_ok = True
        self.store = ResultStore()
        self.history = GpuHistory()
        self.port_counter_history = PortCounterHistory()
        self.aer_history = AerHistory()
        self.shared = SharedReads(ttl_s=SHARED_READS_TTL_S)
        self.xid_log = XidLog()
        self.nvml = NvmlSession(
            deadline_s=self.check_config.nvml_timeout_s, library_path=nvml_library
        )
        self.hostname = hostname_shown(LiveFacts(NodeSources(fs=fs, environ={})))
        # The path of the configuration in force: a reload may change it.
        self.results_file = ResultsFile(lambda: self.config.results_file)
        self.registry = make_registry(
            ResultCollector(
                self.store,
                _version(),
                lambda: self.reload_ok,
                self._node_labels,
                started_at=self.started_at,
                results_writes=self.results_file.state,
                remediation_withheld=self._remediation_withheld,
            )
        )
        self.scheduler = self._scheduler()
        self.listener: XidListener | None = None
        self.server: HttpServing | None = None
        self._stop = threading.Event()
        self._ready = False
        # One writer at a time: a slower one never replaces newer results with older.
        self._results_lock = threading.Lock()
        self.kubernetes = self._kubernetes(self.config)

    # -- wiring ------------------------------------------------------------------

    def _checks(self, config: AgentConfig) -> list[tuple[Check, float]]:
        chosen = []
        for name, registered in self.available.items():
            settings = config.check(name)
            if not settings.enabled:
                continue
            check = registered
            if config.snapshot is not None and registered.root:
                # Judged here, with this agent's configuration, over what root captured.
                check = from_snapshot(registered, config.snapshot)
            if settings.timeout_s is not None:
                check = replace(check, timeout_s=settings.timeout_s)
            chosen.append((check, settings.interval_s or check.interval_s))
        if config.benchmarks.enabled:
            # Rarely, one at a time, and each only through its job-safety gate.
            chosen += [(bench, config.benchmarks.interval_s) for bench in self.benchmarks.values()]
        return chosen

    def _context(self) -> CheckContext:
        return CheckContext(
            fs=self.fs,
            environ={},  # the agent's own environment is not a job's
            nvml=self.nvml,
            gpu_history=self.history,
            port_counter_history=self.port_counter_history,
            aer_history=self.aer_history,
            xid_log=self.xid_log,
            kernel_log=self.config.kernel_log,
            shared=self.shared,
            config=self.check_config,
        )

    def _scheduler(self, previous: Scheduler | None = None) -> Scheduler:
        return Scheduler(
            self._checks(self.config),
            self._context,
            self.store,
            self._after_run,
            exclusive=set(self.benchmarks),
            previous=previous,
        )

    def _after_run(self, run: CheckRun) -> None:
        stored = self._write_results()
        enabled = self._fast_checks(self.config)
        have = {s.run.check.name for s in stored}
        statuses = [result.status for s in stored for result in s.run.results]
        worst = max(statuses, key=lambda status: status.severity, default=Status.SKIP)
        failing = sorted({s.run.check.name for s in stored if s.run.status is Status.FAIL})
        summary = f"{worst.value}: {len(have)} checks" + (
            f", failing: {', '.join(failing)}" if failing else ""
        )
        if self.kubernetes is not None and enabled <= have:
            self.kubernetes.update([(s.run.check.name, findings_of(s.run)) for s in stored])
        if not self._ready and enabled <= have:
            self._ready = True
            notify(f"READY=1\nSTATUS={summary}")
            log.info("event=ready checks=%d", len(have))
        elif self._ready:
            notify(f"STATUS={summary}")

    @staticmethod
    def _kubernetes(config: AgentConfig) -> KubernetesReporter | None:
        """The reporter when [kubernetes] is enabled; ConfigError when it cannot name the
        node or the API server."""
        if not config.kubernetes.enabled:
            return None
        from nodecheck.agent.kubernetes.reporter import KubernetesReporter

        return KubernetesReporter.from_environment(config.kubernetes, config.remediation)

    def _write_results(self) -> list[StoredRun]:
        """The latest results, for `nodecheck slurm health-check`, whole or not at all
        (agent/daemon/results_file.py); the stored runs it wrote (read under the lock: the file
        holds at least what they hold once this returns). A failure is counted, logged
        when it starts and when it ends, and never raised: the scheduler's thread goes on."""
        with self._results_lock:
            stored = self.store.all()
            if self.config.results_file is None:
                return stored
            self.results_file.write(stored_document(self.hostname, stored))
        return stored

    def _fast_checks(self, config: AgentConfig) -> set[str]:
        """READY waits for the first pass of these: benchmarks come later, gated."""
        return {check.name for check, _ in self._checks(config)} - set(self.benchmarks)

    def _on_xid(self, event: XidEvent) -> None:
        """On the XID listener's thread, which must outlive any failure here."""
        try:
            log.warning("event=xid_now gpu=%s xid=%d", event.bus_id, event.xid)
            # The checks that read the kernel log judge the GPU as it is now, not 10 s ago.
            self.shared.forget()
            for name, check in self.available.items():
                if "kernel_log" in check.needs:
                    self.scheduler.run_now(name)
        except Exception as err:
            log.error("event=xid_rerun_failed error=%r", f"{type(err).__name__}: {err}")

    # -- life ------------------------------------------------------------------------

    def start(self) -> None:
        """Listen first (ListenError when it cannot, with nothing else started), then run
        the checks and the XID listener."""
        config = self.config
        log.info(
            "event=starting config=%r checks=%d nvml_timeout_s=%g",
            config.source,
            len(self._checks(config)),
            self.nvml.deadline_s,
        )
        if config.listen:
            self.server = self._serve(config)
        else:
            log.info(
                "event=no_server reason=%r",
                'listen is "": no /metrics, /healthz or /results; the results go to '
                "results_file, textfile_dir and Kubernetes where configured",
            )
        self.scheduler.start()
        if not self._fast_checks(self.config):
            self._ready = True  # nothing to wait for
            notify("READY=1\nSTATUS=no checks enabled")
        self.listener = XidListener(self.nvml, self.xid_log, on_event=self._on_xid)
        self.listener.start()
        if self.kubernetes is not None:
            self.kubernetes.start()
        threading.Thread(target=self._background, name="agent-background", daemon=True).start()

    def _serve(self, config: AgentConfig) -> HttpServing:
        tls = None
        if config.tls_cert_file and config.tls_key_file:
            tls = (config.tls_cert_file, config.tls_key_file)
        web = self.web
        https = tls is not None or (web is not None and web.tls is not None)
        host, port = parse_listen(config.listen)
        try:
            server = serve(
                config.listen,
                CachedExposition(
                    self.registry,
                    self.store,
                    lambda: (self.reload_ok, self._node_labels(), self.results_file.state()),
                ),
                lambda: served_document(self.store, self.hostname),
                self.healthy,
                tls,
                self.auth,
                problems=self.health_problems,
                web=web,
            )
        except (OSError, ValueError, OverflowError) as err:  # socket.gaierror is an OSError
            raise listen_failure(config.listen, err) from None
        shown = f"[{host}]" if ":" in host else host or "0.0.0.0"
        address = f"{'https' if https else 'http'}://{shown}:{port}/metrics"
        log.info("event=listening address=%s", address)
        if web is not None:
            _log_web_notes(web)
        if not https and self.auth is None and _reaches_other_hosts(host):
            log.warning(
                "event=unprotected address=%s reason=%r",
                address,
                "serving without TLS or basic auth"
                + (" on all interfaces" if host in ("", "0.0.0.0", "::") else " beyond loopback")
                + ": anyone who reaches this port can read the results "
                "(set tls_cert_file, tls_key_file and basic_auth_file, or web_config_file, "
                "or listen on 127.0.0.1)",
            )
        return server

    def _remediation_withheld(self) -> dict[str, bool]:
        """Whether the circuit breaker holds back taking this node out of service, by
        integration: the Kubernetes taint (when tainting is on), and Slurm's drain as
        the last `slurm health-check` run noted it in the state folder (when one ran)."""
        from nodecheck.agent.breaker import SLURM_WITHHELD_FILE, read_withheld

        withheld: dict[str, bool] = {}
        if self.kubernetes is not None and self.config.kubernetes.taint:
            withheld["kubernetes"] = self.kubernetes.withheld
        slurm = read_withheld(self.config.state_folder / SLURM_WITHHELD_FILE)
        if slurm is not None:
            withheld["slurm"] = slurm
        return withheld

    def _node_labels(self) -> dict[str, str]:
        """[labels] of the configuration in force (a SIGHUP may change them)."""
        return self.config.labels

    def healthy(self) -> bool:
        """Whether the scheduler turns: the watchdog pings only then."""
        return self.scheduler.alive and time.monotonic() - self.scheduler.heartbeat < 10

    def health_problems(self) -> list[str]:
        """What else makes /healthz 503 (a restart would not mend it: the watchdog pings)."""
        problem = self.results_file.health_problem()
        return [] if problem is None else [problem]

    def _background(self) -> None:
        """The watchdog pings and the textfile, both only while the scheduler lives."""
        watchdog_s = watchdog_interval(os.environ.get("WATCHDOG_USEC"))
        ping_every = watchdog_s / 2 if watchdog_s else None
        last_textfile = 0.0
        while not self._stop.wait(min(ping_every or 1.0, 1.0)):
            if ping_every and self.healthy():
                notify("WATCHDOG=1")
            directory = self.config.textfile_dir
            if directory and time.monotonic() - last_textfile >= TEXTFILE_EVERY_S:
                last_textfile = time.monotonic()
                try:
                    write_textfile(directory, self.registry)
                except Exception as err:  # any failure: this thread also pings the watchdog
                    log.error(
                        "event=textfile_failed dir=%s error=%r",
                        directory,
                        str(err) if isinstance(err, OSError) else f"{type(err).__name__}: {err}",
                    )

    def _web(self, config: AgentConfig) -> WebConfig | None:
        """The web configuration file, read; ConfigError naming file, line and key, and
        where the file was named: --web.config.file, or the configuration's key."""
        if config.web_config_file is None:
            return None
        try:
            return load_web_config(config.web_config_file)
        except WebConfigError as err:
            if "web_config_file" in self.overrides:
                raise ConfigError("--web.config.file", None, "", str(err)) from None
            raise ConfigError(config.source, None, "agent.web_config_file", str(err)) from None

    @staticmethod
    def _auth(config: AgentConfig, web: WebConfig | None = None) -> BasicAuth | None:
        """The basic-auth users (of the web configuration, where there is one);
        ConfigError naming the file and line when unusable."""
        if web is not None:
            return BasicAuth(web.users_dict()) if web.users else None
        path = config.basic_auth_file
        if path is None:
            return None
        try:
            return BasicAuth(parse_basic_auth(read_text_file(path), str(path)))
        except UnreadableFileError as err:
            raise ConfigError(path, err.line, "", err.reason) from None
        except ValueError as err:
            raise ConfigError(path, None, "", str(err)) from None

    def _load(self) -> AgentConfig:
        config = load_config(self.config_path, set(self.available))
        config = replace(config, **self.overrides)  # type: ignore[arg-type]
        conflict = web_config_conflict(config)  # --web.config.file over the file's keys
        if conflict is not None:
            raise ConfigError(config.source, None, f"agent.{conflict[0]}", conflict[1])
        return config

    def reload(self) -> None:
        """SIGHUP. Never raises: whatever goes wrong keeps the running configuration,
        logs event=reload_failed and sets nodecheck_config_last_reload_successful 0."""
        try:
            self._reload()
        except ConfigError as err:
            self.reload_ok = False
            log.error("event=reload_failed keeping=previous error=%r", str(err))
        except Exception as err:
            self.reload_ok = False
            log.error(
                "event=reload_failed keeping=previous error=%r",
                f"{type(err).__name__}: {err}",
            )

    def _reload(self) -> None:
        config = self._load()
        web = self._web(config)
        auth = self._auth(config, web)
        served = (
            self.config.listen,
            self.config.tls_cert_file,
            self.config.tls_key_file,
            self.config.web_config_file,
            self.web is not None and self.web.tls is not None,
        )
        wanted = (
            config.listen,
            config.tls_cert_file,
            config.tls_key_file,
            config.web_config_file,
            web is not None and web.tls is not None,
        )
        if served != wanted or (auth is None) != (self.auth is None):
            raise ConfigError(
                config.source,
                None,
                "",
                "listen, the TLS files' paths, the web configuration file's path, and "
                "turning TLS or basic auth on or off take a restart",
            )
        if config.kubernetes != self.config.kubernetes:
            raise ConfigError(config.source, None, "kubernetes", "changes take a restart")
        if self.kubernetes is not None and config.remediation != self.config.remediation:
            # What the taint is for, or a dry run turned on or off: from the next report.
            self.kubernetes.policy = config.remediation
        if self.server is not None and config.tls_cert_file is not None:
            # The same paths, perhaps new files (certbot, cert-manager): swapped in for new
            # connections, or ValueError naming the file and the old ones kept.
            try:
                self.server.reload_tls()
            except ValueError as err:
                raise ConfigError(config.source, None, "", f"TLS: {err}") from None
        check_config = config.check_config()
        # Nothing can fail from here on: the new configuration is applied whole.
        if auth is not None and self.auth is not None:
            self.auth.users = auth.users  # the running server's check, updated in place
        if self.server is not None and web is not None:
            self.server.apply_web_config(web)  # its context was built when it was read
            _log_web_notes(web)
        self.web = web
        # Read by every NVML call as it starts; a call already waiting keeps its deadline.
        self.nvml.deadline_s = check_config.nvml_timeout_s
        self.reload_ok = True
        self.config = config
        self.check_config = check_config
        old = self.scheduler
        old.stop()
        self.scheduler = self._scheduler(previous=old)
        self.scheduler.start()
        enabled = {check.name for check, _ in self._checks(config)}
        self.store.forget({s.run.check.name for s in self.store.all()} - enabled)
        log.info(
            "event=reloaded source=%r checks=%d nvml_timeout_s=%g",
            config.source,
            len(enabled),
            self.nvml.deadline_s,
        )

    def stop(self) -> None:
        notify("STOPPING=1")
        self._stop.set()
        self.scheduler.stop()
        if self.kubernetes is not None:
            self.kubernetes.stop()
        if self.listener is not None:
            self.listener.stop()
        # The driver's handles let go: a GPU Operator driver upgrade unloads the driver
        # once every NVML client on the node has left (k8s-driver-manager evicts them by
        # the nvidia.com/gpu.deploy.client label the DaemonSet selects on), and a client
        # that keeps its handles open holds the upgrade up.
        log.info("event=nvml_released outcome=%r", self.nvml.close())
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.config.textfile_dir:
            try:
                write_textfile(self.config.textfile_dir, self.registry)
            except Exception as err:  # the last write: stopping must not fail on it
                log.error(
                    "event=textfile_failed dir=%s error=%r",
                    self.config.textfile_dir,
                    f"{type(err).__name__}: {err}",
                )

    def run_until_signalled(self) -> None:
        stop = threading.Event()
        hup = threading.Event()

        def on_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            hup.set()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)
        self.start()  # ListenError before anything runs
        while not stop.wait(0.2):
            if hup.is_set():
                hup.clear()
                self.reload()
        log.info("event=stopping")
        self.stop()
