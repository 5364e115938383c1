"""Rollout windows and the flap guard against the API server (shared/SPEC.md "Windows and
budgets"), with the webhook registered as the chart registers it and two replicas running as
the chart runs them (one Lease, short here so that a killed leader is replaced in seconds):

- changes that arrive while a namespace's window is closed wait (status awaiting-window, one
  Normal Event saying when it opens) and roll once, to the last content, when it opens, though
  the leader was killed while they waited and again just before it opened;
- a namespace's window list edited to what cannot be read holds its workloads, saying so;
  removed, what waited rolls at once;
- a person's own rollout (a restart, an undo) is never held by a closed window, and configpin
  starts none of its own there;
- a workload past its rollout budget (`2/1m`) is held as flapping (a Warning Event naming the
  source that keeps changing, status flapping), though the leader changes, and rolls once, to
  the latest content, when the budget allows again; the count is the workload's own signed
  record, which neither a GitOps tool's whole-object replace nor a person's undo resets;
- a workload write that sets a window list or a budget that cannot be read is refused, naming
  the annotation.

Windows open at the next minute but one (cron's resolution); no test waits for a real hour.
No kubelet: pods stay Pending unless the fake `Kubelet` reports them Ready.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from harness.apps import rollout_undo
from harness.configpin import (
    CONFIGPIN_NAMESPACE,
    INSTANCE_LABEL,
)
from harness.controlplane import ENABLED_LABEL, ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap
from tests.integration.instances import Replicas, replicas_pair
from tests.integration.workloads import (
    annotation,
    approve,
    get,
    kubectl_configpin,
    namespace_editor,
    notes,
    quiet,
    reader,
    replicasets,
    set_cm,
    sources,
    stamped,
    status,
    wait_event,
    wait_healthy,
)
from webhook.core import digest
from webhook.core.constants import (
    ANN_APPROVED,
    ANN_ROLLOUT_BUDGET,
    ANN_ROLLOUT_STARTS,
    ANN_ROLLOUT_WINDOWS,
)
from webhook.core.model import SourceKind
from webhook.kube.digestkey import read_digest_key
from webhook.kube.errors import KubeError
from webhook.kube.raw import MERGE_PATCH, Kube, path

RESYNC = 2.0
LEASE = 4.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
    "--lease-duration", str(LEASE),
    "--rollout-waves", "off",
]  # fmt: skip
ALWAYS_CLOSED = json.dumps([{"kind": "deny", "schedule": "* * * * *", "duration": "1h"}])
AWAITING = "ConfigRolloutAwaitingWindow"
FLAPPING = "ConfigRolloutFlapping"


replicas = replicas_pair("win", ARGS)


@pytest.fixture
def namespace(
    k8s: client.ApiClient, replicas: Replicas
) -> Iterator[Callable[[dict[str, str] | None], str]]:
    """Fresh namespaces of the instance, with the annotations given."""
    core = client.CoreV1Api(k8s)
    made: list[str] = []

    def make(annotations: dict[str, str] | None = None) -> str:
        name = f"win-{secrets.token_hex(4)}"
        labels = {ENABLED_LABEL: "true", INSTANCE_LABEL: replicas.instance}
        meta = {"name": name, "labels": labels, "annotations": annotations or {}}
        core.create_namespace({"metadata": meta})  # type: ignore[arg-type]
        made.append(name)
        wait_for(lambda: core.list_namespaced_service_account(name).items, what="default SA")
        return name

    yield make
    for name in made:
        with contextlib.suppress(Exception):
            core.delete_namespace(name)


# --- helpers --------------------------------------------------------------------------------


def _next_opening(ahead: float = 50.0) -> tuple[str, float]:
    """An allow window (one hour) that opens at the first whole minute at least `ahead`
    seconds from now (UTC), and when that is."""
    at = math.ceil((time.time() + ahead) / 60) * 60
    moment = time.gmtime(at)
    schedule = f"{moment.tm_min} {moment.tm_hour} * * *"
    text = json.dumps([{"kind": "allow", "schedule": schedule, "duration": "1h"}])
    return text, float(at)


def _annotate_namespace(kube: Kube, ns: str, value: str | None) -> None:
    kube.patch(
        path("namespaces", None, ns),
        {"metadata": {"annotations": {ANN_ROLLOUT_WINDOWS: value}}},
        content_type=MERGE_PATCH,
    )


def _app(kube: Kube, ns: str, names: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """ConfigMap `cfg` (a: 1) and Deployments `names` reading it, Ready: their records."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
        for name, notes_ in names.items():
            kube.create(path("deployments", ns), reader(name, annotations=notes_))
        before = {n: sources(stamped(kube, ns, n)) for n in names}
        wait_healthy(kube, ns, list(names))
    return before


