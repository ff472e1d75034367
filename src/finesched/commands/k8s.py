"""``finesched k8s-extender``: serve the kube-scheduler extender verbs over HTTP.

Nodes come from the API server (``--kubeconfig PATH``, default ~/.kube/config, or ``--in-cluster``),
which is also where binds are written and what the watches follow; or from finesched manifests
(``--cluster FILE``), to try the extender without a cluster: binds then commit at once.
``--topology FILE`` gives finesched Topology manifests (network levels for Kueue's TAS
annotations); Kueue's own Topology objects are read from the API server too.
``--tls-cert``/``--tls-key`` serve HTTPS; ``--tls-client-ca`` also requires kube-scheduler's client
certificate.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from finesched.commands.serve import TlsCertOption, TlsKeyOption, server_tls_options


def k8s_extender(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8888,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="kubeconfig file of the cluster (default: ~/.kube/config).")
    ] = None,
    in_cluster: Annotated[bool, typer.Option("--in-cluster", help="Use the pod's service account.")] = False,
    cluster: Annotated[
        list[Path] | None,
        typer.Option(help="finesched manifest file(s) with Node documents, instead of an API server."),
    ] = None,
    topology: Annotated[
        list[Path] | None,
        typer.Option(
            help="finesched manifest file(s) with Topology documents (levels the pods' Kueue TAS annotations name)."
        ),
    ] = None,
    profile: Annotated[str, typer.Option("--profile", "-p", help="Built-in profile name or a profile YAML file.")] = (
        "default"
    ),
    assume_ttl: Annotated[
        float, typer.Option(min=1.0, help="Seconds an assumed bind waits for the API to show the pod bound.")
    ] = 300.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: Annotated[
        Path | None,
        typer.Option(help="Require a client certificate signed by this CA (kube-scheduler's tlsConfig.certFile)."),
    ] = None,
) -> None:
    """Run finesched as a kube-scheduler extender: POST /filter, /prioritize, /bind, /preempt.

    With --tls-cert/--tls-key it serves HTTPS (kube-scheduler: `enableHTTPS: true`, an https://
    urlPrefix and `tlsConfig.caFile`); with --tls-client-ca only clients presenting a certificate
    signed by that CA are answered."""
    import uvicorn

    from finesched.commands.common import fail, load_or_exit
    from finesched.k8s.app import create_app
    from finesched.k8s.setup import build_extender

    sources = sum([kubeconfig is not None, in_cluster, bool(cluster)])
    if sources > 1:
        raise fail("give at most one of --kubeconfig, --in-cluster and --cluster", code=2)
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise fail(f"--log-level must be debug, info, warning or error, got {log_level!r}", code=2)
    if kubeconfig is not None and not kubeconfig.is_file():
        raise fail(f"--kubeconfig {kubeconfig}: no such file")
    tls = server_tls_options(tls_cert, tls_key, tls_client_ca)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    topologies = load_or_exit(topology).topologies if topology else []
    if cluster:
        manifests = load_or_exit(cluster)
        extender = build_extender(manifests.nodes, profile=profile, topologies=[*manifests.topologies, *topologies])
        sync = None
    else:
        extender, sync = _api_extender(kubeconfig, in_cluster, profile, assume_ttl, topologies)
    try:
        uvicorn.run(create_app(extender), host=host, port=port, log_level=log_level.lower(), access_log=False, **tls)
    finally:
        if sync is not None:
            sync.stop.set()  # daemon threads: the process does not wait for their watches to end


def _api_extender(
    kubeconfig: Path | None, in_cluster: bool, profile: str, assume_ttl: float, topologies: list[Any]
) -> tuple[Any, Any]:
    """The extender on an API server: binds written there, nodes and pods followed by the watches of a
    started ClusterSync (returned, to be stopped); a client that cannot be configured, or a cluster that
    cannot be listed, is one line and exit 1."""
    from finesched.commands.common import fail
    from finesched.k8s.api import KubeAPI, load_client
    from finesched.k8s.setup import build_extender
    from finesched.k8s.sync import ClusterSync

    try:
        api = KubeAPI(load_client(str(kubeconfig) if kubeconfig else None, in_cluster))
    except Exception as exc:  # no kubeconfig, no service account: one clear line
        raise fail(f"cannot configure the Kubernetes client: {exc}") from None
    extender = build_extender(profile=profile, binder=api, assume_ttl=assume_ttl, topologies=topologies)
    sync = ClusterSync(extender, api)
    extender.pod_source = sync.pod
    try:
        sync.start()
    except Exception as exc:
        raise fail(f"cannot list the cluster's objects: {exc}") from None
    return extender, sync
