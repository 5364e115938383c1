"""No rollout the user did not cause, and none undone: configpin's webhook (registered as the
chart registers it) and its controller, together, against the real API server and
controller-manager. A rollout is what the controller-manager makes of a new pod template: a
new ReplicaSet, and the next `deployment.kubernetes.io/revision` on the Deployment. The
revision counts every template the deployment controller acted on, one undone a moment later
included (the old ReplicaSet becomes the newest again, with the next revision): where it says
1 + n, there were exactly n rollouts and none undone. (Not `metadata.generation`: a
Deployment's moves with its metadata annotations too.)

Two configpins of their own (instances `agree` and `adopt`), so that their settings do not
depend on the session's: a short coalescing window, no minimum interval; `adopt` also with
`--catch-up-window 0`, so that the Deployments a test has just created count as the old,
existing workloads of a namespace being opted in.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes import client

from harness.configpin import (
    INSTANCE_LABEL,
    Configpin,
    ensure_namespace,
    running_configpin,
    start_configpin,
)
from harness.controlplane import (
    ENABLED_LABEL,
    ControlPlane,
    default_service_account_ready,
    wait_for,
)
from harness.manifests import configmap, deployment
from tests.integration.holdproxy import HoldProxy, hold_proxy
from tests.integration.instances import leading_fixture
from tests.integration.workloads import replicasets, revision
from tests.timing import CHART_WINDOW, settled
from webhook.core.constants import ANN_MODE, ANN_OBSERVED, ANN_ROLLED_AT, ANN_SOURCES
from webhook.core.model import JSONObject
from webhook.kube.errors import Conflict
from webhook.kube.raw import Kube, path

WINDOW = (
    CHART_WINDOW  # the default: a ConfigMap and its workload applied together land well within it
)
# Long enough for a rollout that should not happen to have happened: the controller acts a
# coalescing window after the change it saw, and the deployment controller within a second.
SETTLE = settled(WINDOW)
APPLY = "application/apply-patch+yaml"


# (fifty releases within a minute, half of them config changes configpin rolls: past the
# default rollout budget, 6/1h, the seventh would be held as flapping, by design, as
# test_windows shows; here every round must roll)
cp = leading_fixture(
    "agree",
    "agree",
    ["--coalesce-window", str(WINDOW), "--min-rollout-interval", "0", "--rollout-budget", "0"],
)
cp_adopt = leading_fixture(
    "adopt",
    "adopt",
    ["--coalesce-window", str(WINDOW), "--min-rollout-interval", "0", "--catch-up-window", "0"],
)


def new_namespace(k8s: client.ApiClient, instance: str, *, enabled: bool = True) -> str:
    name = f"agree-{secrets.token_hex(4)}"
    labels = {INSTANCE_LABEL: instance}
    if enabled:
        labels[ENABLED_LABEL] = "true"
    client.CoreV1Api(k8s).create_namespace({"metadata": {"name": name, "labels": labels}})
    wait_for(lambda: default_service_account_ready(k8s, name), what="default SA")
    return name


@pytest.fixture
def ns(k8s: client.ApiClient, cp: Configpin) -> Iterator[str]:
    name = new_namespace(k8s, "agree")
    yield name
    client.CoreV1Api(k8s).delete_namespace(name)


# --- helpers


def server_side_apply(kube: Kube, ns: str, obj: JSONObject, *, force: bool = False) -> JSONObject:
    """What `kubectl apply --server-side [--force-conflicts]` sends for one object."""
    resource = {"ConfigMap": "configmaps", "Deployment": "deployments"}[obj["kind"]]
    name = obj["metadata"]["name"]
    return kube.patch(
        path(resource, ns, name), obj, content_type=APPLY, fieldManager="kubectl", force=force
    )


def sources(obj: JSONObject) -> dict[str, str]:
    text = ((obj["spec"]["template"].get("metadata") or {}).get("annotations") or {}).get(
        ANN_SOURCES
    )
    return json.loads(text) if text else {}


def observed(obj: JSONObject) -> dict[str, str]:
    text = (obj["metadata"].get("annotations") or {}).get(ANN_OBSERVED)
    return json.loads(text) if text else {}


def settled(obj: JSONObject) -> bool:
    """The deployment controller has acted on the object's latest spec (a new template has
    its ReplicaSet by then)."""
    status = obj.get("status") or {}
    return bool(status.get("observedGeneration") == obj["metadata"].get("generation"))


def _change_each_and_see_one_rollout(kube: Kube, ns: str, names: list[str]) -> list[JSONObject]:
    """Change the consumed key of each `<name>-config`; each Deployment rolls exactly once,
    onto a record of that ConfigMap. Returns the settled Deployments."""
    for name in names:
        kube.patch(
            path("configmaps", ns, f"{name}-config"),
            {"data": {"a": "2"}},
            content_type="application/merge-patch+json",
        )
    for name in names:
        wait_for(
            lambda n=name: replicasets(kube, ns, n) == 2,  # type: ignore[misc]
            what=f"the rollout of {name}",
        )
    time.sleep(SETTLE)  # a second rollout of any of them would have started by now
    settled = []
    for name in names:
        dep = settled_deployment(kube, ns, name)
        assert replicasets(kube, ns, name) == 2
        assert revision(dep) == 2
        assert set(sources(dep)) == {f"configmap/{name}-config"}
        settled.append(dep)
    return settled


def settled_deployment(kube: Kube, ns: str, name: str) -> JSONObject:
    def current() -> JSONObject | None:
        dep = kube.get(path("deployments", ns, name))
        return dep if settled(dep) else None

    return wait_for(current, what=f"deployment {name} settled")


def manifest(name: str, *, release: int | None = None, mode: str | None = None) -> JSONObject:
    """The user's Deployment: reads key `a` of ConfigMap `<name>-config`; keeps many
    ReplicaSets, so that counting them counts every rollout."""
    body = deployment(name, annotations={ANN_MODE: mode} if mode else None)
    body["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"][
        "name"
    ] = f"{name}-config"
    body["spec"]["revisionHistoryLimit"] = 100
    if release is not None:
        body["spec"]["template"]["metadata"]["annotations"] = {"example.com/release": str(release)}
    return body


# --- adoption, metadata edits


def still_at_revision(kube: Kube, ns: str, name: str, number: int) -> JSONObject:
    """Once a second rollout would have started (SETTLE), Deployment `name` is still at
    revision `number`, with as many ReplicaSets: nothing rolled it again. Returns it."""
    time.sleep(SETTLE)
    dep = settled_deployment(kube, ns, name)
    assert revision(dep) == number
    assert replicasets(kube, ns, name) == number
    return dep


def test_adopting_a_namespace_of_20_deployments_restarts_none(
    cp_adopt: Configpin, k8s: client.ApiClient, kube: Kube
) -> None:
    """Opting in an existing namespace: zero new ReplicaSets; then a label edit and a replicas
    change: zero; then one consumed change: exactly one new ReplicaSet each."""
    ns = new_namespace(k8s, "adopt", enabled=False)
    names = [f"web-{i:02d}" for i in range(20)]
    try:
        for name in names:
            kube.create(path("configmaps", ns), configmap(f"{name}-config", {"a": "1", "b": "1"}))
            kube.create(path("deployments", ns), manifest(name))
        templates = {}
        for name in names:
            templates[name] = settled_deployment(kube, ns, name)["spec"]["template"]
            assert replicasets(kube, ns, name) == 1
        baselines = cp_adopt.metric("configpin_rollouts_skipped_total", reason="record-only")

        client.CoreV1Api(k8s).patch_namespace(ns, {"metadata": {"labels": {ENABLED_LABEL: "true"}}})
        for name in names:
            wait_for(
                lambda n=name: observed(kube.get(path("deployments", ns, n))),  # type: ignore[misc]
                what=f"the baseline of {name}",
            )
        assert (
            cp_adopt.metric("configpin_rollouts_skipped_total", reason="record-only")
            == baselines + 20
        )
        time.sleep(SETTLE)  # anything the baselines set off would have started by now
        for name in names:
            dep = settled_deployment(kube, ns, name)
            assert dep["spec"]["template"] == templates[name], f"{name}: template changed"
            assert revision(dep) == 1
            assert replicasets(kube, ns, name) == 1

        for name in names:
            kube.patch(
                path("deployments", ns, name),
                {"metadata": {"labels": {"team": "payments"}}, "spec": {"replicas": 1}},
                content_type="application/merge-patch+json",
            )
        time.sleep(SETTLE)
        for name in names:
            dep = settled_deployment(kube, ns, name)
            assert dep["spec"]["replicas"] == 1
            assert dep["spec"]["template"] == templates[name], f"{name}: template changed"
            assert revision(dep) == 1
            assert replicasets(kube, ns, name) == 1

        rollouts = cp_adopt.metric("configpin_rollouts_total", kind="Deployment")
        for dep in _change_each_and_see_one_rollout(kube, ns, names):
            assert ANN_OBSERVED not in (dep["metadata"].get("annotations") or {})
        assert cp_adopt.metric("configpin_rollouts_total", kind="Deployment") == rollouts + 20
    finally:
        client.CoreV1Api(k8s).delete_namespace(ns)


# --- the apply flow


def _record_changed(kube: Kube, ns: str, before: dict[str, str]) -> JSONObject | None:
    dep = kube.get(path("deployments", ns, "web"))
    return dep if settled(dep) and sources(dep) != before else None


@pytest.mark.parametrize("mode", ["checksum", "snapshot"])
def test_configmap_and_deployment_applied_together_50_times_roll_once_each(
    cp: Configpin, kube: Kube, ns: str, mode: str
) -> None:
    """`kubectl apply --server-side --force-conflicts` (what Argo CD and Flux send) of one
    file holding the ConfigMap and its Deployment, the ConfigMap changed every time. Odd
    rounds list the ConfigMap first and change the Deployment's template too (a release);
    even rounds list the Deployment first, unchanged. Every round: exactly one rollout, with
    the new content."""
    server_side_apply(kube, ns, configmap("web-config", {"a": "0"}), force=True)
    server_side_apply(kube, ns, manifest("web", release=0, mode=mode), force=True)
    first = settled_deployment(kube, ns, "web")
    assert revision(first) == 1
    record = sources(first)
    assert set(record) == {"configmap/web-config"}
    assert replicasets(kube, ns, "web") == 1
    release = 0
    rounds = 50
    for i in range(1, rounds + 1):
        cm = configmap("web-config", {"a": str(i)})
        if i % 2:
            release = i
            objects = [cm, manifest("web", release=release, mode=mode)]
        else:
            objects = [manifest("web", release=release, mode=mode), cm]
        for obj in objects:
            server_side_apply(kube, ns, obj, force=True)
        dep = wait_for(
            lambda r=record: _record_changed(kube, ns, r),  # type: ignore[misc]
            what=f"round {i}: the new content recorded",
        )
        record = sources(dep)
        assert revision(dep) == 1 + i, f"round {i}: a second rollout, or one undone"
        assert replicasets(kube, ns, "web") == 1 + i, f"round {i}"
    last = still_at_revision(kube, ns, "web", 1 + rounds)
    # and the last record is the last content: what admission records for it now
    probe = manifest("web", mode=mode)
    probe["metadata"]["name"] = "probe"
    assert sources(last) == sources(kube.create(path("deployments", ns), probe, dryRun="All"))


def test_a_first_install_listing_the_deployment_first_rolls_once(
    cp: Configpin, kube: Kube, ns: str
) -> None:
    """The Deployment is admitted before its ConfigMap exists (with a warning naming it); the
    ConfigMap's arrival completes the record without a rollout; its next change rolls."""
    names = [f"app-{i}" for i in range(10)]
    for name in names:
        server_side_apply(kube, ns, manifest(name), force=True)
        server_side_apply(kube, ns, configmap(f"{name}-config", {"a": "1"}), force=True)
    for name in names:
        wait_for(
            lambda n=name: observed(kube.get(path("deployments", ns, n))),  # type: ignore[misc]
            what=f"the record of {name} completed",
        )
    time.sleep(SETTLE)
    for name in names:
        dep = settled_deployment(kube, ns, name)
        assert set(observed(dep)) == {f"configmap/{name}-config"}
        assert sources(dep) == {}  # the template as admitted: no restart
        assert revision(dep) == 1
        assert replicasets(kube, ns, name) == 1

    for dep in _change_each_and_see_one_rollout(kube, ns, names):
        assert observed(dep) == {}