def _content_of(kube: Kube, ns: str, value: str) -> dict[str, str]:
    """What a workload reading `cfg`'s key a records for content `value`, with `cfg` set to
    it now: the digest under the running configpin's key, worked out here. (A probe admitted
    right after the write is no measure: admission reads its replica's cache, which may not
    have seen the write yet, and the controller re-stamps such a probe later.)"""
    set_cm(kube, ns, value)
    hkey = read_digest_key(kube, CONFIGPIN_NAMESPACE, "configpin-digest-key")
    stored = get(kube, ns, "cfg", "configmaps")
    record = digest.record_from_object(hkey, SourceKind.CONFIGMAP, stored)
    return {"configmap/cfg": digest.source_digest(digest.namespace_key(hkey, ns), record, ["a"])}


# --- windows --------------------------------------------------------------------------------


def test_changes_while_the_window_is_closed_roll_once_to_the_last_content_when_it_opens(
    kube: Kube,
    control_plane: ControlPlane,
    replicas: Replicas,
    namespace: Callable[[dict[str, str] | None], str],
) -> None:
    """The namespace allows rollouts from the next minute but one. Three changes arrive before
    that, the leader killed between the second and the third and again just before the window
    opens: `app` waits (one Normal Event saying when it opens, status awaiting-window, its
    template untouched, a second ReplicaSet nowhere), then rolls once, to the third content."""
    windows, opens = _next_opening(ahead=75.0)
    ns = namespace({ANN_ROLLOUT_WINDOWS: windows})
    before = _app(kube, ns, {"app": {}})
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("app")
        set_cm(kube, ns, "2")
        wait_event(kube, ns, "app", AWAITING, "Normal")
        [note] = notes(kube, ns, "app", AWAITING)
        assert f"namespace {ns}'s {ANN_ROLLOUT_WINDOWS}" in note, note
        assert time.strftime("%H:%M", time.gmtime(opens)) + " UTC" in note, note
        assert status(control_plane, ns)["app"]["state"] == "awaiting-window"
        set_cm(kube, ns, "3")
        replicas.kill_leader()
        last = _content_of(kube, ns, "4")
        quiet(kube, ns, before, max(0.0, opens - time.time() - 12))
        replicas.kill_leader()  # (the new leader finds what waits from the cluster alone)
        quiet(kube, ns, before, max(0.0, opens - time.time() - 1))
        wait_for(
            lambda: sources(get(kube, ns, "app")) != before["app"],
            timeout=60,
            what="app rolled once its window opened",
        )
        assert time.time() >= opens
        assert sources(get(kube, ns, "app")) == last  # (the last content, not an earlier one)
        quiet(kube, ns, {"app": last}, 3 * RESYNC)
        assert replicasets(kube, ns, "app") == 2  # one rollout, not one per change
    # said once by each leader it waited under (three), not once per change or pass
    said = notes(kube, ns, "app", AWAITING)
    assert len(said) <= 3 and len(set(said)) == 1, said


