"""HTTP basic auth for the agent's server: htpasswd -B (bcrypt) users, checked one at a
time, with a dummy hash for unknown users and 429 for a client that keeps guessing.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import os
import re
import threading
import time
from collections import deque
from collections.abc import Mapping

from nodecheck.checks.lazy_logging import get_logger

log = get_logger(__name__)

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
        problem = bcrypt_hash_problem(hashed)
        if problem:
            raise ValueError(f"{source}:{number}: {user}: {problem}")
        users[user] = hashed.encode()
    if not users:
        raise ValueError(f"{source}: no users")
    return users


def bcrypt_hash_problem(hashed: str) -> str | None:
    """Why `hashed` is no bcrypt hash the agent checks passwords against, or None: not a
    whole one, or a cost above BCRYPT_MAX_COST."""
    if not BCRYPT_HASH.fullmatch(hashed):
        return "not a whole bcrypt hash (htpasswd -B)"
    cost = _bcrypt_cost(hashed.encode())
    if cost > BCRYPT_MAX_COST:
        return (
            f"bcrypt cost {cost} is above {BCRYPT_MAX_COST} (htpasswd -B's maximum): every "
            "check would take minutes; hash it again with htpasswd -B -C 12"
        )
    return None


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