# --- two replicas, one lagging


@pytest.mark.parametrize("mode", ["checksum", "snapshot"])
def test_a_replica_whose_watch_lags_never_undoes_the_controllers_rollout(
    control_plane: ControlPlane, k8s: client.ApiClient, kube: Kube, tmp_path: Path, mode: str
) -> None:
    """Two replicas, as behind the chart's Service: A leads the controller and sees changes at
    once; B serves the webhook, every admission of it. First B's watch is current: A's
    re-stamp passes B as A planned it, and in checksum mode without a read of B's own (B's
    cache agrees; a snapshot re-point changes references, which B reads fresh). Then B's
    ConfigMap watch is held back by a proxy: A's rollout passes through B, whose cache still
    has the old content: B must settle it from the API server, not undo it. Each counted
    once, none undone."""
    ensure_namespace(k8s)
    # A acts a window after it saw a change: long enough for B's watch to have seen it too
    # when it is not held back.
    args = ["--coalesce-window", "2", "--min-rollout-interval", "0"]
    with (
        hold_proxy(control_plane, tmp_path / "proxy") as proxy,
        running_configpin(control_plane, tmp_path / "a", instance="lag", args=args) as a,
    ):
        wait_for(lambda: a.metric("configpin_leader") == 1, what="A leading")
        with running_configpin(
            replace(control_plane, kubeconfig=proxy.kubeconfig),
            tmp_path / "b",
            instance="lag",
            webhook_name="configpin-lag",
            args=args,
        ) as b:
            ns = new_namespace(k8s, "lag")
            try:
                _lagging_replica(kube, ns, mode, proxy, a, b)
            finally:
                client.CoreV1Api(k8s).delete_namespace(ns)


