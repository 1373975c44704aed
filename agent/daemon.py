"""`nodecheck agent`: the checks on their schedule, exported to Prometheus, under systemd.

- READY=1 is sent to systemd once every enabled check has a first result, and
  STATUS= carries a one-line summary after each run.
- WATCHDOG=1 is sent only while the scheduler loop turns: a stalled scheduler
  stops the pings and systemd restarts the agent.
- SIGTERM/SIGINT stop it within 2 s; SIGHUP reloads the configuration (a bad
  file keeps the old one, says so in the log and in
  nodecheck_config_last_reload_successful).
- An NVML XID event re-runs gpu_xid at once instead of at the next poll.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import replace
from http.server import ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from types import FrameType

from nodecheck.agent.config import AgentConfig, ConfigError, load_config
from nodecheck.agent.exporter import (
    BasicAuth,
    CachedExposition,
    ResultCollector,
    make_registry,
    parse_basic_auth,
    results_document,
    serve,
    write_textfile,
)
from nodecheck.agent.scheduler import ResultStore, Scheduler
from nodecheck.agent.snapshot import SNAPSHOT_CHECKS, from_snapshot
from nodecheck.checks.bench.options import BenchOptions, Thresholds
from nodecheck.checks.context import CheckContext, SharedReads
from nodecheck.checks.node.fs import NodeFS
from nodecheck.checks.node.gpu import GpuHistory
from nodecheck.checks.node.inventory import read_hostname
from nodecheck.checks.node.nvml import NvmlSession
from nodecheck.checks.node.xid import XidEvent, XidListener, XidLog
from nodecheck.checks.registry import Check, load_benchmarks, load_checks
from nodecheck.checks.result import Status
from nodecheck.checks.runner import CheckRun

log = logging.getLogger(__name__)
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


def _version() -> str:
    try:
        return metadata.version("nodecheck")
    except metadata.PackageNotFoundError:
        return "unknown"


class Agent:
    def __init__(
        self,
        fs: NodeFS,
        config_path: Path | None,
        nvml_library: str | None,
        overrides: dict[str, object] | None = None,
    ) -> None:
        self.fs = fs
        self.config_path = config_path
        self.nvml_library = nvml_library
        # Command-line settings over the file's, kept across reloads.
        self.overrides = overrides or {}
        self.available = load_checks()
        self.benchmarks = load_benchmarks()
        self.config = self._load()
        self.auth = self._auth(self.config)
        self.reload_ok = True
        self.store = ResultStore()
        self.history = GpuHistory()
        self.shared = SharedReads(ttl_s=SHARED_READS_TTL_S)
        self.xid_log = XidLog()
        self.nvml = NvmlSession(deadline_s=self.config.nvml_timeout_s, library_path=nvml_library)
        self.hostname = read_hostname(fs)
        self.registry = make_registry(
            ResultCollector(self.store, _version(), lambda: self.reload_ok)
        )
        self.scheduler = self._scheduler()
        self.listener: XidListener | None = None
        self.server: ThreadingHTTPServer | None = None
        self._stop = threading.Event()
        self._ready = False

    # -- wiring ------------------------------------------------------------------

    def _checks(self, config: AgentConfig) -> list[tuple[Check, float]]:
        chosen = []
        for name, registered in self.available.items():
            settings = config.check(name)
            if not settings.enabled:
                continue
            check = registered
            if config.snapshot is not None and name in SNAPSHOT_CHECKS:
                check = from_snapshot(registered, config.snapshot)
            if settings.timeout_s is not None:
                check = replace(check, timeout_s=settings.timeout_s)
            chosen.append((check, settings.interval_s or check.interval_s))
        if config.benchmarks.enabled:
            # Rarely, one at a time, and each only through its job-safety gate.
            chosen += [(bench, config.benchmarks.interval_s) for bench in self.benchmarks.values()]
        return chosen

    def _context(self) -> CheckContext:
        config = self.config
        return CheckContext(
            fs=self.fs,
            environ={},  # the agent's own environment is not a job's
            nvml=self.nvml,
            gpu_history=self.history,
            xid_log=self.xid_log,
            kernel_log=config.kernel_log,
            expected_gpus=config.expected_gpus,
            bench=self._bench_options(config),
            shared=self.shared,
        )

    @staticmethod
    def _bench_options(config: AgentConfig) -> BenchOptions:
        bench = config.benchmarks
        options = BenchOptions(
            device=bench.device,
            duration_s=bench.duration_s,
            idle_window_s=bench.idle_window_s,
            memory_fraction=bench.memory_fraction,
            thresholds=Thresholds(warn=bench.warn_below, fail=bench.fail_below),
        )
        if config.state_dir is not None:
            options.state_dir = config.state_dir
        return options

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
        stored = self.store.all()
        enabled = self._fast_checks(self.config)
        have = {s.run.check.name for s in stored}
        statuses = [result.status for s in stored for result in s.run.results]
        worst = max(statuses, key=lambda status: status.severity, default=Status.SKIP)
        failing = sorted({s.run.check.name for s in stored if s.run.status is Status.FAIL})
        summary = f"{worst.value}: {len(have)} checks" + (
            f", failing: {', '.join(failing)}" if failing else ""
        )
        if not self._ready and enabled <= have:
            self._ready = True
            notify(f"READY=1\nSTATUS={summary}")
            log.info("event=ready checks=%d", len(have))
        elif self._ready:
            notify(f"STATUS={summary}")

    def _fast_checks(self, config: AgentConfig) -> set[str]:
        """READY waits for the first pass of these: benchmarks come later, gated."""
        return {check.name for check, _ in self._checks(config)} - set(self.benchmarks)

    def _on_xid(self, event: XidEvent) -> None:
        log.warning("event=xid_now gpu=%s xid=%d", event.bus_id, event.xid)
        self.shared.forget()  # gpu_xid must judge the GPU as it is now, not 10 s ago
        self.scheduler.run_now("gpu_xid")

    # -- life ------------------------------------------------------------------------

    def start(self) -> None:
        self.scheduler.start()
        if not self._fast_checks(self.config):
            self._ready = True  # nothing to wait for
            notify("READY=1\nSTATUS=no checks enabled")
        if self.config.listen:
            config = self.config
            tls = None
            if config.tls_cert_file and config.tls_key_file:
                tls = (config.tls_cert_file, config.tls_key_file)
            self.server = serve(
                config.listen,
                CachedExposition(self.registry, self.store, lambda: self.reload_ok),
                lambda: results_document(self.store, self.hostname),
                self.healthy,
                tls,
                self.auth,
            )
            log.info("event=listening address=%s", self.config.listen)
        self.listener = XidListener(self.nvml, self.xid_log, on_event=self._on_xid)
        self.listener.start()
        threading.Thread(target=self._background, name="agent-background", daemon=True).start()

    def healthy(self) -> bool:
        return self.scheduler.alive and time.monotonic() - self.scheduler.heartbeat < 10

    def _background(self) -> None:
        """The watchdog pings and the textfile, both only while the scheduler lives."""
        watchdog_us = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
        ping_every = watchdog_us / 1e6 / 2 if watchdog_us else None
        last_textfile = 0.0
        while not self._stop.wait(min(ping_every or 1.0, 1.0)):
            if ping_every and self.healthy():
                notify("WATCHDOG=1")
            directory = self.config.textfile_dir
            if directory and time.monotonic() - last_textfile >= TEXTFILE_EVERY_S:
                last_textfile = time.monotonic()
                try:
                    write_textfile(directory, self.registry)
                except OSError as err:
                    log.error("event=textfile_failed dir=%s error=%r", directory, str(err))

    @staticmethod
    def _auth(config: AgentConfig) -> BasicAuth | None:
        """The basic-auth users; ConfigError naming the file and line when unusable."""
        path = config.basic_auth_file
        if path is None:
            return None
        try:
            return BasicAuth(parse_basic_auth(path.read_text(), str(path)))
        except (OSError, ValueError) as err:
            raise ConfigError(path, None, "", str(err)) from err

    def _load(self) -> AgentConfig:
        config = load_config(self.config_path, set(self.available))
        return replace(config, **self.overrides)  # type: ignore[arg-type]

    def reload(self) -> None:
        try:
            config = self._load()
        except ConfigError as err:
            self.reload_ok = False
            log.error("event=reload_failed keeping=previous error=%r", str(err))
            return
        try:
            auth = self._auth(config)
        except ConfigError as err:
            self.reload_ok = False
            log.error("event=reload_failed keeping=previous error=%r", str(err))
            return
        served = (self.config.listen, self.config.tls_cert_file, self.config.tls_key_file)
        wanted = (config.listen, config.tls_cert_file, config.tls_key_file)
        if served != wanted or (auth is None) != (self.auth is None):
            self.reload_ok = False
            log.error(
                "event=reload_failed keeping=previous error=%r",
                "listen, TLS and turning basic auth on or off take a restart",
            )
            return
        if auth is not None and self.auth is not None:
            self.auth.users = auth.users  # the running server's check, updated in place
        self.reload_ok = True
        self.config = config
        old = self.scheduler
        old.stop()
        self.scheduler = self._scheduler(previous=old)
        self.scheduler.start()
        enabled = {check.name for check, _ in self._checks(config)}
        self.store.forget({s.run.check.name for s in self.store.all()} - enabled)
        log.info("event=reloaded source=%r checks=%d", config.source, len(enabled))

    def stop(self) -> None:
        notify("STOPPING=1")
        self._stop.set()
        self.scheduler.stop()
        if self.listener is not None:
            self.listener.stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.config.textfile_dir:
            with contextlib.suppress(OSError):
                write_textfile(self.config.textfile_dir, self.registry)

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
        self.start()
        while not stop.wait(0.2):
            if hup.is_set():
                hup.clear()
                self.reload()
        log.info("event=stopping")
        self.stop()
