"""Change preview and audit (shared/SPEC.md, docs/preview-and-audit.md), against the API
server with the webhook registered as the chart registers it (both entries: workloads, and
updates and deletions of ConfigMaps and Secrets), two replicas running as the chart runs them:

- a write of a consumed source is answered with warnings that say what each consumer will do
  (roll, in which wave; wait for an approval; refresh in place; nothing; hold), as the client
  receives them (`Warning` headers), on a dry run too, which changes nothing; the replica that
  does not lead answers the same;
- a deletion says who consumes the source and what breaks;
- `configpin plan -f FILE` prints the whole plan from a server-side dry run;
- the user who changed a source is recorded, signed, on it, and named by the rollout record,
  the rollout Event and `configpin status`; a record written around configpin is not believed;
- the waves after `approve` wait for `configpin approve`, made by a user with only namespace
  rights, and a newer change needs its own approval;
- writes configpin has nothing to say about (Helm release Secrets, service-account tokens,
  leader-election ConfigMaps, ignored sources) never reach it where the API server has
  matchConditions (1.28+), and are left alone by configpin itself where it has not.

No kubelet: pods stay Pending unless the fake `Kubelet` reports them Ready.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from harness.apps import write_warned
from harness.configpin import Configpin, instance_namespace
from harness.controlplane import (
    ControlPlane,
    chart_webhooks,
    wait_for,
)
from harness.kubelet import Kubelet, carrying
from harness.manifests import configmap, container, deployment, pod_spec
from tests.integration.instances import leader, replicas_fixture
from tests.integration.workloads import (
    As,
    annotation,
    ask_replica,
    changed_by,
    get,
    kubectl_configpin,
    namespace_editor,
    notes,
    quiet,
    reader,
    record,
    source_review,
    sources,
    stamped,
    status,
    wait_event,
    wait_healthy,
)
from tests.timing import SETTLE
from webhook.core.audit import ChangedBy
from webhook.core.constants import (
    ANN_CHANGED_BY,
    ANN_ON_CHANGE,
    ANN_REJECTED,
    ANN_ROLLOUT_WAVES,
    ANN_SHARED,
    ANN_WAVE,
)
from webhook.core.model import SourceId, SourceKind
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "preview"
RESYNC = 2.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
    "--rollout-waves", "1,approve,100%",
]  # fmt: skip
EDITOR = "alice@example.com"
VALUE = "s3cr3t-value"  # a value that must never be shown
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
JSON_PATCH = "application/json-patch+json"

replicas = replicas_fixture(INSTANCE, "preview", ARGS)


@pytest.fixture
def namespaces(k8s: client.ApiClient, replicas: list[Configpin]) -> Iterator[Callable[[], str]]:
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(instance_namespace(k8s, INSTANCE, "preview"))


_write = write_warned


def _patch_cm(
    kube: Kube, ns: str, data: Mapping[str, str], *, dry_run: bool = False, name: str = "cfg"
) -> tuple[dict[str, Any], list[str]]:
    body = {"data": dict(data)}
    return _write(
        kube,
        "PATCH",
        path("configmaps", ns, name),
        body,
        content_type=MERGE_PATCH,
        dry_run=dry_run,
    )


def _live(name: str) -> dict[str, Any]:
    """Deployment `name` mounting all of `cfg`, refreshed in place on a change."""
    spec = pod_spec(container())
    spec["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/etc/cfg"}]
    spec["volumes"] = [{"name": "cfg", "configMap": {"name": "cfg"}}]
    return deployment(name, spec, replicas=0, annotations={ANN_ON_CHANGE: "refresh"})


def _ordered_reader(names: Sequence[str], name: str) -> dict[str, Any]:
    """`reader(name)` at its place in `names` (its configpin.io/wave): the test orders them."""
    return reader(name, annotations={ANN_WAVE: str(list(names).index(name))})


def _waves(names: Sequence[str]) -> list[list[str]]:
    """The waves a change of healthy `_ordered_reader`s rolls in under `1,approve,100%`: the
    first of them, then, once approved, the rest."""
    return [list(names[:1]), list(names[1:])]


def _consumers(
    kube: Kube, ns: str, names: Sequence[str]
) -> tuple[dict[str, dict[str, str]], list[list[str]]]:
    """ConfigMap `cfg` (`a`, `b`), Deployments `names` reading its key `a` (Ready, healthy),
    `other` reading `b`, `live` (refreshed in place) mounting it whole: the template record of
    each, and the waves a change of `a` rolls `names` in."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "1", "b": "1"}))
        for name in names:
            kube.create(path("deployments", ns), _ordered_reader(names, name))
        kube.create(path("deployments", ns), reader("other", keys=("b",), replicas=0))
        kube.create(path("deployments", ns), _live("live"))
        before = {n: sources(stamped(kube, ns, n)) for n in [*names, "other", "live"]}
        wait_healthy(kube, ns, names)
    return before, _waves(names)