def _probe(kube: Kube, ns: str, mode: str) -> dict[str, str]:
    """What admission (B: the only replica the webhook calls) records for `web` now."""
    probe = manifest("web", mode=mode)
    probe["metadata"]["name"] = "probe"
    return sources(kube.create(path("deployments", ns), probe, dryRun="All"))


def _lagging_replica(
    kube: Kube, ns: str, mode: str, proxy: HoldProxy, a: Configpin, b: Configpin
) -> None:
    kube.create(path("configmaps", ns), configmap("web-config", {"a": "1"}))
    kube.create(path("deployments", ns), manifest("web", mode=mode))
    first = sources(settled_deployment(kube, ns, "web"))
    assert set(first) == {"configmap/web-config"}
    assert _probe(kube, ns, mode) == first  # B has seen the ConfigMap
    rollouts = a.metric("configpin_rollouts_total", kind="Deployment")
    fresh = b.metric("configpin_source_reads_total", how="fresh")

    # B's watch is current: B sees the change before A acts on it.
    _set(kube, ns, "2")
    wait_for(lambda: _probe(kube, ns, mode) != first, what="B seeing the change")
    assert sources(kube.get(path("deployments", ns, "web"))) == first, "A acted too soon"
    before = sources(wait_for(lambda: _record_changed(kube, ns, first), what="A's rollout"))
    assert _probe(kube, ns, mode) == before
    if mode == "checksum":
        assert b.metric("configpin_source_reads_total", how="fresh") == fresh
    else:
        assert b.metric("configpin_source_reads_total", how="fresh") > fresh
    settled_deployment(kube, ns, "web")
    fresh = b.metric("configpin_source_reads_total", how="fresh")

    # B's watch lags.
    proxy.hold.set()
    _set(kube, ns, "3")
    dep = wait_for(lambda: _record_changed(kube, ns, before), what="A's rollout")
    after = sources(dep)
    assert _probe(kube, ns, mode) == before, "B's watch was meant to lag here"
    assert b.metric("configpin_source_reads_total", how="fresh") > fresh

    proxy.release()
    wait_for(lambda: _probe(kube, ns, mode) == after, what="B caught up")
    time.sleep(SETTLE)  # a re-stamp by anyone would have happened by now
    last = settled_deployment(kube, ns, "web")
    assert sources(last) == after
    assert revision(last) == 3, "a third rollout, or one undone"
    assert replicasets(kube, ns, "web") == 3
    assert a.metric("configpin_rollouts_total", kind="Deployment") == rollouts + 2
    assert a.metric("configpin_rollouts_skipped_total", reason="not-stored") == 0