def test_a_namespace_window_list_edited_while_a_change_waits(
    kube: Kube,
    control_plane: ControlPlane,
    replicas: Replicas,
    namespace: Callable[[dict[str, str] | None], str],
) -> None:
    """A change waits for a window that is always closed, and is not decided again at each
    resync. The namespace's list edited to one that cannot be read: still held, and the
    Event says which list and what is wrong; removed: the change rolls at once (no window
    left), to the content it has then."""
    ns = namespace({ANN_ROLLOUT_WINDOWS: ALWAYS_CLOSED})
    before = _app(kube, ns, {"app": {}})
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("app")
        set_cm(kube, ns, "2")
        wait_event(kube, ns, "app", AWAITING, "Normal")
        # Held: the resyncs find it held still from memory, and decide it no more (each
        # decision would read it from the API server again).
        lead = replicas.leader()
        decided = lead.metric("configpin_rollouts_skipped_total", reason="waiting")
        quiet(kube, ns, before, 3 * RESYNC)
        assert lead.metric("configpin_rollouts_skipped_total", reason="waiting") == decided
        _annotate_namespace(kube, ns, '[{"kind": "allow", "schedule": "0 9 * * 1-5"}]')
        wait_for(
            lambda: any("cannot be read" in n for n in notes(kube, ns, "app", AWAITING)),
            what="an Event naming the list that cannot be read",
        )
        said = next(n for n in notes(kube, ns, "app", AWAITING) if "cannot be read" in n)
        assert f"namespace {ns}'s {ANN_ROLLOUT_WINDOWS}" in said and "duration" in said, said
        quiet(kube, ns, before, 2 * RESYNC)
        _annotate_namespace(kube, ns, None)
        wait_for(
            lambda: sources(get(kube, ns, "app")) != before["app"],
            timeout=30,
            what="app rolled once its namespace's window list was removed",
        )
        wait_for(
            lambda: status(control_plane, ns)["app"]["state"] == "current",
            what="app's rollout complete",
        )


def test_a_persons_restart_and_undo_are_never_held_by_a_closed_window(
    kube: Kube,
    k8s: client.ApiClient,
    replicas: Replicas,
    namespace: Callable[[dict[str, str] | None], str],
) -> None:
    """With the window closed and a change waiting, a person's `kubectl rollout restart`
    makes its ReplicaSet at once, and their `rollout undo` goes back; configpin starts
    nothing of its own meanwhile (a person's rollout is theirs)."""
    ns = namespace({ANN_ROLLOUT_WINDOWS: ALWAYS_CLOSED})
    _app(kube, ns, {"app": {}})
    apps = client.AppsV1Api(k8s)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("app")
        set_cm(kube, ns, "2")
        wait_event(kube, ns, "app", AWAITING, "Normal")
        restarted_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        apps.patch_namespaced_deployment(
            "app",
            ns,
            {
                "spec": {
                    "template": {
                        "metadata": {
                            "annotations": {"kubectl.kubernetes.io/restartedAt": restarted_at}
                        }
                    }
                }
            },
        )
        wait_for(lambda: replicasets(kube, ns, "app") == 2, what="the person's restart rolled")
        rollout_undo(k8s, ns, "app")
        undone = wait_for(
            lambda: (
                (d := get(kube, ns, "app"))["status"].get("observedGeneration")
                == d["metadata"]["generation"]
                and d
            ),
            what="the Deployment controller seeing the undo",
        )
        assert (
            annotation(undone["spec"]["template"], "kubectl.kubernetes.io/restartedAt") is None
        ), "the person's undo was taken back"
        quiet(kube, ns, {"app": sources(undone)}, 3 * RESYNC)


