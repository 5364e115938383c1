"""What Argo CD and Flux say of the workloads configpin rolls, against the real API server and
controller-manager: the chart's Lua health checks and the docs' `healthCheckExprs`
(harness/health.py runs them as those tools do) evaluated on each Deployment as the API server
returns it, at each moment of a change; and the docs' recipe that installs the checks in
`argocd-cm`, run as written.

Two configpin replicas of instance `gitops` run as the chart runs them (one Lease, both
webhooks registered from the chart's own entries), waves `1,approve,100%`. Nothing runs pods:
`Kubelet` marks the allowed apps' pods Ready, as a kubelet would; a Deployment whose pods are
not marked fails by its progress deadline.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness.controlplane import ControlPlane, wait_for
from harness.health import (
    KINDS,
    REPO,
    argocd_check,
    argocd_health,
    documented_flux_exprs,
    fenced,
    flux_health,
)
from harness.kubelet import Kubelet
from harness.manifests import configmap
from tests.integration.instances import replicas_fixtures
from tests.integration.workloads import approve, readers_of_cfg, set_cm, sources, wait_healthy
from webhook.kube.errors import AlreadyExists, NotFound
from webhook.kube.raw import Kube, path

ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", "2",
    "--lease-duration", "4",
    "--rollout-waves", "1,approve,100%",
]  # fmt: skip
APPS = ("a", "b", "c")
ROLLOUT, HELD = "configpin.io/rollout", "configpin.io/held"
LUA = argocd_check("Deployment")
EXPRS = documented_flux_exprs()
HELD_WAIT = 60  # seconds for configpin.io/held to appear on the wave that awaits approval

replicas, ns = replicas_fixtures("gitops", ARGS)


# --- helpers ------------------------------------------------------------------------------


class Moment:
    """One Deployment as the API server returned it, and what each tool says of it."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.name: str = obj["metadata"]["name"]
        notes = obj["metadata"].get("annotations") or {}
        self.record: str = notes.get(ROLLOUT) or ""
        self.held: str | None = notes.get(HELD)
        self.argo = argocd_health(LUA, obj)
        self.flux = flux_health(EXPRS, obj)

    @property
    def state(self) -> str | None:
        for state in ("rolling", "complete", "failed", "left"):
            if f'"state":"{state}"' in self.record:
                return state
        return None

    @property
    def says(self) -> tuple[str, str | None]:
        return self.argo[0], self.flux

    def __repr__(self) -> str:
        return f"{self.name}: {self.says} {self.argo[1]!r} state={self.state} held={self.held!r}"


def _moments(kube: Kube, ns: str, names: tuple[str, ...] = APPS) -> dict[str, Moment]:
    return {n: Moment(kube.get(path("deployments", ns, n))) for n in names}


def _watch(
    kube: Kube,
    ns: str,
    until: Callable[[dict[str, Moment]], bool],
    check: Callable[[Moment], None],
    *,
    timeout: float,
    what: str,
    names: tuple[str, ...] = APPS,
) -> tuple[dict[str, Moment], list[Moment]]:
    """Read the Deployments every 0.1 s, `check` what the tools say of each at each moment,
    until `until` holds of them: the last moments, and every one seen."""
    seen: list[Moment] = []
    end = time.monotonic() + timeout
    while True:
        now = _moments(kube, ns, names)
        for m in now.values():
            check(m)
        seen.extend(now.values())
        if until(now):
            return now, seen
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: {now}")
        time.sleep(0.1)


def _consistent(m: Moment) -> None:
    """At any moment: what configpin says is what both tools say (the table of
    docs/gitops.md), and a change that goes well is never Degraded nor failed."""
    assert m.says != ("Degraded", "failed") and "failed" not in m.says, m
    if m.state == "rolling":
        assert m.says == ("Progressing", "inProgress"), m
        assert m.argo[1] == "configpin: config rollout in progress", m
    elif m.held is not None:
        assert not m.held.startswith("Paused:"), m
        assert m.says == ("Progressing", "inProgress"), m
        assert m.argo[1].startswith("configpin: "), m


def _all_healthy(now: Mapping[str, Moment]) -> bool:
    return all(m.says == ("Healthy", "current") for m in now.values())


def _apps(kube: Kube, ns: str, names: tuple[str, ...] = APPS, deadline: int = 600) -> None:
    readers_of_cfg(kube, ns, names, deadline)


# --- tests --------------------------------------------------------------------------------


