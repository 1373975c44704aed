"""Accepted connections until their request head is complete: one thread and one
selector for all of them, never a handler thread each (agent/web/server.py, AgentServer).

A client that connects and stays silent, or drips its headers (slowloris), costs a
socket here and at most HEAD_BUFFER_LIMIT bytes, never one of the handler threads: a
scraper's complete request goes to a thread however many such connections are open.
- Each connection must complete its request head, the TLS handshake included, within
  REQUEST_DEADLINE_S of its accept(), or it is closed and its place freed.
- At most PRE_REQUEST_CONNECTIONS wait here, all client addresses together (the
  per-address cap is the server's). A new connection beyond them closes the oldest one
  of the address that holds the most, addresses known good last, so silent connections
  from many addresses never keep a new client out.
- KnownClients: the addresses whose request was answered lately (authenticated, below
  400). They go first to a free handler thread, may take the threads reserved for them,
  and are the last whose waiting connections are closed.
"""

from __future__ import annotations

import contextlib
import re
import selectors
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import field
from typing import Any

from nodecheck.checks.lazy_logging import get_logger
from nodecheck.checks.record import record

log = get_logger(__name__)

# From accept() to the end of the request head, TLS handshake included; also from one
# response to the next request head on a kept-alive connection. A scraper on the
# cluster's network sends its head within milliseconds of connecting.
REQUEST_DEADLINE_S = 5.0
PRE_REQUEST_CONNECTIONS = 512  # accepted, the head not yet complete: all clients together
# A head that has not ended by then goes to a handler thread as it is: http.server reads
# the rest under the same deadline and answers 414 or 431 past its own limits. Prometheus
# and curl send well under 1 kB; nginx's default limit for a header line is 8 kB.
HEAD_BUFFER_LIMIT = 16 * 1024
KNOWN_GOOD_S = 3600.0  # a scraper answered within the last hour is known
KNOWN_CLIENTS = 4096  # the most recently answered addresses remembered
# The empty line that ends the header section (RFC 9112 §2.1); http.server also ends
# it at a bare "\n" (http.client.parse_headers).
_END_OF_HEAD = re.compile(rb"\n\r?\n")


def head_complete(head: bytes | bytearray, start: int = 0) -> bool:
    """The request line and headers have all arrived (searched from `start`): an empty
    line ends them, or the first line is empty (http.server then closes at once)."""
    return head.startswith((b"\r\n", b"\n")) or _END_OF_HEAD.search(head, start) is not None


class KnownClients:
    """Client keys (agent/web/server.py, client_key) whose request passed authentication
    and was answered below 400 within the last `hold_s` seconds, `limit` at most (the
    least recently answered forgotten first)."""

    def __init__(self, hold_s: float = KNOWN_GOOD_S, limit: int = KNOWN_CLIENTS) -> None:
        self._hold_s, self._limit = hold_s, limit
        self._answered: dict[str, float] = {}  # oldest first
        self._lock = threading.Lock()

    def answered(self, key: str) -> None:
        with self._lock:
            self._answered.pop(key, None)
            self._answered[key] = time.monotonic()
            if len(self._answered) > self._limit:
                del self._answered[next(iter(self._answered))]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            at = self._answered.get(str(key))
        return at is not None and time.monotonic() - at < self._hold_s


@record(frozen=False)
class Arrival:
    """An accepted connection whose request head is not complete yet."""

    connection: socket.socket
    address: Any
    key: str  # whose it is: agent/web/server.py, client_key
    accepted: float  # time.monotonic() at accept()
    head: bytearray = field(default_factory=bytearray)
    handshaken: bool = False
    events: int = 0  # what the selector watches it for; 0: not registered yet