# --- preview --------------------------------------------------------------------------------


def test_a_write_says_what_each_consumer_will_do_before_and_as_it_is_made(
    kube: Kube,
    k8s: client.ApiClient,
    replicas: list[Configpin],
    namespaces: Callable[[], str],
) -> None:
    """A dry run (`kubectl apply --dry-run=server`) of a change of key `a` is answered with
    the preview, and changes nothing: 4 Deployments roll in 2 waves (1, 3), the 3 of the
    second waiting for an approval; 1 refreshes in place; 1 consumes other keys. Both
    replicas, the one leading and the other, answer the same review with the same lines.
    The write itself, made as a user, gets the same warnings and records that user, signed,
    on the ConfigMap."""
    ns = namespaces()
    names = [f"app-{i}" for i in range(4)]
    before, waves = _consumers(kube, ns, names)
    old = get(kube, ns, "cfg", "configmaps")

    new, warnings = _patch_cm(As(k8s, EDITOR), ns, {"a": VALUE}, dry_run=True)
    assert warnings[0] == (
        f"configpin: ConfigMap {ns}/cfg keys [a] -> 6 workloads: 4 roll in 2 waves (1, 3), "
        "3 wait for an approval, 1 refresh in place, 1 consume other keys"
    ), warnings
    assert warnings[1] == f"configpin: wave 1: Deployment {waves[0][0]}", warnings
    assert warnings[2].startswith("configpin: the list: kubectl configpin plan"), warnings
    assert len(warnings) == 3 and all(len(w) < 160 for w in warnings)
    assert not [w for w in warnings if VALUE in w]  # key names, never values
    # the dry run's result carries the record it would write; nothing is stored
    assert ANN_CHANGED_BY in new["metadata"]["annotations"]
    assert get(kube, ns, "cfg", "configmaps")["data"] == {"a": "1", "b": "1"}
    assert changed_by(kube, ns) is None
    quiet(kube, ns, before, 2 * RESYNC)

    # every replica answers, leader or not, from what it holds: the same review, asked of
    # each straight (the webhook called the first; either may lead)
    lead = leader(replicas)
    assert lead is not None, "not one replica leading"
    wanted = copy.deepcopy(old)
    wanted["data"]["a"] = VALUE
    answers = {cp.url: ask_replica(cp, source_review(old, wanted, user=EDITOR)) for cp in replicas}
    said_by = {("leader" if cp is lead else "not leading"): answers[cp.url] for cp in replicas}
    assert len(said_by) == 2, said_by
    for role, answer in said_by.items():
        assert answer["allowed"] is True, role
        assert answer.get("warnings") == warnings, (role, answer.get("warnings"))

    # the write itself: the same preview; who made it, signed, on the ConfigMap
    _, said = _patch_cm(As(k8s, EDITOR), ns, {"a": VALUE})
    assert said == warnings
    recorded = changed_by(kube, ns)
    assert recorded is not None and recorded["user"] == EDITOR, recorded
    assert abs(recorded["at"] - time.time()) < 60 and VALUE not in json.dumps(recorded)

    # a write of a key nobody reads while the rest of that change awaits its approval: the
    # canary has what it reads, and its rollout stands for the content this write makes (a
    # change of its own); the three waiting stay in wave 2, awaiting an approval of it, as
    # the gate holds them (none of them becomes that change's canary)
    canary = waves[0][0]
    wait_for(lambda: sources(get(kube, ns, canary)) != before[canary], what="canary re-stamped")
    _, said = _patch_cm(kube, ns, {"c": "1"})
    assert said[:2] == [
        f"configpin: ConfigMap {ns}/cfg keys [c] -> 6 workloads: 3 roll, "
        "3 wait for an approval, 1 refresh in place, 2 consume other keys",
        f"configpin: wave 2: {', '.join(f'Deployment {n}' for n in sorted(waves[1]))}",
    ], said
    quiet(kube, ns, {n: before[n] for n in waves[1]}, 2 * RESYNC)
    # of the annotations only: nothing to preview
    meta_only = {"metadata": {"labels": {"team": "web"}}}
    _, said = _write(
        kube, "PATCH", path("configmaps", ns, "cfg"), meta_only, content_type=MERGE_PATCH
    )
    assert said == []


