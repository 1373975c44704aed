"""The agent's HTTP(S) server: /metrics, /results, /healthz and /livez.

Written for hostile clients too: a real listen backlog, a bounded number of handler
threads that only complete requests reach (one thread holds the connections still
sending theirs: agent/web/intake.py), one deadline from accept() to the end of the
request head (TLS handshake included) and one for the whole response, bcrypt work
bounded to one core (agent/web/auth.py), and every connection failure one key=value
log line, never a traceback.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from nodecheck.agent.web.auth import AuthVerdict, BasicAuth
from nodecheck.agent.web.intake import REQUEST_DEADLINE_S, Arrival, KnownClients, RequestIntake
from nodecheck.agent.web.tls import tls_context
from nodecheck.checks.lazy_logging import DEBUG, get_logger
from nodecheck.checks.record import record

if TYPE_CHECKING:
    from nodecheck.agent.web.config import WebConfig

log = get_logger(__name__)

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
# connections still sending their head (agent/web/intake.py: PRE_REQUEST_CONNECTIONS) and the
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
        self._head = head  # what the intake read already (agent/web/intake.py), first
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
    `deadline_s` (RESPONSE_DEADLINE_S) at most (a socket timeout bounds each send call,
    not the response)."""

    def __init__(self, connection: socket.socket, deadline_s: float = RESPONSE_DEADLINE_S) -> None:
        self._connection = connection
        self._deadline_s = deadline_s
        self._deadline: float | None = None

    def writable(self) -> bool:
        return True

    def restart(self) -> None:
        """The next response's deadline starts at its first byte."""
        self._deadline = None

    def write(self, data: Any) -> int:
        if self._deadline is None:
            self._deadline = time.monotonic() + self._deadline_s
        with memoryview(data) as view, view.cast("B") as octets:
            sent = 0
            while sent < len(octets):
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"response not read within {self._deadline_s:g} s")
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
    (agent/web/intake.py), one thread that holds every connection until its request
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
        web: WebConfig | None = None,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        if tls is not None and web is not None:
            raise ValueError("TLS files and a web configuration file given together")
        self._tls_paths = tls
        self._tls = tls_context(*tls) if tls is not None else None
        # The web configuration's response headers, sent on every answer (Handler's
        # end_headers: the ones http.server writes itself, a 400 or 501, too).
        self.response_headers: tuple[tuple[str, str], ...] = ()
        if web is not None:
            self._tls, self.response_headers = web.context, web.headers
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

    def apply_web_config(self, web: WebConfig) -> None:
        """A web configuration read again (SIGHUP): its TLS context (certificate, client
        CA, versions, ciphers) for new connections, its headers for every response from
        now on. Turning TLS on or off takes a restart: the caller refuses it."""
        self._tls, self.response_headers = web.context, web.headers
        log.info("event=web_config_reloaded file=%s", web.source)

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
    web: WebConfig | None = None,
    response_deadline_s: float = RESPONSE_DEADLINE_S,
) -> AgentServer:
    """Start the HTTP(S) server on a thread: /metrics, /results (behind basic auth when
    configured), /livez and /healthz (never: they tell nothing but whether the agent does
    its work). /livez is 503 "scheduler stalled" when not `healthy()` (a restart mends
    that: the liveness probe); /healthz also with `problems()`, one a line (what a restart
    would not mend: the readiness probe). ValueError naming the file when the TLS
    certificate or key is unusable. `web`: a web configuration's TLS context and
    response headers (agent/web/config.py), instead of `tls`. `response_deadline_s`: how
    long a client may take to read one response."""
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
            self._writer = _DeadlineWriter(self.connection, response_deadline_s)
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

        def end_headers(self) -> None:
            for name, value in cast(AgentServer, self.server).response_headers:
                self.send_header(name, value)
            super().end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            if log.enabled_for(DEBUG):  # every request: format only when shown
                log.debug(
                    "event=http client=%s message=%r", _client(self.client_address), format % args
                )

    server = AgentServer((host, int(port)), Handler, tls, web)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
