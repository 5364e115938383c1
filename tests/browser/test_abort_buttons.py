"""The dashboard's Abort and Retry buttons (issue 47; shared/SPEC.md "Dashboard", "Acting on a
change"), in Debian's chromium against the control plane with configpin registered as the chart
registers it, waves `1,approve,100%` (the canary, an approval, then `b`), snapshot mode, on
1.20.2 and 1.36.2:

- an admin presses Abort while the canary rolls: its page reads Aborted, who aborted it, and
  `kubectl configpin retry` as what to do; the canary is taken back to the copy of the content
  before (its record failed, action undo); Retry is offered, not Abort (screenshot
  change-aborted.png); axe-core passes;
- Retry: the canary rolls the content again, completes, and the change waits for its approval
  in wave 2, the Approve button offered, the canary's row saying its pods (screenshot
  change-awaiting-approval.png); Approve, and wave 2 rolls, its row saying its pods not yet
  updated (screenshot change-in-wave-2.png).

No kubelet: the fake `Kubelet` reports the pods Ready it is told to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import Configpin, instance_namespace
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap
from tests.browser.accessible import check
from tests.browser.dashboards import running_dashboard
from tests.browser.test_buttons import _condition, _open_change, _rollout, _shot
from tests.integration.instances import replicas_fixture
from tests.integration.workloads import get, reader, record, set_cm, stamped, state, wait_healthy
from webhook.core.constants import ANN_MODE, ANN_WAVE
from webhook.kube.raw import Kube, path

INSTANCE = "abortbtn"
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", "2",
    "--rollout-waves", "1,approve,100%",
]  # fmt: skip
LIVE = 30_000

replicas = replicas_fixture(INSTANCE, "abortbtn", ARGS)


@pytest.fixture
def ns(k8s: client.ApiClient, replicas: list[Configpin]) -> Iterator[str]:
    with instance_namespace(k8s, INSTANCE, "abortbtn") as name:
        yield name


def _ref(obj: dict[str, Any]) -> str:
    env = obj["spec"]["template"]["spec"]["containers"][0]["env"][0]
    return str(env["valueFrom"]["configMapKeyRef"]["name"])


def test_abort_takes_the_canary_back_and_retry_rolls_it_again_to_the_approval(
    kube: Kube, control_plane: ControlPlane, ns: str, page: Any, shots: Path
) -> None:
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("canary", "b")
        for name, wave in (("canary", "-1"), ("b", "0")):
            notes = {ANN_MODE: "snapshot", ANN_WAVE: wave}
            kube.create(path("deployments", ns), reader(name, annotations=notes))
            stamped(kube, ns, name)
        wait_healthy(kube, ns, ["canary", "b"])
    old = _ref(get(kube, ns, "canary"))
    set_cm(kube, ns, "2")
    wait_for(lambda: state(get(kube, ns, "canary")) == "rolling", what="wave 1 started")
    with running_dashboard(control_plane.kubeconfig, ns) as d:
        _open_change(page, d.url)

        def press(verb: str) -> None:
            with page.expect_response(lambda r: r.url.endswith("/api/" + verb)) as answer:
                page.click(f"[data-testid={verb}]:not([aria-disabled])")
            assert answer.value.status == 200, answer.value.body()

        page.wait_for_selector("[data-testid=abort]:not([aria-disabled])", timeout=LIVE)
        press("abort")
        page.wait_for_selector("[data-testid=moment][data-moment=aborted]", timeout=LIVE)
        assert "Aborted by admin" in page.inner_text("[data-testid=aborted-by]")
        assert "kubectl configpin retry configmap/cfg" in page.inner_text("[data-testid=moment]")
        wait_for(lambda: state(get(kube, ns, "canary")) == "failed", what="the canary back")
        canary = get(kube, ns, "canary")
        assert _ref(canary) == old and record(canary)["action"] == "undo"
        assert _condition(_rollout(kube, ns, "configmap-cfg")) == ("Stalled", "Aborted")
        page.wait_for_selector("[data-testid=retry]:not([aria-disabled])", timeout=LIVE)
        assert not page.query_selector("[data-testid=abort]")
        _shot(page, shots, "change-aborted.png")
        check(page, "an aborted change")

        with Kubelet(kube, ns) as kubelet:
            kubelet.allow("canary")  # (b's new pods are not made Ready: wave 2 stays rolling)
            press("retry")
            page.wait_for_selector("[data-testid=retry-message]", timeout=LIVE)
            wait_for(
                lambda: (
                    state(get(kube, ns, "canary")) == "complete"
                    and _ref(get(kube, ns, "canary")) != old
                ),
                timeout=60,
                what="retried: the canary rolled again",
            )
            wait_for(
                lambda: (
                    _condition(_rollout(kube, ns, "configmap-cfg"))
                    == ("Reconciling", "AwaitingApproval")
                ),
                what="wave 2 waits for the approval",
            )
            page.wait_for_selector("[data-testid=moment]", state="detached", timeout=LIVE)
            page.wait_for_selector("[data-testid=approve]:not([aria-disabled])", timeout=LIVE)
            assert state(get(kube, ns, "b")) is None
            pods = "tr[data-workload$='/canary'] [data-testid=replicas]"
            page.wait_for_selector(pods, timeout=LIVE)
            assert page.inner_text(pods) == "1 of 1 updated · 1 ready"
            _shot(page, shots, "change-awaiting-approval.png")
            check(page, "a change awaiting approval")
            press("approve")
            wait_for(lambda: state(get(kube, ns, "b")) == "rolling", what="wave 2 rolls")
            page.wait_for_selector("tr[data-workload$='/b'][data-row-state=rolling]", timeout=LIVE)
            page.wait_for_selector("[data-testid=pause]:not([aria-disabled])", timeout=LIVE)
            assert page.query_selector("[data-testid=history]")  # (the source's earlier changes)
            _shot(page, shots, "change-in-wave-2.png")
            check(page, "a change in wave 2")
    assert "Traceback" not in d.log(), d.log()
