"""The few Kubernetes API calls the extender makes, through the official `kubernetes` client.

* list and watch Pods, Nodes, Koordinator Device CRs, NodeResourceTopologies and Kueue's Topology
  objects (``kueue.x-k8s.io/v1beta2``) as plain dicts
  (``_preload_content=False`` and our own JSON parsing: the extender converts raw objects, and
  the client's typed models would only be turned back into dicts). A watch resumes from a
  resourceVersion; a ``410 Gone`` (an HTTP status or an ERROR event) raises `Gone`, and the
  caller lists again.
* bind: a merge patch of the Pod's annotations carrying ``metadata.uid`` (a precondition: a Pod
  deleted and recreated under the same name answers 409), then ``POST .../pods/{name}/binding``;
  if that fails, a second patch takes the annotations off again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from finesched.k8s.extender import BindError
from finesched.k8s.kueue import KUEUE_TOPOLOGY_API


class Gone(Exception):
    """The resourceVersion a watch resumed from is too old (HTTP 410): list again."""


def load_client(kubeconfig: str | None = None, in_cluster: bool = False) -> client.ApiClient:
    """An ApiClient from a kubeconfig file (default ~/.kube/config) or the pod's service account."""
    configuration = client.Configuration()
    if in_cluster:
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)


def _status_error(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return f"{exc.status} {body.get('reason') or exc.reason}: {body.get('message') or ''}".strip()
    except (TypeError, ValueError):
        return f"{exc.status} {exc.reason}"


class KubeAPI:
    """Lists, watches and binds (see the module docstring)."""

    KINDS = ("nodes", "devices", "noderesourcetopologies", "topologies", "pods")

    def __init__(self, api_client: client.ApiClient, request_timeout: float = 10.0):
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.timeout = request_timeout
        custom = self.custom.list_cluster_custom_object
        self.kinds: dict[str, Callable[..., Any]] = {
            "pods": self.core.list_pod_for_all_namespaces,
            "nodes": self.core.list_node,
            "devices": lambda **kw: custom("scheduling.koordinator.sh", "v1alpha1", "devices", **kw),
            "noderesourcetopologies": lambda **kw: custom(
                "topology.node.k8s.io", "v1alpha1", "noderesourcetopologies", **kw
            ),
            "topologies": lambda **kw: custom(*KUEUE_TOPOLOGY_API, **kw),
        }

    def list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        """Every object of `kind` and the list's resourceVersion (a missing CRD lists nothing)."""
        try:
            resp = self.kinds[kind](_preload_content=False, _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404 and kind not in ("pods", "nodes"):
                return [], ""
            raise
        doc = json.loads(resp.data)
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def watch(self, kind: str, resource_version: str, timeout_seconds: int = 60) -> Iterator[tuple[str, dict]]:
        """(event type, object) from `resource_version` on, until the server ends the watch."""
        kwargs: dict[str, Any] = {
            "watch": True,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout_seconds,
            "_preload_content": False,
            "_request_timeout": timeout_seconds + self.timeout,
        }
        if resource_version:
            kwargs["resource_version"] = resource_version
        try:
            resp = self.kinds[kind](**kwargs)
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(_status_error(exc)) from None
            raise
        try:
            for line in iter_resp_lines(resp):
                event = json.loads(line)
                kind_of, obj = event.get("type"), event.get("object") or {}
                if kind_of == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(str(obj.get("message", "resourceVersion too old")))
                    raise ApiException(status=obj.get("code"), reason=str(obj.get("message")))
                yield kind_of, obj
        finally:
            resp.close()
            resp.release_conn()

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            resp = self.core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(resp.data)

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Patch the annotations, then create the Binding; BindError (conflict on 409) on failure.

        When the Binding fails after the patch, the annotations are taken off again (best effort),
        so an unbound Pod does not carry devices it does not hold.
        """
        patched = False
        try:
            if annotations:
                self._patch(namespace, name, uid, dict(annotations))
                patched = True
            body = client.V1Binding(
                metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
                target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
            )
            # _preload_content=False: the client cannot deserialize the Binding it gets back.
            self.core.create_namespaced_pod_binding(
                name, namespace, body, _preload_content=False, _request_timeout=self.timeout
            )
        except ApiException as exc:
            self._undo(patched, namespace, name, uid, annotations)
            raise BindError(_status_error(exc), conflict=exc.status == 409) from None
        except Exception as exc:  # transport errors: the bind did not happen as far as we know
            self._undo(patched, namespace, name, uid, annotations)
            raise BindError(f"API call failed: {exc}") from None

    def _patch(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str | None]) -> None:
        meta: dict[str, Any] = {"annotations": dict(annotations)}
        if uid:
            meta["uid"] = uid  # a precondition: another Pod under this name answers 409
        self.core.patch_namespaced_pod(
            name, namespace, {"metadata": meta}, _preload_content=False, _request_timeout=self.timeout
        )

    def _undo(self, patched: bool, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> None:
        if not patched:
            return
        try:
            self._patch(namespace, name, uid, dict.fromkeys(annotations))  # null deletes in a merge patch
        except Exception:  # the Pod may be gone or changed; a later bind overwrites them anyway
            return