def test_a_shared_source_previews_the_workload_the_gate_rolls_first_in_another_namespace(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    namespaces: Callable[[], str],
) -> None:
    """ConfigMap `cfg`, marked `configpin.io/shared` in two namespaces, is one change across
    them once both hold the same content. `theirs` holds it first: its Deployment `first`
    (configpin.io/wave -1, its own rollouts approved one by one) is the change's wave 1 and
    waits for its approval. A write of the same content in `ours` joins that change: the
    warnings kubectl gets name `first`, of the other namespace, as wave 1, and `ours`'s three
    Deployments in wave 2. So it goes: approved in `ours`, they wait for wave 1; approved in
    `theirs`, `first` is re-stamped while they are not; once it is complete, they roll."""
    ours, theirs = namespaces(), namespaces()
    names = [f"app-{i}" for i in range(3)]
    shared = {ANN_SHARED: "true"}
    with Kubelet(kube, ours, theirs) as kubelet:
        kubelet.allow(*names)
        for ns in (ours, theirs):
            kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}, annotations=shared))
        for name in names:
            kube.create(path("deployments", ours), reader(name))
        own = {ANN_WAVE: "-1", ANN_ROLLOUT_WAVES: "approve"}
        kube.create(path("deployments", theirs), reader("first", annotations=own))
        v1 = {n: sources(stamped(kube, ours, n)) for n in names}
        first_v1 = sources(stamped(kube, theirs, "first"))
        kubelet.allow(carrying(first_v1))  # (its pods of the new content: later)
        wait_healthy(kube, ours, names)
        wait_healthy(kube, theirs, ["first"])

        _patch_cm(kube, theirs, {"a": "2"})
        wait_event(kube, theirs, "first", "ConfigRolloutAwaitingApproval", "Normal")
        _, warnings = _patch_cm(As(k8s, EDITOR), ours, {"a": "2"})
        assert warnings[:2] == [
            f"configpin: ConfigMap {ours}/cfg keys [a] -> 4 workloads: 4 roll in 2 waves "
            "(1, 3), 4 wait for an approval",
            f"configpin: wave 1: Deployment {theirs}/first",
        ], warnings

        for name in names:  # the gate's own cut: theirs first, then ours
            wait_event(kube, ours, name, "ConfigRolloutWaiting", "Normal")
            said = notes(kube, ours, name, "ConfigRolloutWaiting")
            assert any("wave 2 of 2 starts when wave 1 is complete" in n for n in said), said
        approve = ["approve", "configmap/cfg"]
        done = kubectl_configpin([*approve, "-n", ours], control_plane.kubeconfig)
        assert done.returncode == 0, done.stderr + done.stdout
        quiet(kube, ours, v1, SETTLE)  # approved here, they wait for wave 1 still
        done = kubectl_configpin([*approve, "-n", theirs], control_plane.kubeconfig)
        assert done.returncode == 0, done.stderr + done.stdout
        wait_for(
            lambda: sources(get(kube, theirs, "first")) != first_v1,
            timeout=30,
            what="first re-stamped",
        )
        quiet(kube, ours, v1, SETTLE)  # wave 2 waits for first to complete
        kubelet.allow("first")
        wait_for(
            lambda: all(sources(get(kube, ours, n)) != v1[n] for n in names),
            timeout=60,
            what="wave 2 re-stamped once first completed",
        )
        assert record(get(kube, theirs, "first"))["state"] == "complete"


def test_a_change_of_rejected_content_is_previewed_as_held(
    kube: Kube, namespaces: Callable[[], str]
) -> None:
    """Content whose rollout failed on a workload (its pods never Ready) is held there: a
    later write bringing that content back says so."""
    ns = namespaces()
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    app = reader("web")
    app["spec"]["progressDeadlineSeconds"] = 5
    with Kubelet(kube, ns) as kubelet:
        kube.create(path("deployments", ns), app)
        v1 = sources(stamped(kube, ns, "web"))
        kubelet.allow(carrying(v1))  # the pods of a=2 never start
        wait_healthy(kube, ns, ["web"])
        _patch_cm(kube, ns, {"a": "2"})
        wait_for(
            lambda: record(get(kube, ns, "web")).get("state") == "failed",
            timeout=60,
            what="web's rollout of a=2 failed",
        )
    assert "configmap/cfg" in annotation(get(kube, ns, "web"), ANN_REJECTED)
    _patch_cm(kube, ns, {"a": "1"})
    _, said = _patch_cm(kube, ns, {"a": "2"}, dry_run=True)
    assert said[0] == (
        f"configpin: ConfigMap {ns}/cfg keys [a] -> 1 workloads: 1 hold (content rejected before)"
    ), said


