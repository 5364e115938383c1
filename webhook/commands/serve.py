"""`configpin serve`: wire the sources, the admitter, the controller and the HTTPS server."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

from webhook.controller.rollout import RolloutController
from webhook.controller.sweep import SnapshotLifetime
from webhook.core.kinds import use_custom_kinds
from webhook.core.model import SourceId
from webhook.core.owners import use_owner_kinds
from webhook.inputs.sources import FileSources, SourceReader
from webhook.kube.cache import SourceCache
from webhook.kube.client import connect
from webhook.kube.copies import SnapshotIndex, SnapshotWriter
from webhook.kube.digestkey import ensure_digest_key
from webhook.kube.events import EventRecorder
from webhook.kube.namespaces import NamespaceSet
from webhook.kube.raw import Kube
from webhook.kube.selfcerts import SelfManagedCerts
from webhook.process import allocator
from webhook.process.config import Settings
from webhook.process.digestkey import ensure_key_file, load_key_file
from webhook.process.metrics import Metrics
from webhook.server import runner
from webhook.server.app import create_app
from webhook.server.context import Excluding, Scope
from webhook.server.guard import Limits
from webhook.server.handler import Admitter
from webhook.server.lifecycle import Lifecycle
from webhook.server.tls import ReloadingTLSContext
from webhook.server.writes import SourcePreview
from webhook.tls.devcerts import ensure_dev_certs

# reportingController of configpin's Events (at most 128 characters, a domain-qualified name)
EVENT_CONTROLLER = "configpin.io/configpin"

log = logging.getLogger("configpin")


def _tls(
    settings: Settings, kube: Kube | None, stoppers: list[Callable[[], None]]
) -> ReloadingTLSContext:
    if settings.certs.self_signed and kube is not None:
        certs = SelfManagedCerts(
            kube,
            namespace=settings.cluster.namespace,
            secret=settings.certs.secret,
            service=settings.certs.service_name,
            webhook_config=settings.certs.webhook_config_name,
            out_dir=Path(tempfile.mkdtemp(prefix="configpin-certs-")),
        )
        certs.reconcile()
        certs.start()
        stoppers.append(certs.stop)
        log.info(
            "serving with self-managed certificates from Secret %s/%s",
            settings.cluster.namespace,
            settings.certs.secret,
        )
        return ReloadingTLSContext(
            certs.cert_file,
            certs.key_file,
            client_ca_file=settings.server.client_ca,
            cipher_suites=settings.server.cipher_suites,
        )
    if settings.server.tls_cert and settings.server.tls_key:
        return ReloadingTLSContext(
            settings.server.tls_cert,
            settings.server.tls_key,
            client_ca_file=settings.server.client_ca,
            cipher_suites=settings.server.cipher_suites,
        )
    cert, key, _ca = ensure_dev_certs(
        settings.certs.dir,
        service=settings.certs.service_name,
        namespace=settings.cluster.namespace,
    )
    log.info("serving with development certificates from %s/", settings.certs.dir)
    return ReloadingTLSContext(
        cert,
        key,
        client_ca_file=settings.server.client_ca,
        cipher_suites=settings.server.cipher_suites,
    )


def _snapshot_writer(
    kube: Kube, cache: SourceCache, hkey: bytes, metrics: Metrics
) -> SnapshotWriter:
    """Snapshot mode: the writer that admission and the change controller make copies with
    (and its index of copies). Before `cache.start()`: the copies are found on the cache's
    watches."""
    index = SnapshotIndex(metrics, hkey)
    index.attach(cache)
    return SnapshotWriter(kube, cache, index, hkey, metrics)


def _snapshot_lifetime(
    settings: Settings,
    writer: SnapshotWriter,
    controller: RolloutController,
    events: EventRecorder | None,
) -> SnapshotLifetime:
    """How long copies live (adoption by revisions, the sweep): where the change controller
    acts, and only while it leads."""
    lifetime = SnapshotLifetime(
        writer,
        grace=settings.snapshots.grace_period,
        namespaces=controller.namespaces,
        is_leader=controller.acting,
        events=events,
    )
    # Its watches (revisions, Jobs, Pods) list what neither admission nor the index needs:
    # after both, never beside the lists that readiness waits for.
    controller.after_synced.append(lifetime.start)
    return lifetime


def _rollout_controller(
    settings: Settings,
    kube: Kube,
    hkey: bytes,
    cache: SourceCache,
    metrics: Metrics,
    namespaces: NamespaceSet,
    *,
    snapshots: SnapshotWriter | None = None,
    events: EventRecorder | None = None,
) -> RolloutController:
    """Rolling on change. It starts in the background once the cache has synced, and the
    webhook serves whatever becomes of it (`configpin_controller_up` tells)."""
    index = snapshots.index if snapshots is not None else None

    def is_copy(namespace: str, sid: SourceId, name: str) -> bool:
        """A copy configpin made of `sid` (proven by its signature): what an undo may point
        a template back at."""
        found = index.get((sid.kind, namespace, name)) if index is not None else None
        return found is not None and found.source == sid.name

    controller = RolloutController(
        kube,
        hkey,
        cache,
        metrics,
        settings,
        snapshots=snapshots,
        namespaces=namespaces,
        events=events,
        is_copy=is_copy,
    )
    controller.start()
    return controller


def serve(settings: Settings) -> int:
    use_custom_kinds(settings.workloads.custom_kinds)
    use_owner_kinds(settings.workloads.owner_kinds)
    metrics = Metrics()
    lifecycle = Lifecycle()
    ready_checks: list[Callable[[], bool]] = []
    stoppers: list[Callable[[], None]] = []
    # A cluster is acted on only when named (--kubeconfig) or from a pod: never because the
    # shell that started it has KUBECONFIG set (`make run` on a laptop pointed at production).
    api = connect(settings.cluster.kubeconfig, from_kubeconfig_env=False)
    kube: Kube | None = None
    sources: SourceReader
    snapshots: SnapshotWriter | None = None
    excluded = settings.cluster.excluded_namespaces
    scope: Scope = Excluding(excluded)
    events: EventRecorder | None = None
    preview: SourcePreview | None = None  # what a source's change will do (the controller's)

    if api is None:
        hkey = load_key_file(
            settings.admission.digest_key_file or ensure_key_file(settings.certs.dir)
        )
        if settings.cluster.manifests:
            files = FileSources.from_paths(hkey, settings.cluster.manifests)
            where = ", ".join(map(str, settings.cluster.manifests))
        else:
            files = FileSources.embedded(hkey)
            where = "the embedded default (webhook/embedded)"
        log.info("no cluster configured: serving %d sources from %s", len(files), where)
        if os.environ.get("KUBECONFIG"):
            log.info(
                "KUBECONFIG is set and not used: configpin serve acts on a cluster only with "
                "--kubeconfig (or in a pod)"
            )
        sources = files
    else:
        kube = Kube(api)
        if settings.admission.digest_key_file:
            hkey = load_key_file(settings.admission.digest_key_file)
        else:
            hkey = ensure_digest_key(
                kube, settings.cluster.namespace, settings.admission.digest_key_secret
            )
        # The namespaces configpin acts in: one watch, shared by admission (which enforces
        # the selection itself, whatever a request claims) and the controller.
        namespaces = NamespaceSet.of(kube, metrics, settings)
        namespaces.start()
        stoppers.append(namespaces.stop)
        ready_checks.append(namespaces.synced)
        scope = namespaces
        # Events about what configpin did and why, on the workload; best effort and bounded
        events = EventRecorder(
            kube,
            EVENT_CONTROLLER,
            os.environ.get("POD_NAME") or socket.gethostname(),
            on_drop=lambda why: metrics.events_dropped.labels(why).inc(),
        ).start()
        stoppers.append(events.stop)
        cache = SourceCache(kube, hkey, metrics)
        writer = _snapshot_writer(kube, cache, hkey, metrics)
        # Without snapshot mode configpin writes no ConfigMap or Secret (and the chart grants
        # it no such write): no writer, no adoption, no sweep.
        snapshots = writer if settings.snapshots.enabled else None
        cache.start()
        stoppers.append(cache.stop)
        ready_checks.append(cache.synced)
        sources = cache
        log.info("reading sources from the cluster at %s", api.host)
        if settings.controller.enabled:
            controller = _rollout_controller(
                settings, kube, hkey, cache, metrics, namespaces, snapshots=snapshots, events=events
            )
            preview = controller.preview
            stoppers.insert(0, controller.stop)  # first: it releases the Lease at once
            # What is alive once the workloads are indexed lives as long as the process
            controller.after_synced.append(allocator.freeze)
            if snapshots is not None:
                lifetime = _snapshot_lifetime(settings, snapshots, controller, events)
                stoppers.insert(0, lifetime.stop)
    admitter = Admitter(
        hkey=hkey,
        sources=sources,
        metrics=metrics,
        settings=settings,
        snapshots=snapshots,
        scope=scope,
        events=events,
        preview=preview,
    )
    # The worker process for large reviews starts with the first one (~1 s once): it costs
    # ~40 MB (itself and multiprocessing's resource tracker) that most clusters never need.
    stoppers.append(admitter.close)
    limits = Limits(
        max_connections=settings.server.max_connections,
        handshake_timeout=settings.server.tls_handshake_timeout,
        header_timeout=settings.server.header_timeout,
        body_timeout=settings.server.body_timeout,
        keep_alive_timeout=settings.server.keep_alive_timeout,
        max_header_bytes=settings.server.max_header_bytes,
    )
    app = create_app(
        admitter, lifecycle, metrics, ready_checks=ready_checks, body_timeout=limits.body_timeout
    )
    try:
        runner.run(
            runner.serve_async(
                app,
                host=settings.server.host,
                port=settings.server.port,
                tls=_tls(settings, kube, stoppers),
                lifecycle=lifecycle,
                shutdown_delay=settings.server.shutdown_delay,
                drain_timeout=settings.server.drain_timeout,
                limits=limits,
                metrics=metrics,
                log_level=settings.logging.level,
            )
        )
    finally:
        for stop in stoppers:
            stop()
    return 0
