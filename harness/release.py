"""configpin installed on a real node (harness/node.py) the way users install it: `helm install`
of charts/configpin by Helm's own library (helm-python-sdk: Helm v4's Go SDK), with only the
image values changed, for the image harness/images.py builds (imported, `pullPolicy: Never`).

Nothing is run beside the chart: the webhook is the chart's MutatingWebhookConfiguration calling
the chart's Service, its certificate and caBundle are configpin's own doing, and the controller
elects its leader among the chart's replicas.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from harness.apps import is_ready, pods
from harness.chart import CHART_DIR, RELEASE_NAME, RELEASE_NAMESPACE
from harness.controlplane import wait_for
from harness.node import Node
from webhook.core.constants import ANN_CHECKSUM

SELECTOR = "app.kubernetes.io/name=configpin"
INSTALL_TIMEOUT = 180


def image_values(ref: str, **more: Any) -> dict[str, Any]:
    """Chart values that run image `ref` (name:tag, as imported) and nothing else changed."""
    repository, _, tag = ref.rpartition(":")
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}, **more}


def tag_image(node: Node, ref: str, new_tag: str) -> str:
    """Give an imported image another tag in the node's containerd; returns the new name."""
    new_ref = f"{ref.rpartition(':')[0]}:{new_tag}"
    node.ctr("images", "tag", "--force", ref, new_ref)
    return new_ref


@dataclass
class Release:
    """configpin's Helm release on a node; `values`: those of its latest install or upgrade."""

    node: Node
    name: str = RELEASE_NAME
    namespace: str = RELEASE_NAMESPACE
    values: dict[str, Any] = field(default_factory=dict)
    returned_at: float = 0.0  # time.monotonic() when the latest install or upgrade returned

    def _config(self) -> helm.Config:
        kubeconfig = str(self.node.plane.kubeconfig)
        return helm.Config(kubeconfig_path=kubeconfig, namespace=self.namespace)

    def install(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`helm install --create-namespace --wait` (Helm's watcher: every object ready)."""
        self.values = dict(values)
        with self._config() as cfg:
            done = cfg.install(
                str(CHART_DIR),
                self.name,
                dict(values),
                namespace=self.namespace,
                create_namespace=True,
                wait="watcher",
                timeout=INSTALL_TIMEOUT,
            )
        self.returned_at = time.monotonic()
        return done

    def upgrade(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`helm upgrade --wait` with these values (not reusing the previous ones)."""
        self.values = dict(values)
        with self._config() as cfg:
            done = cfg.upgrade(
                str(CHART_DIR),
                self.name,
                dict(values),
                namespace=self.namespace,
                wait="watcher",
                timeout=INSTALL_TIMEOUT,
            )
        self.returned_at = time.monotonic()
        return done

    def test(self, timeout: int = 120) -> dict[str, Any]:
        """`helm test --logs`: the chart's test hooks run; raises helm.HelmReleaseError when one
        fails. Returns Helm's answer (its `logs`, when it got them before the Pods went)."""
        with self._config() as cfg:
            done: dict[str, Any] = cfg.test(self.name, timeout=timeout, logs=True)
        return done

    def uninstall(self) -> None:
        """`helm uninstall --wait`."""
        with self._config() as cfg:
            cfg.uninstall(self.name, wait="watcher", timeout=INSTALL_TIMEOUT)

    # --- what runs ----------------------------------------------------------------------------

    def pods(self, api: client.ApiClient) -> list[Any]:
        return pods(api, self.namespace, SELECTOR)

    def wait_ready(
        self,
        api: client.ApiClient,
        replicas: int = 2,
        timeout: float = 120,
        *,
        settled: bool = True,
    ) -> list[Any]:
        """Wait for `replicas` configpin pods, all Ready, and (`settled`) no replaced one still
        shutting down (it serves admissions as the version it was for its shutdown delay and
        drain, about 20 s)."""

        def ready() -> list[Any] | None:
            core = client.CoreV1Api(api)
            found = core.list_namespaced_pod(self.namespace, label_selector=SELECTOR).items
            if not settled:
                found = [p for p in found if p.metadata.deletion_timestamp is None]
            if len(found) == replicas and all(is_ready(p) for p in found):
                return found
            return None

        what = f"{replicas} configpin pods Ready"
        return wait_for(ready, timeout=timeout, interval=0.5, what=what)

    def wait_answering(self, api: client.ApiClient, namespace: str, timeout: float = 60) -> None:
        """Wait until the webhook pins workloads in opted-in `namespace`: a Deployment created
        as a dry run (which creates nothing, not even a snapshot copy) comes back stamped.

        Pods Ready is not enough: the Service reaches them once kube-proxy has their
        endpoints, and until then failurePolicy Ignore admits workloads unpinned (for the
        controller to stamp, and so roll, a moment later)."""
        probe = {
            "metadata": {"name": "configpin-probe"},
            "spec": {
                "selector": {"matchLabels": {"app": "probe"}},
                "template": {
                    "metadata": {"labels": {"app": "probe"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "probe",
                                "image": "probe",
                                "env": [
                                    {
                                        "name": "X",
                                        "valueFrom": {
                                            "configMapKeyRef": {
                                                "name": "configpin-probe",
                                                "key": "x",
                                                "optional": True,
                                            }
                                        },
                                    }
                                ],
                            }
                        ]
                    },
                },
            },
        }
        apps = client.AppsV1Api(api)

        def stamped() -> bool:
            answer = apps.create_namespaced_deployment(namespace, probe, dry_run="All")
            return ANN_CHECKSUM in (answer.spec.template.metadata.annotations or {})

        wait_for(stamped, timeout=timeout, interval=0.2, what="the webhook answering")

    def metrics_text(self, api: client.ApiClient, pod: str) -> str:
        """GET /metrics of one replica, through the API server's pod proxy (HTTPS to 8443)."""
        text: str = client.CoreV1Api(api).connect_get_namespaced_pod_proxy_with_path(
            f"https:{pod}:8443", self.namespace, "metrics"
        )
        return text

    def metric(self, api: client.ApiClient, pod: str, name: str, **labels: str) -> float:
        """The sum of a metric's samples on one replica whose labels include `labels`."""
        return sum(
            sample.value
            for family in text_string_to_metric_families(self.metrics_text(api, pod))
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def leader(self, api: client.ApiClient) -> str:
        """The pod holding the leader Lease (its holderIdentity starts with the pod's name)."""
        lease = client.CoordinationV1Api(api).read_namespaced_lease(
            f"{self.name}-leader", self.namespace
        )
        holder: str = lease.spec.holder_identity or ""
        names = [p.metadata.name for p in self.pods(api)]
        matching = [n for n in names if holder == n or holder.startswith(f"{n}_")]
        return matching[0] if matching else ""

    def logs(self, api: client.ApiClient) -> str:
        """Every replica's log, for a failing test's message."""
        core = client.CoreV1Api(api)
        parts = []
        for pod in self.pods(api):
            with contextlib.suppress(client.ApiException):
                log = core.read_namespaced_pod_log(pod.metadata.name, self.namespace, tail_lines=60)
                parts.append(f"--- {pod.metadata.name}\n{log or ''}")
        return "\n".join(parts)


@contextlib.contextmanager
def installed(node: Node, image: Path, ref: str, **values: Any) -> Iterator[Release]:
    """configpin's image imported into the node and the chart installed with its image values
    (and `values`); uninstalled on the way out (if it still is)."""
    node.import_image(image)
    release = Release(node)
    release.install(image_values(ref, **values))
    try:
        yield release
    finally:
        with contextlib.suppress(helm.HelmError):
            release.uninstall()