def test_approve_now_rolls_a_change_in_a_closed_window_and_the_next_change_waits(
    kube: Kube,
    control_plane: ControlPlane,
    replicas: Replicas,
    namespace: Callable[[dict[str, str] | None], str],
    tmp_path: Path,
) -> None:
    """The window is closed and a change waits. `kubectl configpin approve --now` by a user
    who may edit the namespace's ConfigMaps rolls it at once; the source's approval record
    names who overrode the window. The next change, not approved, waits again."""
    ns = namespace({ANN_ROLLOUT_WINDOWS: ALWAYS_CLOSED})
    before = _app(kube, ns, {"app": {}})
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("app")
        set_cm(kube, ns, "2")
        wait_event(kube, ns, "app", AWAITING, "Normal")
        quiet(kube, ns, before, 2 * RESYNC)
        done = kubectl_configpin(["approve", "--now", "configmap/cfg", "-n", ns], editor)
        assert done.returncode == 0, done.stderr + done.stdout
        wait_for(
            lambda: sources(get(kube, ns, "app")) != before["app"],
            timeout=30,
            what="app rolled at once, approved --now",
        )
        approved = annotation(get(kube, ns, "cfg", "configmaps"), ANN_APPROVED)
        assert approved["now"] is True and approved["user"] != "admin", approved
        rolled = sources(get(kube, ns, "app"))
        set_cm(kube, ns, "3")
        wait_for(
            lambda: (
                len(notes(kube, ns, "app", AWAITING)) >= 2
                or status(control_plane, ns)["app"]["state"] == "awaiting-window"
            ),
            what="the next change waiting for the window",
        )
        quiet(kube, ns, {"app": rolled}, 3 * RESYNC)


# --- the flap guard -------------------------------------------------------------------------


def test_a_workload_past_its_budget_is_held_as_flapping_and_rolls_once_when_it_allows(
    kube: Kube,
    control_plane: ControlPlane,
    replicas: Replicas,
    namespace: Callable[[dict[str, str] | None], str],
) -> None:
    """`app` may be rolled twice a minute (`2/1m`). Two changes roll it; the third is held as
    flapping (a Warning Event naming configmap/cfg, status flapping), a fourth joins it, the
    leader is killed; once the first start leaves the period it rolls once, to the fourth
    content. The starts are counted from the workload's own record."""
    ns = namespace(None)
    before = _app(kube, ns, {"app": {ANN_ROLLOUT_BUDGET: "2/1m"}})
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("app")
        seen = before["app"]
        first_change = time.time()  # (the first start is after it: the budget allows again
        for value in ("2", "3"):  # no sooner than a minute after it)
            set_cm(kube, ns, value)
            wait_for(
                lambda was=seen: sources(get(kube, ns, "app")) != was,  # type: ignore[misc]
                what=f"app rolled to {value}",
            )
            seen = sources(get(kube, ns, "app"))
        assert annotation(get(kube, ns, "app"), ANN_ROLLOUT_STARTS) is not None
        set_cm(kube, ns, "4")
        wait_event(kube, ns, "app", FLAPPING, "Warning")
        last = _content_of(kube, ns, "5")
        [note] = notes(kube, ns, "app", FLAPPING)
        assert (
            "configmap/cfg keeps changing" in note and "its rollout budget allows (2/1m)" in note
        ), note
        wait_for(  # (once the rollout in flight, of content 3, is complete)
            lambda: status(control_plane, ns)["app"]["state"] == "flapping",
            what="app's status flapping",
        )
        replicas.kill_leader()
        quiet(kube, ns, {"app": seen}, max(0.0, first_change + 60 - time.time() - 5))
        wait_for(
            lambda: sources(get(kube, ns, "app")) != seen,
            timeout=60,
            what="app rolled once its budget allowed",
        )
        assert sources(get(kube, ns, "app")) == last
        assert replicasets(kube, ns, "app") == 4  # created, 2, 3, then the last content once