# --- pacing across a leader change


def _rolled_at(dep: JSONObject) -> float:
    text = (dep["metadata"].get("annotations") or {})[ANN_ROLLED_AT]
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_the_minimum_interval_holds_across_a_leader_change(
    control_plane: ControlPlane, k8s: client.ApiClient, kube: Kube, tmp_path: Path
) -> None:
    """A rolls the Deployment and stops; B takes over and sees the next change at once. B has
    never rolled it, but the workload says when it last rolled: B waits out the interval."""
    ensure_namespace(k8s)
    interval = 30
    args = ["--coalesce-window", "0.5", "--min-rollout-interval", str(interval)]
    a = start_configpin(control_plane, tmp_path / "a", instance="pace", args=args)
    try:
        wait_for(lambda: a.metric("configpin_leader") == 1, what="A leading")
        with running_configpin(
            control_plane, tmp_path / "b", instance="pace", webhook_name="configpin-pace", args=args
        ) as b:
            ns = new_namespace(k8s, "pace")
            kube.create(path("configmaps", ns), configmap("web-config", {"a": "1"}))
            kube.create(path("deployments", ns), manifest("web"))
            before = sources(settled_deployment(kube, ns, "web"))
            _set(kube, ns, "2")
            first = wait_for(lambda: _record_changed(kube, ns, before), what="A's rollout")
            rolled = _rolled_at(first)

            a.stop()  # a clean stop releases the Lease: B takes over at its next attempt
            wait_for(lambda: b.metric("configpin_leader") == 1, what="B leading")
            changed = time.time()
            _set(kube, ns, "3")
            # The test shows something only if the change came well inside the interval.
            assert changed < rolled + interval - 10, "the takeover took too long to show pacing"
            second = wait_for(
                lambda: _record_changed(kube, ns, sources(first)),
                timeout=interval + 30,
                what="B's rollout",
            )
            assert _rolled_at(second) - rolled >= interval - 1  # one-second resolution
            assert replicasets(kube, ns, "web") == 3
            client.CoreV1Api(k8s).delete_namespace(ns)
    finally:
        a.stop()


