"""An in-process stand-in for the few kube-apiserver endpoints the extender uses (127.0.0.1 only).

No real kube-apiserver can run here, so the extender's API side is tested against this server,
through the real `kubernetes` client. It keeps objects of four kinds with one resourceVersion
counter, as etcd does, and serves:

* ``GET`` lists of pods, nodes, Koordinator devices, NodeResourceTopologies and Kueue Topologies
  (404, as for an absent CRD, while the kind is in `missing`), and watches of
  them from a resourceVersion (``?watch=true``), streamed as JSON lines until ``timeoutSeconds``
  (capped short) pass; a resourceVersion older than `compact` allowed answers an ERROR event
  with code 410, or an HTTP 410 when `gone_as_status` is set;
* ``GET``/``PATCH`` of one Pod (a JSON merge patch; ``metadata.uid`` acts as a precondition: 409);
* ``POST .../pods/{name}/binding``: sets ``spec.nodeName``; 409 when the Pod is already bound, or
  the next `fail_bindings` answers given.

`calls` records (method, path) of every request in order.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

KIND_PATHS = {
    "/api/v1/pods": "pods",
    "/api/v1/nodes": "nodes",
    "/apis/scheduling.koordinator.sh/v1alpha1/devices": "devices",
    "/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies": "noderesourcetopologies",
    "/apis/kueue.x-k8s.io/v1beta2/topologies": "topologies",
}
POD_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+?)(/binding)?$")
WATCH_CAP = 2.0  # seconds a watch stays open at most (tests stay bounded)


def _key(kind: str, obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}" if kind == "pods" else meta["name"]


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that closes its connection early is normal here; anything else is printed."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class FakeAPI:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KIND_PATHS.values()}
        self.events: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, kind, type, object)
        self.version = 100
        self.compacted = 0  # watches from a resourceVersion below this get 410 Gone
        self.gone_as_status = False
        self.fail_bindings: list[int] = []
        self.missing: set[str] = set()  # kinds answered 404 (a CRD not installed)
        self.calls: list[tuple[str, str]] = []
        self.cond = threading.Condition()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # Changing objects --------------------------------------------------------------------------------------
    def put(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (ADDED or MODIFIED event)."""
        with self.cond:
            obj = copy.deepcopy(obj)
            key = _key(kind, obj)
            event = "MODIFIED" if key in self.objects[kind] else "ADDED"
            self._store(kind, key, obj, event)
            return obj

    def delete(self, kind: str, key: str) -> None:
        with self.cond:
            obj = self.objects[kind].pop(key)
            self.version += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.events.append((self.version, kind, "DELETED", obj))
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget the event history: watches from any older resourceVersion get 410 Gone."""
        with self.cond:
            self.compacted = self.version + 1
            self.events.clear()

    def _store(self, kind: str, key: str, obj: dict[str, Any], event: str) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[kind][key] = obj
        self.events.append((self.version, kind, event, copy.deepcopy(obj)))
        self.cond.notify_all()

    # HTTP ------------------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _status(self, code: int, reason: str, message: str) -> None:
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure"}
                self._send(code, {**status, "reason": reason, "message": message, "code": code})

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def do_GET(self) -> None:
                url = urlparse(self.path)
                api.calls.append(("GET", url.path))
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                kind = KIND_PATHS.get(url.path)
                if kind in api.missing:
                    self._status(404, "NotFound", "the server could not find the requested resource")
                    return
                if kind is not None:
                    if query.get("watch") in ("true", "1"):
                        self._watch(kind, query)
                    else:
                        with api.cond:
                            items = [copy.deepcopy(o) for o in api.objects[kind].values()]
                            meta = {"resourceVersion": str(api.version)}
                        self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": items})
                    return
                match = POD_PATH.match(url.path)
                if match and not match.group(3):
                    pod = api.objects["pods"].get(f"{match.group(1)}/{match.group(2)}")
                    if pod is None:
                        self._status(404, "NotFound", "pod not found")
                    else:
                        self._send(200, pod)
                    return
                self._status(404, "NotFound", f"no route {url.path}")

            def _watch(self, kind: str, query: dict[str, str]) -> None:
                since = int(query.get("resourceVersion") or 0)
                deadline = time.monotonic() + min(float(query.get("timeoutSeconds") or WATCH_CAP), WATCH_CAP)
                if since and since < api.compacted:
                    if api.gone_as_status:
                        self._status(410, "Expired", "too old resource version")
                        return
                    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
                    lines = [{"type": "ERROR", "object": gone}]
                    self._stream_head()
                    self._chunk(lines)
                    self._end()
                    return
                self._stream_head()
                seen = since
                while True:
                    with api.cond:
                        fresh = [(v, t, o) for v, k, t, o in api.events if k == kind and v > seen]
                        if not fresh:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            api.cond.wait(left)
                            continue
                    seen = fresh[-1][0]
                    try:
                        self._chunk([{"type": t, "object": o} for _, t, o in fresh])
                    except OSError:
                        return
                self._end()

            def _stream_head(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

            def _chunk(self, events: list[dict[str, Any]]) -> None:
                data = "".join(json.dumps(e) + "\n" for e in events).encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _end(self) -> None:
                try:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    pass

            def do_PATCH(self) -> None:
                url = urlparse(self.path)
                api.calls.append(("PATCH", url.path))
                match = POD_PATH.match(url.path)
                patch = self._body()
                with api.cond:
                    key = f"{match.group(1)}/{match.group(2)}" if match else ""
                    pod = api.objects["pods"].get(key)
                    if pod is None:
                        self._status(404, "NotFound", "pod not found")
                        return
                    uid = (patch.get("metadata") or {}).get("uid")
                    if uid and uid != pod["metadata"].get("uid"):
                        self._status(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
                        return
                    pod = copy.deepcopy(pod)
                    _merge(pod, patch)
                    api._store("pods", key, pod, "MODIFIED")
                self._send(200, pod)

            def do_POST(self) -> None:
                url = urlparse(self.path)
                api.calls.append(("POST", url.path))
                match = POD_PATH.match(url.path)
                body = self._body()
                with api.cond:
                    if not match or not match.group(3):
                        self._status(404, "NotFound", f"no route {url.path}")
                        return
                    key = f"{match.group(1)}/{match.group(2)}"
                    pod = api.objects["pods"].get(key)
                    if api.fail_bindings:
                        code = api.fail_bindings.pop(0)
                        self._status(code, "Conflict" if code == 409 else "InternalError", "injected failure")
                        return
                    if pod is None:
                        self._status(404, "NotFound", "pod not found")
                        return
                    if pod["spec"].get("nodeName"):
                        self._status(409, "Conflict", f"pod {key} is already assigned to node")
                        return
                    pod = copy.deepcopy(pod)
                    pod["spec"]["nodeName"] = body["target"]["name"]
                    api._store("pods", key, pod, "MODIFIED")
                self._send(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})

        return Handler
