"""A small Kubernetes API client on the standard library, for the five calls the agent makes.

GET a node, PATCH its status (conditions), PATCH the node (the taint and its ownership
annotation), POST an Event, and LIST the nodes' metadata (the taint's circuit breaker,
before a node is tainted): nothing else, which is what the ClusterRole and Role in
deploy/kubernetes/rbac.yaml allow. The official client (`kubernetes` on PyPI) brings
pydantic, aiohttp, requests and more for these calls; this one uses http.client and ssl.

- The bearer token is read from its file again once it is `token_reread_s` old (at most
  a minute), and at once after a 401: projected service-account tokens are rotated by
  the kubelet, and a client that keeps the first one gets 401s after about an hour
  (kubernetes-client/python#1768; the official client re-reads every minute,
  kubernetes/config/incluster_config.py). The CA bundle is read with it.
- Every call is bounded: a deadline of `timeout_s` from the connection to the last byte
  (a timer shuts the socket down when it passes, so a server that answers one byte at a
  time cannot hold the caller), and at most MAX_RESPONSE_BYTES of answer.
- Errors are values: a Reply with the HTTP status (0 when no answer came) and a reason,
  the API server's Status.message when it sent one. Nothing here raises.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from nodecheck.agent.config import UnreadableFileError, read_text_file
from nodecheck.checks.record import record

# A Node object is tens of kB (its images list is the bulk); an Event's answer less.
MAX_RESPONSE_BYTES = 8 << 20
MAX_TOKEN_BYTES = 64 << 10
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
# A list's items as their metadata only (PartialObjectMetadataList: the API server's
# "as=" content negotiation, apimachinery pkg/apis/meta/v1 types.go), a few kB a node
# instead of tens; plain JSON after it, for a server that cannot.
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
MERGE_PATCH = "application/merge-patch+json"


@record
class Reply:
    """What one call came back with: the HTTP status (0: no answer), the JSON body when
    there was one, and why it failed (None on a 2xx)."""

    status: int
    body: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and self.error is None

    def describe(self) -> str:
        """ "403 Forbidden: nodes "n1" is forbidden: ..." or "no answer: timed out"."""
        if self.status == 0:
            return f"no answer: {self.error}"
        reason = http.client.responses.get(self.status, "")
        return f"{self.status} {reason}: {self.error}" if self.error else f"{self.status} {reason}"


def _status_message(status: int, data: bytes) -> str:
    """The reason of a failed call: the Kubernetes Status object's message (every error
    the API server returns is one: apimachinery pkg/apis/meta/v1 Status), else the
    start of the body."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        document = None
    if isinstance(document, dict) and isinstance(document.get("message"), str):
        return str(document["message"])[:500]
    text = data[:200].decode("utf-8", "replace").strip()
    return text or http.client.responses.get(status, "error")