def test_a_change_under_approve_is_progressing_while_it_waits_and_healthy_once_approved(
    kube: Kube, control_plane: ControlPlane, ns: str
) -> None:
    """Three readers of `cfg`, waves 1,approve,100%. Before the change each is Healthy in
    Argo CD and current in Flux. The change: the canary, while configpin rolls it, Progressing
    and inProgress (if caught), then Healthy and current; the two of wave 2, once configpin
    says it holds them for the approval (configpin.io/held), Progressing and inProgress with
    configpin's words. Approved, all three Healthy and current on the new content. At every
    moment read, both tools say what configpin's annotations say."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*APPS)
        _apps(kube, ns)
        wait_healthy(kube, ns, list(APPS))
        before, _ = _watch(
            kube, ns, _all_healthy, _consistent, timeout=30, what="all Healthy and current"
        )
        assert all(m.state is None and m.held is None for m in before.values()), before
        old = {n: sources(m.obj) for n, m in before.items()}

        set_cm(kube, ns, "2")

        def awaiting(now: Mapping[str, Moment]) -> bool:
            held = [m for m in now.values() if (m.held or "").startswith("AwaitingApproval:")]
            return len(held) == 2

        try:
            held, seen = _watch(
                kube, ns, awaiting, _consistent, timeout=HELD_WAIT,
                what=f"{HELD} (AwaitingApproval) on the two Deployments of wave 2",
            )  # fmt: skip
        except AssertionError as e:
            raise AssertionError(
                f"{e}\n(configpin.io/held is the controller's: webhook.controller.reconcile "
                "writes it while the gate holds a workload for an approval, a window or the "
                "budget; without it Argo CD and Flux cannot tell a wave that awaits approval)"
            ) from e
        [canary] = [m for m in held.values() if m.held is None]
        for m in held.values():
            if m.held is not None:
                assert m.says == ("Progressing", "inProgress"), m
                words = m.held.split(":", 1)[1].strip()
                assert m.argo == ("Progressing", f"configpin: {words}"), m
                assert sources(m.obj) == old[m.name]  # (not rolled: held)
        rolling = [m for m in seen if m.name == canary.name and m.state == "rolling"]
        print(f"the canary {canary.name} seen rolling {len(rolling)} times")  # (optional)
        assert all(m.says == ("Progressing", "inProgress") for m in rolling), rolling
        wait_for(
            lambda: (
                Moment(kube.get(path("deployments", ns, canary.name))).says
                == ("Healthy", "current")
            ),
            timeout=30,
            what=f"the canary {canary.name} Healthy and current once rolled",
        )
        assert Moment(kube.get(path("deployments", ns, canary.name))).state == "complete"

        approve(control_plane.kubeconfig, ns)

        def delivered(now: Mapping[str, Moment]) -> bool:
            return _all_healthy(now) and all(
                m.held is None and m.state == "complete" and sources(m.obj) != old[m.name]
                for m in now.values()
            )

        done, _ = _watch(kube, ns, delivered, _consistent, timeout=90, what="all three delivered")
        assert all(m.argo == ("Healthy", "") for m in done.values()), done


def test_a_failing_change_is_degraded_in_argo_cd_and_failed_in_flux(kube: Kube, ns: str) -> None:
    """One reader, its progress deadline 5 s: a change whose new pods never get Ready fails
    and is held (checksum mode); while configpin rolls it both tools say it progresses, then
    Argo CD says Degraded with configpin's signal and action, and Flux failed."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("a")
        _apps(kube, ns, ("a",), deadline=5)
        wait_healthy(kube, ns, ["a"])
        _watch(
            kube, ns, _all_healthy, _consistent, timeout=30, what="Healthy and current",
            names=("a",),
        )  # fmt: skip
    set_cm(kube, ns, "2")  # (no kubelet: its new pods stay Pending)

    def rolling_then(m: Moment) -> None:
        if m.state == "rolling":
            # (Flux asks inProgress first; Argo CD puts the Deployment's own deadline first,
            # for the moment before configpin records the failure)
            assert m.flux == "inProgress" and m.argo[0] in ("Progressing", "Degraded"), m
        elif m.state == "failed":
            # (a Deployment's annotations count in its generation: until the Deployment
            # controller has observed the write of the record, Flux's own check says
            # inProgress)
            assert m.argo[0] == "Degraded" and m.flux in ("inProgress", "failed"), m
        else:
            assert "failed" not in m.says and "Degraded" not in m.says, m

    def failed(now: Mapping[str, Moment]) -> bool:
        return now["a"].state == "failed" and now["a"].flux == "failed"

    now, seen = _watch(
        kube, ns, failed, rolling_then, timeout=90, what="the rollout failed", names=("a",)
    )
    m = now["a"]
    assert m.says == ("Degraded", "failed"), m
    assert m.argo[1].startswith("configpin: config rollout failed: its progress deadline"), m
    assert m.argo[1].endswith(" (hold)"), m
    rolling = [s for s in seen if s.state == "rolling"]
    print(f"seen rolling {len(rolling)} times, then failed: {m}")  # (the moment may be missed)


def test_the_argocd_cm_recipe_in_the_docs_installs_the_checks(
    kube: Kube, control_plane: ControlPlane
) -> None:
    """docs/gitops.md's `kubectl patch configmap argocd-cm` command, run as written from the
    checkout on an `argocd-cm` that has settings of its own: the six keys read back, each
    health key equal to the chart's file; the other settings kept; a second run changes
    nothing. The scripts as stored say what the files say."""
    recipe = fenced("gitops.md", "sh", "kubectl patch configmap argocd-cm")
    with contextlib.suppress(AlreadyExists):
        kube.create("/api/v1/namespaces", {"metadata": {"name": "argocd"}})
    cm = path("configmaps", "argocd", "argocd-cm")
    try:
        kube.create(
            path("configmaps", "argocd"),
            configmap(
                "argocd-cm",
                {
                    "url": "https://argocd.example.com",
                    "resource.customizations.health.apps_Deployment": "hs = {}\nreturn hs\n",
                },
            ),
        )
        env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)}
        for _ in range(2):
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", recipe],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr + done.stdout
            assert "configmap/argocd-cm patched" in done.stdout, done.stdout
            data = kube.get(cm)["data"]
            assert data == {
                "url": "https://argocd.example.com",
                **{f"resource.customizations.health.apps_{k}": argocd_check(k) for k in KINDS},
                **{f"resource.customizations.useOpenLibs.apps_{k}": "true" for k in KINDS},
            }
        stored = data["resource.customizations.health.apps_Deployment"]
        sample = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "generation": 1, "annotations": {HELD: "Paused: x"}},
            "spec": {"replicas": 1},
            "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                       "availableReplicas": 1},
        }  # fmt: skip
        assert argocd_health(stored, sample) == ("Suspended", "configpin: x")
    finally:
        with contextlib.suppress(NotFound):
            kube.delete(cm)