def test_deleting_a_consumed_source_says_who_breaks(
    kube: Kube, namespaces: Callable[[], str]
) -> None:
    """A deletion (dry run, then real) says who consumes the source and what breaks: a
    Deployment that requires it cannot start its next pod; one that reads it as optional
    rolls without it."""
    ns = namespaces()
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), reader("need", replicas=0))
    kube.create(path("deployments", ns), reader("maybe", replicas=0, optional=True))
    stamped(kube, ns, "need")
    stamped(kube, ns, "maybe")
    expected = [
        f"configpin: deleting ConfigMap {ns}/cfg: 2 workloads consume it",
        "configpin: 1 require it, their next pod start fails: Deployment need",
        "configpin: 1 read it as optional and roll without it",
    ]
    _, said = _write(kube, "DELETE", path("configmaps", ns, "cfg"), dry_run=True)
    assert said == expected
    assert get(kube, ns, "cfg", "configmaps")["data"] == {"a": "1"}
    _, said = _write(kube, "DELETE", path("configmaps", ns, "cfg"))
    assert said == expected


def test_plan_prints_every_workload_from_a_dry_run(
    kube: Kube,
    control_plane: ControlPlane,
    namespaces: Callable[[], str],
    tmp_path: Path,
) -> None:
    """`kubectl configpin plan -f FILE`, as a user with only namespace rights: one row per
    consumer (workload, keys, action, wave), from a server-side dry run that changes
    nothing; `-o json` for programs."""
    ns = namespaces()
    names = [f"app-{i}" for i in range(3)]
    before, waves = _consumers(kube, ns, names)
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    manifest = tmp_path / "cfg.yaml"
    manifest.write_text(yaml.safe_dump(configmap("cfg", {"a": "2", "b": "1"})))

    done = kubectl_configpin(["plan", "-f", str(manifest), "-n", ns, "-o", "json"], editor)
    assert done.returncode == 0, done.stderr
    [plan] = json.loads(done.stdout)
    assert plan["keys"] == ["a"]
    rows = {r["name"]: (r["action"], r["keys"], r["wave"]) for r in plan["rows"]}
    assert rows == {
        waves[0][0]: ("roll", ["a"], 1),
        **{n: ("await-approval", ["a"], 2) for n in waves[1]},
        "live": ("refresh", ["a"], None),
        "other": ("nothing", [], None),
    }
    table = kubectl_configpin(["plan", "-f", str(manifest), "-n", ns], editor)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"ConfigMap {ns}/cfg: keys a"
    assert lines[1].split() == ["NAMESPACE", "WORKLOAD", "KEYS", "ACTION", "WAVE"]
    assert lines[2].split() == [ns, f"Deployment/{waves[0][0]}", "a", "roll", "1"]
    assert len(lines) == 2 + 5
    # nothing changed: the content, the annotations, the workloads
    cfg = get(kube, ns, "cfg", "configmaps")
    assert cfg["data"] == {"a": "1", "b": "1"} and changed_by(kube, ns) is None
    assert not (cfg["metadata"].get("annotations") or {})
    quiet(kube, ns, before, 2 * RESYNC)


# --- audit and approval ---------------------------------------------------------------------