def _set(kube: Kube, ns: str, value: str) -> None:
    kube.patch(
        path("configmaps", ns, "web-config"),
        {"data": {"a": value}},
        content_type="application/merge-patch+json",
    )


# --- server-side apply (a person's `kubectl apply --server-side`, GitOps tools)


def _rolled_by_controller(kube: Kube, ns: str, name: str, value: str) -> JSONObject:
    before = sources(settled_deployment(kube, ns, name))
    server_side_apply(kube, ns, configmap(f"{name}-config", {"a": value}))
    return wait_for(
        lambda: (
            (d := kube.get(path("deployments", ns, name)))
            and settled(d)
            and sources(d) != before
            and d
        ),
        what="the controller's rollout",
    )


def test_server_side_apply_after_the_controller_restamped(
    cp: Configpin, kube: Kube, ns: str
) -> None:
    """Checksum mode: configpin's record is in annotations the user's manifest does not set;
    the controller owns them (manager `configpin`). Applying the same manifest again, without
    --force-conflicts, changes nothing: no conflict, no rollout."""
    server_side_apply(kube, ns, configmap("web-config", {"a": "1"}))
    server_side_apply(kube, ns, manifest("web"))
    rolled = _rolled_by_controller(kube, ns, "web", "2")
    assert revision(rolled) == 2
    again = server_side_apply(kube, ns, manifest("web"))
    assert sources(again) == sources(rolled)
    assert again["spec"]["template"] == rolled["spec"]["template"]
    still_at_revision(kube, ns, "web", 2)


def test_server_side_apply_after_the_controller_repointed(
    cp: Configpin, kube: Kube, ns: str
) -> None:
    """Snapshot mode: the controller re-points references the user's manifest sets, and so
    owns those fields. A plain `kubectl apply --server-side` of the unchanged manifest then
    meets a conflict with manager `configpin` (and changes nothing); with --force-conflicts
    (as Argo CD and Flux apply) it passes, admission maps the original names to the copies
    of the current content, and nothing rolls."""
    server_side_apply(kube, ns, configmap("web-config", {"a": "1"}))
    server_side_apply(kube, ns, manifest("web", mode="snapshot"))
    rolled = _rolled_by_controller(kube, ns, "web", "2")
    with pytest.raises(Conflict) as conflict:
        server_side_apply(kube, ns, manifest("web", mode="snapshot"))
    assert '"configpin"' in str(conflict.value) and "configMapKeyRef" in str(conflict.value)
    forced = server_side_apply(kube, ns, manifest("web", mode="snapshot"), force=True)
    assert forced["spec"]["template"] == rolled["spec"]["template"]  # the same copy
    still_at_revision(kube, ns, "web", 2)


def test_a_first_install_in_snapshot_mode_rolls_onto_a_copy_once(
    cp: Configpin, kube: Kube, ns: str
) -> None:
    """Snapshot mode: a revision must point at a copy, so the source's arrival rolls the
    Deployment once (onto the copy), and only once."""
    server_side_apply(kube, ns, manifest("app", mode="snapshot"), force=True)
    server_side_apply(kube, ns, configmap("app-config", {"a": "1"}), force=True)
    dep = wait_for(
        lambda: (d := kube.get(path("deployments", ns, "app"))) and settled(d) and sources(d) and d,
        what="the Deployment pointed at a copy",
    )
    ref = dep["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]
    assert ref["configMapKeyRef"]["name"].startswith("app-config-")
    still_at_revision(kube, ns, "app", 2)