class KubeClient:
    """Calls to one API server as one service account. Thread-safe enough for its one
    user, the reporter's thread: the token cache is under a lock."""

    def __init__(
        self,
        api_server: str,
        token_file: Path,
        ca_file: Path,
        timeout_s: float,
        token_reread_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(api_server)
        self.host = parts.hostname or ""
        self.port = parts.port or 443
        self.token_file, self.ca_file = token_file, ca_file
        self.timeout_s, self.token_reread_s = timeout_s, token_reread_s
        self._clock = clock
        self._lock = threading.Lock()
        self._credentials: tuple[str, ssl.SSLContext] | None = None
        self._read_at = 0.0

    # -- the calls ----------------------------------------------------------------------

    def get_node(self, name: str) -> Reply:
        return self.request("GET", f"/api/v1/nodes/{quote(name, safe='')}")

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> Reply:
        """A strategic merge patch of nodes/status: conditions merge by `type`, so only the
        types in the patch are touched (k8s.io/api core/v1 NodeStatus.Conditions,
        +patchMergeKey=type +patchStrategy=merge)."""
        path = f"/api/v1/nodes/{quote(name, safe='')}/status"
        return self.request("PATCH", path, patch, STRATEGIC_MERGE_PATCH)

    def patch_node(self, name: str, patch: dict[str, Any]) -> Reply:
        """A JSON merge patch (RFC 7386) of the node: lists (spec.taints, +listType=atomic)
        are replaced whole, maps (metadata.annotations) merged, null deletes a key; a
        metadata.resourceVersion in it makes the API server refuse a stale write with 409."""
        return self.request("PATCH", f"/api/v1/nodes/{quote(name, safe='')}", patch, MERGE_PATCH)

    def create_event(self, namespace: str, event: dict[str, Any]) -> Reply:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/events"
        return self.request("POST", path, event, "application/json")

    def list_nodes_metadata(self, limit: int, continue_token: str = "") -> Reply:
        """One page of at most `limit` nodes, their metadata only; the reply's
        metadata.continue names the next page ("" on the last)."""
        query = f"limit={limit}" + (
            f"&continue={quote(continue_token, safe='')}" if continue_token else ""
        )
        return self.request("GET", f"/api/v1/nodes?{query}", accept=METADATA_ONLY)

    # -- plumbing ----------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
    ) -> Reply:
        """One call; on a 401 the token file is read again and the call made once more
        (the token may have been rotated since it was read)."""
        reply = self._request_once(method, path, body, content_type, accept, fresh=False)
        if reply.status == 401:
            reply = self._request_once(method, path, body, content_type, accept, fresh=True)
        return reply

    def _credentials_now(self, fresh: bool) -> tuple[str, ssl.SSLContext] | Reply:
        with self._lock:
            due = self._clock() - self._read_at >= self.token_reread_s
            if self._credentials is None or due or fresh:
                try:
                    token = read_text_file(self.token_file, MAX_TOKEN_BYTES).strip()
                    ca = read_text_file(self.ca_file)
                except UnreadableFileError as err:
                    return Reply(0, None, f"cannot read the service account's files: {err}")
                if not token:
                    return Reply(0, None, f"{self.token_file}: empty token")
                try:
                    context = ssl.create_default_context(cadata=ca)
                except (ssl.SSLError, ValueError) as err:
                    return Reply(0, None, f"{self.ca_file}: not a usable CA bundle ({err})")
                self._credentials, self._read_at = (token, context), self._clock()
            return self._credentials

    def _request_once(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        content_type: str | None,
        accept: str,
        fresh: bool,
    ) -> Reply:
        credentials = self._credentials_now(fresh)
        if isinstance(credentials, Reply):
            return credentials
        token, context = credentials
        headers = {"Authorization": f"Bearer {token}", "Accept": accept}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = content_type or "application/json"
        connection = http.client.HTTPSConnection(
            self.host, self.port, timeout=self.timeout_s, context=context
        )
        expired = threading.Event()

        def cut_short() -> None:
            # shutdown() wakes a thread blocked in recv(); close() alone does not.
            expired.set()
            sock = connection.sock
            if sock is not None:
                with contextlib.suppress(OSError):  # closed meanwhile
                    sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.timeout_s, cut_short)
        timer.daemon = True
        timer.start()
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read(MAX_RESPONSE_BYTES + 1)
            status = response.status
        except (OSError, http.client.HTTPException, ValueError) as err:
            if expired.is_set() or isinstance(err, TimeoutError):
                return Reply(0, None, f"timed out after {self.timeout_s:g} s")
            return Reply(0, None, f"{type(err).__name__}: {err}"[:300])
        finally:
            timer.cancel()
            connection.close()
        if expired.is_set():
            return Reply(0, None, f"timed out after {self.timeout_s:g} s")
        if len(data) > MAX_RESPONSE_BYTES:
            return Reply(status, None, f"an answer larger than {MAX_RESPONSE_BYTES >> 20} MiB")
        if not 200 <= status < 300:
            return Reply(status, None, _status_message(status, data))
        try:
            document = json.loads(data) if data else {}
        except (ValueError, RecursionError):
            return Reply(status, None, "an answer that is not JSON")
        if not isinstance(document, dict):
            return Reply(status, None, "an answer that is not a JSON object")
        return Reply(status, document)