def test_an_approval_rolls_a_flapping_workload_once_and_the_next_change_is_held(
    kube: Kube,
    control_plane: ControlPlane,
    replicas: Replicas,
    namespace: Callable[[dict[str, str] | None], str],
    tmp_path: Path,
) -> None:
    """`app` may be rolled once an hour (`1/1h`): the first change rolls it, the second is
    held as flapping; a person's `kubectl configpin approve` of that content rolls it now;
    the third change is held again (the approval was for the content it named)."""
    ns = namespace(None)
    before = _app(kube, ns, {"app": {ANN_ROLLOUT_BUDGET: "1/1h"}})
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("app")
        set_cm(kube, ns, "2")
        wait_for(lambda: sources(get(kube, ns, "app")) != before["app"], what="app rolled")
        first = sources(get(kube, ns, "app"))
        set_cm(kube, ns, "3")
        wait_event(kube, ns, "app", FLAPPING, "Warning")
        quiet(kube, ns, {"app": first}, 2 * RESYNC)
        approve(editor, ns)
        wait_for(
            lambda: sources(get(kube, ns, "app")) != first,
            what="app rolled once a person approved the change",
        )
        second = sources(get(kube, ns, "app"))
        set_cm(kube, ns, "4")
        quiet(kube, ns, {"app": second}, 3 * RESYNC)
        assert replicasets(kube, ns, "app") == 3


def test_a_replace_and_an_undo_neither_reset_nor_rewind_a_flapping_workloads_count(
    kube: Kube,
    k8s: client.ApiClient,
    replicas: Replicas,
    namespace: Callable[[dict[str, str] | None], str],
) -> None:
    """`app` may be rolled once an hour (`1/1h`): the first change rolls it, the second is
    held as flapping. A GitOps tool then replaces the Deployment whole with what Git says (no
    `configpin.io/rollout-starts`), and a person runs `kubectl rollout undo` (which puts the
    first ReplicaSet's copy of the annotations back, from before any rollout): the count is
    kept through both, and the held change stays held."""
    ns = namespace(None)
    budget = {ANN_ROLLOUT_BUDGET: "1/1h"}
    before = _app(kube, ns, {"app": budget})
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("app")
        set_cm(kube, ns, "2")
        wait_for(lambda: sources(get(kube, ns, "app")) != before["app"], what="app rolled")
        rolled = sources(get(kube, ns, "app"))
        counted = annotation(get(kube, ns, "app"), ANN_ROLLOUT_STARTS)
        assert counted is not None
        set_cm(kube, ns, "3")
        wait_event(kube, ns, "app", FLAPPING, "Warning")

        kube.replace(path("deployments", ns, "app"), reader("app", annotations=budget))
        replaced = get(kube, ns, "app")
        assert annotation(replaced, ANN_ROLLOUT_STARTS) == counted, "the count was reset"
        assert sources(replaced) == rolled
        quiet(kube, ns, {"app": rolled}, 3 * RESYNC)

        rollout_undo(k8s, ns, "app")
        undone = get(kube, ns, "app")
        assert sources(undone) == before["app"]  # the person's undo is theirs
        assert annotation(undone, ANN_ROLLOUT_STARTS) == counted, "the count was rewound"
        quiet(kube, ns, {"app": before["app"]}, 3 * RESYNC)
        assert replicasets(kube, ns, "app") == 2


# --- admission ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        (ANN_ROLLOUT_WINDOWS, '[{"kind": "allow", "schedule": "0 9 * * *"}]', "duration"),
        (ANN_ROLLOUT_WINDOWS, '[{"kind": "allow", "schedule": "0 25 * * *", "duration": "1h"}]',
         "schedule"),
        (ANN_ROLLOUT_BUDGET, "6 per hour", "COUNT/PERIOD"),
    ],
)  # fmt: skip
def test_a_workload_write_with_limits_that_cannot_be_read_is_refused(
    kube: Kube,
    replicas: Replicas,
    namespace: Callable[[dict[str, str] | None], str],
    key: str,
    value: str,
    said: str,
) -> None:
    ns = namespace(None)
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    with pytest.raises(KubeError) as refused:
        kube.create(path("deployments", ns), reader("app", annotations={key: value}))
    assert key in str(refused.value) and said in str(refused.value), refused.value
    kube.create(path("deployments", ns), reader("app"))
    with pytest.raises(KubeError) as again:
        kube.patch(
            path("deployments", ns, "app"),
            {"metadata": {"annotations": {key: value}}},
            content_type=MERGE_PATCH,
        )
    assert key in str(again.value), again.value
    assert annotation(get(kube, ns, "app"), key) is None