def test_the_editor_is_named_and_the_waves_after_approve_wait_for_an_approval(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    namespaces: Callable[[], str],
    tmp_path: Path,
) -> None:
    """A change made by a user rolls its first wave; the rollout record, its Event and
    `configpin status` name that user. The waves after `approve` wait, said by a Normal Event
    and status, until a user allowed to read and update the ConfigMap (not even to patch it)
    approves it;
    then they roll. A newer change needs its own approval."""
    ns = namespaces()
    names = [f"app-{i}" for i in range(3)]
    editor = namespace_editor(
        control_plane, kube, ns, tmp_path, verbs=("get", "update")
    )  # no patch
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
        for name in names:
            kube.create(path("deployments", ns), _ordered_reader(names, name))
        v1 = {n: sources(stamped(kube, ns, n)) for n in names}
        wait_healthy(kube, ns, names)
        [[canary], later] = _waves(names)

        _patch_cm(As(k8s, EDITOR), ns, {"a": "2"})
        wait_for(
            lambda: record(get(kube, ns, canary)).get("state") == "complete",
            timeout=60,
            what=f"the canary {canary} complete",
        )
        by = record(get(kube, ns, canary))["by"]
        assert by.startswith(f"{EDITOR} at "), by
        assert any(f"changed by {EDITOR}" in n for n in notes(kube, ns, canary, "RolloutStarted"))
        assert status(control_plane, ns)[canary]["rollout"]["by"] == by

        for name in later:
            wait_event(kube, ns, name, "ConfigRolloutAwaitingApproval", "Normal")
        [note] = notes(kube, ns, later[0], "ConfigRolloutAwaitingApproval")
        assert f"kubectl configpin approve configmap/cfg -n {ns}" in note, note
        rows = status(control_plane, ns)
        assert all(rows[n]["state"] == "awaiting-approval" for n in later), rows
        assert all(sources(get(kube, ns, n)) == v1[n] for n in later)

        done = kubectl_configpin(["approve", "configmap/cfg", "-n", ns], editor)
        assert done.returncode == 0, done.stderr + done.stdout
        assert f"system:serviceaccount:{ns}:editor" in done.stdout, done.stdout
        wait_for(
            lambda: all(sources(get(kube, ns, n)) != v1[n] for n in later),
            timeout=30,
            what="the waves after approve rolled",
        )
        v2 = {n: sources(get(kube, ns, n)) for n in names}
        for name in later:
            assert record(get(kube, ns, name))["by"] == by

        # a newer change: its canary rolls, the rest wait for its own approval
        _patch_cm(As(k8s, EDITOR), ns, {"a": "3"})
        wait_for(
            lambda: sources(get(kube, ns, canary)) != v2[canary],
            timeout=30,
            what="the canary re-stamped for a=3",
        )
        wait_for(
            lambda: len(notes(kube, ns, later[0], "ConfigRolloutAwaitingApproval")) == 2,
            timeout=60,
            what="a second approval awaited",
        )
        assert all(sources(get(kube, ns, n)) == v2[n] for n in later)


def test_a_record_written_around_configpin_is_not_believed(
    kube: Kube, k8s: client.ApiClient, namespaces: Callable[[], str]
) -> None:
    """A client's own `configpin.io/changed-by` is replaced by the truth on a content change,
    and put back as it was on any other write; a source written while configpin's webhook was
    not in the path (down, or its registration changed), with a forged record naming someone
    else, rolls as "changed by unknown"."""
    ns = namespaces()
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), reader("web", replicas=0))
    v1 = sources(stamped(kube, ns, "web"))
    forged = ChangedBy("mallory", time.time(), "0" * 20).encode(b"not the key", ns, CFG)

    body = {"metadata": {"annotations": {ANN_CHANGED_BY: forged}}, "data": {"a": "2"}}
    _write(As(k8s, EDITOR), "PATCH", path("configmaps", ns, "cfg"), body, content_type=MERGE_PATCH)
    real = changed_by(kube, ns)
    assert real is not None and real["user"] == EDITOR
    wait_for(lambda: sources(get(kube, ns, "web")) != v1, what="web re-stamped for a=2")
    assert record(get(kube, ns, "web"))["by"].startswith(EDITOR)
    v2 = sources(get(kube, ns, "web"))

    annotated = {"metadata": {"annotations": {ANN_CHANGED_BY: forged}}}
    _write(kube, "PATCH", path("configmaps", ns, "cfg"), annotated, content_type=MERGE_PATCH)
    assert changed_by(kube, ns) == real

    # configpin out of the path: the forged record is stored, and not believed
    with _sources_hook_bypassed(k8s, kube, ns):
        body = {"metadata": {"annotations": {ANN_CHANGED_BY: forged}}, "data": {"a": "3"}}
        _write(kube, "PATCH", path("configmaps", ns, "cfg"), body, content_type=MERGE_PATCH)
    assert (changed_by(kube, ns) or {}).get("user") == "mallory"
    wait_for(lambda: sources(get(kube, ns, "web")) != v2, what="web re-stamped for a=3")
    assert record(get(kube, ns, "web"))["by"] == "unknown"


