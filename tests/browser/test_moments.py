"""The dashboard for the moments that matter, and accessible (issue 47; shared/SPEC.md
"Dashboard"), in Debian's chromium against the control plane with configpin registered as the
chart registers it, waves `1,100%` (the canary, then `b`), on 1.20.2 and 1.36.2:

- a change paused while wave 1 rolls reads as Paused, with who paused it and the resume
  command; every view (changes, the change, Used by, a source, workloads, preview) passes
  axe-core (WCAG 2.1 AA: no serious or critical violation) and Tab reaches every control;
- a change whose canary a person rolls back (`kubectl rollout undo`) reads as Rolled back, in
  the list and on its page, with the workload that failed and what a person can do.

No kubelet: the fake `Kubelet` reports the pods Ready it is told to; the change's pods stay
Pending. Screenshots: change-paused.png, change-rolled-back.png (docs/dashboard.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from kubernetes import client

from harness.apps import rollout_undo
from harness.configpin import Configpin, instance_namespace
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap
from tests.browser.accessible import check
from tests.browser.dashboards import running_dashboard
from tests.integration.instances import replicas_fixture
from tests.integration.workloads import (
    As,
    get,
    kubectl_configpin,
    reader,
    set_cm,
    stamped,
    state,
    wait_healthy,
)
from webhook.core.constants import ANN_WAVE
from webhook.kube.raw import Kube, path

INSTANCE = "moments"
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", "2",
    "--rollout-waves", "1,100%",
]  # fmt: skip
ALICE = "alice@example.com"
LIVE = 30_000

replicas = replicas_fixture(INSTANCE, "moments", ARGS)


@pytest.fixture
def ns(k8s: client.ApiClient, replicas: list[Configpin]) -> Iterator[str]:
    with instance_namespace(k8s, INSTANCE, "moments") as name:
        yield name


def _world(kube: Kube, k8s: client.ApiClient, ns: str) -> None:
    """ConfigMap `cfg` (a: 1) read by the canary (wave 1) and `b` (wave 2), healthy; then a
    change by alice whose pods never get Ready, the canary rolling."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("canary", "b")
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
        kube.create(path("deployments", ns), reader("canary", annotations={ANN_WAVE: "-1"}))
        kube.create(path("deployments", ns), reader("b"))
        for name in ("canary", "b"):
            stamped(kube, ns, name)
        wait_healthy(kube, ns, ["canary", "b"])
    set_cm(As(k8s, ALICE), ns, "2")
    wait_for(lambda: state(get(kube, ns, "canary")) == "rolling", what="wave 1 started")


def _open_change(page: Any, url: str) -> str:
    page.goto(url)
    page.wait_for_selector("tr[data-change]", timeout=LIVE)
    ident = page.get_attribute("tr[data-change]", "data-change")
    assert ident
    page.goto(url + "#/change/" + quote(ident, safe=""))
    page.wait_for_selector("tr[data-workload]", timeout=LIVE)
    return ident


def _shot(page: Any, folder: Path, name: str) -> None:
    page.wait_for_timeout(300)  # (fonts settle)
    page.screenshot(path=str(folder / name), full_page=False)


def test_a_paused_change_reads_as_paused_and_every_view_passes_axe_and_the_keyboard(
    kube: Kube, k8s: client.ApiClient, control_plane: ControlPlane, ns: str, page: Any,
    shots: Path,
) -> None:  # fmt: skip
    _world(kube, k8s, ns)
    paused = kubectl_configpin(["pause", "configmap/cfg", "-n", ns], control_plane.kubeconfig)
    assert paused.returncode == 0, paused.stderr + paused.stdout
    with running_dashboard(control_plane.kubeconfig, ns) as d:
        page.goto(d.url)
        page.wait_for_selector("[data-testid=change-state] [data-state=paused]", timeout=LIVE)
        assert page.inner_text("[data-testid=change-state]").strip() == "Paused"
        check(page, "changes")
        _open_change(page, d.url)
        box = page.wait_for_selector("[data-testid=moment][data-moment=paused]", timeout=LIVE)
        text = box.inner_text()
        assert "Paused" in text and "paused by a person" in text, text
        assert "Paused by admin" in page.inner_text("[data-testid=paused-by]"), text
        assert f"kubectl configpin resume configmap/cfg -n {ns}" in text, text
        assert "`" not in page.inner_text("main")
        assert "cfg@" not in page.inner_text("main")  # (no record id: the change of ConfigMap cfg)
        assert page.inner_text("tr[data-workload$='/b'] [data-state]") == "paused"
        assert " UTC" in page.inner_text("[data-testid=timeline]") or "GMT" in page.inner_text(
            "[data-testid=timeline]"
        )
        _shot(page, shots, "change-paused.png")
        check(page, "change")
        views = {
            "sources": "tr[data-source]",
            f"source/configmap/{ns}/cfg": "[data-key=a] tr[data-consumer]",
            "workloads": "tr[data-workload]",
            "preview": "#manifest",
        }
        for view, drawn in views.items():
            page.goto(d.url + "#/" + view)
            page.wait_for_selector(drawn, timeout=LIVE)
            check(page, view)
        page.fill("#manifest", f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n"
                               f"  namespace: {ns}\ndata:\n  a: '7'\n")  # fmt: skip
        page.click("[data-testid=preview]")
        page.wait_for_selector("[data-plan] tr[data-plan-row]", timeout=LIVE)
        check(page, "preview with its plan")
    assert "Traceback" not in d.log(), d.log()


def test_a_change_whose_canary_a_person_rolls_back_reads_as_rolled_back(
    kube: Kube, k8s: client.ApiClient, control_plane: ControlPlane, ns: str, page: Any,
    shots: Path,
) -> None:  # fmt: skip
    _world(kube, k8s, ns)
    rollout_undo(k8s, ns, "canary")
    with running_dashboard(control_plane.kubeconfig, ns) as d:
        page.goto(d.url)
        page.wait_for_selector(
            "[data-testid=change-state] [data-state=rolled-back]", timeout=90_000
        )
        assert page.inner_text("[data-testid=change-state]").strip() == "Rolled back"
        assert "complete" not in page.inner_text("tr[data-change]")
        _open_change(page, d.url)
        box = page.wait_for_selector("[data-testid=moment][data-moment=rolled-back]", timeout=LIVE)
        text = box.inner_text()
        assert "rolled back" in text, text
        signal = page.inner_text("[data-testid=signal]")
        assert "Deployment canary" in signal, signal
        todo = page.inner_text("[data-testid=do]")
        assert f"kubectl describe deployment/canary -n {ns}" in todo, todo
        assert page.get_attribute("tr[data-workload$='/canary']", "data-row-state") == "failed"
        assert "cfg@" not in page.inner_text("main") and "`" not in page.inner_text("main")
        _shot(page, shots, "change-rolled-back.png")
        check(page, "change rolled back")
    assert "Traceback" not in d.log(), d.log()