class RequestIntake:
    """Holds accepted connections until their head is complete, then hands each to
    `ready` (on this object's thread); `dropped(arrival, reason, error)` for one closed
    here instead: past its deadline, over the budget, an error (a failed TLS handshake,
    a reset) or closed by its client. Whoever gets an arrival owns its socket then."""

    def __init__(
        self,
        ready: Callable[[Arrival], None],
        dropped: Callable[[Arrival, str, BaseException | None], None],
        known: KnownClients,
        budget: int = PRE_REQUEST_CONNECTIONS,
        deadline_s: float = REQUEST_DEADLINE_S,
    ) -> None:
        self._ready, self._dropped, self._known = ready, dropped, known
        self._budget, self._deadline_s = budget, deadline_s
        self._selector = selectors.DefaultSelector()  # epoll: no FD_SETSIZE limit
        self._wake_in, self._wake_out = socket.socketpair()
        for end in (self._wake_in, self._wake_out):
            end.setblocking(False)
        self._selector.register(self._wake_in, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._held: dict[int, Arrival] = {}  # by id, oldest first; not over the budget
        self._new: list[Arrival] = []  # admitted, not registered yet
        self._evicted: list[Arrival] = []  # over the budget, to be closed by the thread
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="http-intake", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def admit(self, arrival: Arrival) -> None:
        """On the accept loop: never blocks. Past the budget, the oldest connection of the
        address holding the most (a known good one last) is marked to be closed."""
        with self._lock:
            closing = self._closing
            if not closing:
                self._held[id(arrival)] = arrival
                self._new.append(arrival)
                if len(self._held) > self._budget:
                    victim = self._victim_locked()
                    del self._held[id(victim)]
                    self._evicted.append(victim)
        if closing:
            self._dropped(arrival, "the server is stopping", None)
            return
        self._wake()

    def _victim_locked(self) -> Arrival:
        counts = Counter(arrival.key for arrival in self._held.values())
        known = {key for key in counts if key in self._known}
        return min(
            self._held.values(),
            key=lambda arrival: (arrival.key in known, -counts[arrival.key], arrival.accepted),
        )

    def close(self) -> None:
        """Stop the thread and close every connection still held (each `dropped`)."""
        with self._lock:
            self._closing = True
        self._wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)
        with self._lock:
            left = [*self._held.values(), *self._evicted]
            self._held.clear()
            self._new.clear()
            self._evicted.clear()
        for arrival in left:
            self._dropped(arrival, "the server is stopping", None)
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            self._selector.close()
        for end in (self._wake_in, self._wake_out):
            end.close()

    # -- the thread ------------------------------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: a wake-up is pending anyway; or closed
            self._wake_out.send(b"\0")

    def _loop(self) -> None:
        """The intake's turns, for as long as the server lives: one that fails (a bug) is
        one log line, and the next turn goes on."""
        while True:
            try:
                if not self._turn():
                    return
            except Exception as err:
                log.error("event=http_intake_failed error=%r", f"{type(err).__name__}: {err}")
                time.sleep(0.1)

    def _turn(self) -> bool:
        """Close the evicted and the expired, watch the new, serve what is ready; False
        once closing."""
        now = time.monotonic()
        expired: list[Arrival] = []
        nearest = 1.0
        with self._lock:
            if self._closing:
                return False
            new, self._new = self._new, []
            evicted, self._evicted = self._evicted, []
            # Held in accept() order, and every deadline is as long: the expired first.
            for arrival in self._held.values():
                left = arrival.accepted + self._deadline_s - now
                if left > 0:
                    nearest = min(nearest, left)
                    break
                expired.append(arrival)
        for arrival in evicted:
            self._unwatch(arrival)
            self._dropped(arrival, f"over {self._budget} connections without a request", None)
        gone = {id(arrival) for arrival in evicted}
        for arrival in new:
            if id(arrival) not in gone:
                try:
                    arrival.connection.setblocking(False)
                    self._watch(arrival, selectors.EVENT_READ)
                except (OSError, ValueError) as err:  # closed by now
                    self._end(arrival, "failed before a whole request", err)
        for arrival in expired:
            self._end(arrival, f"no whole request within {self._deadline_s:g} s", None)
        for key, _ in self._selector.select(max(nearest, 0.01)):
            if key.data is None:
                with contextlib.suppress(OSError):
                    while self._wake_in.recv(4096):
                        pass
            else:
                self._advance(key.data)
        return True

    def _watch(self, arrival: Arrival, events: int) -> None:
        if arrival.events == events:
            return
        if arrival.events:
            self._selector.modify(arrival.connection, events, arrival)
        else:
            self._selector.register(arrival.connection, events, arrival)
        arrival.events = events

    def _unwatch(self, arrival: Arrival) -> None:
        if arrival.events:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(arrival.connection)
            arrival.events = 0

    def _take(self, arrival: Arrival) -> bool:
        """Whether `arrival` was still held (else it was evicted, and is closed as such)."""
        with self._lock:
            return self._held.pop(id(arrival), None) is not None

    def _end(self, arrival: Arrival, reason: str, error: BaseException | None) -> None:
        if self._take(arrival):
            self._unwatch(arrival)
            self._dropped(arrival, reason, error)

    def _advance(self, arrival: Arrival) -> None:
        """Whatever the connection allows now without blocking: the TLS handshake, then
        the head's bytes; handed on once the head is complete or HEAD_BUFFER_LIMIT long."""
        connection = arrival.connection
        try:
            if isinstance(connection, ssl.SSLSocket) and not arrival.handshaken:
                try:
                    connection.do_handshake()
                except ssl.SSLWantReadError:
                    self._watch(arrival, selectors.EVENT_READ)
                    return
                except ssl.SSLWantWriteError:
                    self._watch(arrival, selectors.EVENT_WRITE)
                    return
                arrival.handshaken = True
                self._watch(arrival, selectors.EVENT_READ)
            while len(arrival.head) < HEAD_BUFFER_LIMIT:
                try:
                    chunk = connection.recv(HEAD_BUFFER_LIMIT - len(arrival.head))
                except (ssl.SSLWantReadError, BlockingIOError):
                    self._watch(arrival, selectors.EVENT_READ)
                    return
                except ssl.SSLWantWriteError:
                    self._watch(arrival, selectors.EVENT_WRITE)
                    return
                if not chunk:
                    self._end(arrival, "closed by the client before a whole request", None)
                    return
                start = max(0, len(arrival.head) - 2)
                arrival.head += chunk
                if head_complete(arrival.head, start):
                    break
        except OSError as err:  # ssl.SSLError too: plain HTTP to the TLS port, a reset
            self._end(arrival, "failed before a whole request", err)
            return
        if self._take(arrival):
            self._unwatch(arrival)
            connection.setblocking(True)
            self._ready(arrival)