@contextlib.contextmanager
def _sources_hook_bypassed(k8s: client.ApiClient, kube: Kube, ns: str) -> Iterator[None]:
    """configpin's source-writes webhook skips namespace `ns` (a label it must not have), as
    if it were down for that namespace's writes, until the block ends."""
    skip = {"key": "test.configpin.io/preview-bypass", "operator": "DoesNotExist"}
    kube.patch(
        path("namespaces", None, ns),
        {"metadata": {"labels": {"test.configpin.io/preview-bypass": "yes"}}},
        content_type=MERGE_PATCH,
    )
    hooks = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    config = kube.get(f"{hooks}/configpin-preview")
    at = [h["name"] for h in config["webhooks"]].index("sources.configpin.io")
    expressions = f"/webhooks/{at}/namespaceSelector/matchExpressions"
    kube.patch(
        f"{hooks}/configpin-preview",
        [{"op": "add", "path": f"{expressions}/-", "value": skip}],
        content_type=JSON_PATCH,
    )
    try:
        probe = {"metadata": {"name": "probe"}, "data": {"x": "0"}}
        kube.create(path("configmaps", ns), probe)

        def bypassed() -> bool:
            _patch_cm(kube, ns, {"x": str(time.monotonic())}, name="probe")
            return changed_by(kube, ns, "probe") is None

        wait_for(bypassed, what="configpin's source webhook out of the path")
        yield
    finally:
        config = kube.get(f"{hooks}/configpin-preview")
        selector = config["webhooks"][at]["namespaceSelector"]
        selector["matchExpressions"] = [e for e in selector["matchExpressions"] if e != skip]
        kube.replace(f"{hooks}/configpin-preview", config)


# --- what configpin is kept off -------------------------------------------------------------


def test_writes_configpin_has_nothing_to_say_about_never_reach_it(
    kube: Kube,
    k8s: client.ApiClient,
    replicas: list[Configpin],
    namespaces: Callable[[], str],
) -> None:
    """Helm's release Secrets, service-account tokens, leader-election ConfigMaps and ignored
    sources: their writes are kept off configpin by the chart's matchConditions where the API
    server has them; where it has not (1.20), configpin itself leaves them alone. Either way
    nothing is written on them and nothing is said."""
    ns = namespaces()
    served = bool(chart_webhooks(k8s)[1].get("matchConditions"))
    release = {
        "metadata": {"name": "sh.helm.release.v1.web.v1", "labels": {"owner": "helm"}},
        "type": "helm.sh/release.v1",
        "data": {"release": base64.b64encode(b"H4sI").decode()},
    }
    kube.create(path("secrets", ns), release)
    kube.create(
        path("configmaps", ns),
        configmap(
            "lock", {"a": "1"}, annotations={"control-plane.alpha.kubernetes.io/leader": "{}"}
        ),
    )
    kube.create(
        path("configmaps", ns),
        configmap("quiet", {"a": "1"}, annotations={"configpin.io/ignore": "true"}),
    )
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), reader("web", replicas=0))
    stamped(kube, ns, "web")
    called = replicas[0]  # the replica the webhook calls

    def reached(kind: str) -> float:
        return called.metric("configpin_admissions_total", kind=kind, operation="UPDATE")

    secrets, configmaps = reached("Secret"), reached("ConfigMap")
    writes = [
        ("secrets", "sh.helm.release.v1.web.v1", {"data": {"release": "SDRzSQ=="}}),
        ("configmaps", "lock", {"data": {"a": "2"}}),
        ("configmaps", "quiet", {"data": {"a": "2"}}),
    ]
    for resource, name, body in writes:
        result, said = _write(
            kube, "PATCH", path(resource, ns, name), body, content_type=MERGE_PATCH
        )
        assert said == [], (name, said)
        assert ANN_CHANGED_BY not in (result["metadata"].get("annotations") or {}), name
    # one write configpin does hear, so that the counts below are read after all of them
    _, said = _patch_cm(kube, ns, {"a": "2"})
    assert said and said[0].startswith(f"configpin: ConfigMap {ns}/cfg keys [a]")
    assert reached("ConfigMap") == configmaps + (1 if served else 3)
    assert reached("Secret") == secrets + (0 if served else 1)
    if not served:
        skipped = called.metric("configpin_admissions_total", result="skipped")
        assert skipped >= 3
