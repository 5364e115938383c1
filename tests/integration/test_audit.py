"""Audit and approval against the API server (shared/SPEC.md "Change preview and audit"), with
the webhook registered as the chart registers it (both entries: workloads, and updates and
deletions of ConfigMaps and Secrets), two replicas running as the chart runs them:

- a workload whose own wave list holds `approve` waits for the change's approval, though the
  cluster's waves ask for none, while the others of the change roll;
- an approval is believed only for the source and the content it was given for: one copied
  from another namespace approves nothing; one given after a person rolled the canary back
  starts no wave; a newer content needs its own, and the record names the approver, never a
  value;
- the record of who changed a source outlives a re-apply that drops it (`kubectl replace`, a
  GitOps tool's update), and a re-apply that changes the content records its user;
- the preview follows the source's consumers as they come, change and go;
- a write of a key no workload reads rolls nothing that awaited an approval or was stopped
  by a failure: what the canary did for the change before stands for the new content;
- who changed a source is named by the rollout record, the rollout Events and `configpin
  status`, a failed rollout's Event included: the last writer of a key the workload reads,
  not of the source, also when the source moved on in other keys before configpin read who
  made it; `unknown` where configpin could not read it (refused), and the rollout goes on;
- a re-stamp whose write is admitted with newer content than the leader decided (the source
  moved on meanwhile) is configpin's own rollout of that content, made by its last writer,
  never a person's rollback.

No kubelet: pods stay Pending unless the fake `Kubelet` reports them Ready.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client

from harness.apps import rollout_undo, write_warned
from harness.configpin import Configpin, ensure_namespace, instance_namespace, running_configpin
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet, carrying
from harness.manifests import configmap
from tests.integration.holdproxy import HoldProxy, hold_proxy
from tests.integration.instances import leader, replicas_fixture
from tests.integration.workloads import (
    As,
    approve,
    ask_replica,
    changed_by,
    get,
    kubectl_configpin,
    namespace_editor,
    notes,
    quiet,
    reader,
    record,
    revision,
    set_cm,
    source_review,
    sources,
    stamped,
    state,
    status,
    wait_event,
    wait_healthy,
)
from webhook.core.constants import (
    ANN_APPROVED,
    ANN_CHANGED_BY,
    ANN_MODE,
    ANN_ROLLOUT_WAVES,
    ANN_WAVE,
    MODE_SNAPSHOT,
)
from webhook.kube.raw import MERGE_PATCH, Kube, path

RESYNC = 2.0
_COMMON = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
]  # fmt: skip
APPROVING = "audit"  # the cluster's waves hold `approve`
PLAIN = "audit-plain"  # they do not
APPROVING_ARGS = [*_COMMON, "--rollout-waves", "1,approve,100%"]
PLAIN_ARGS = [*_COMMON, "--rollout-waves", "1,100%"]
ALICE = "alice@example.com"
BOB = "bob@example.com"
CAROL = "carol@example.com"
VALUE = "s3cr3t-value"  # a value that must never be shown
CANARY = {ANN_WAVE: "-1"}  # first, alone in the first wave

replicas = replicas_fixture(APPROVING, "audit", APPROVING_ARGS)


@dataclasses.dataclass(frozen=True)
class Plain:
    """Two replicas of PLAIN: `leader` talks to the API server through `proxy` (which refuses
    or holds back what a test says); the webhook calls `follower`, straight."""

    proxy: HoldProxy
    leader: Configpin
    follower: Configpin


@pytest.fixture(scope="module")
def plain(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plain]:
    work = tmp_path_factory.mktemp("configpin-audit-plain")
    with control_plane.api_client() as api:
        ensure_namespace(api)
    proxied = dataclasses.replace(control_plane, kubeconfig=work / "proxy" / "kubeconfig")
    with (
        hold_proxy(control_plane, work / "proxy") as proxy,
        running_configpin(proxied, work / "b", args=PLAIN_ARGS, instance=PLAIN) as b,
    ):
        wait_for(lambda: b.metric("configpin_leader") == 1, what="the proxied replica leading")
        with running_configpin(
            control_plane,
            work / "a",
            args=PLAIN_ARGS,
            instance=PLAIN,
            webhook_name="configpin-audit-plain",
        ) as a:
            yield Plain(proxy, b, a)


def _factory(k8s: client.ApiClient, instance: str) -> Iterator[Callable[[], str]]:
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(instance_namespace(k8s, instance, "audit"))


@pytest.fixture
def namespaces(k8s: client.ApiClient, replicas: list[Configpin]) -> Iterator[Callable[[], str]]:
    """Fresh namespaces of the configpin whose waves hold `approve`."""
    yield from _factory(k8s, APPROVING)


@pytest.fixture
def plain_namespaces(k8s: client.ApiClient, plain: Plain) -> Iterator[Callable[[], str]]:
    """Fresh namespaces of the configpin whose waves hold no `approve`."""
    yield from _factory(k8s, PLAIN)


# --- helpers --------------------------------------------------------------------------------


def _workloads(
    kube: Kube, ns: str, names: dict[str, dict[str, str]], data: dict[str, str] | None = None
) -> dict[str, dict[str, str]]:
    """ConfigMap `cfg` (`data`, by default `a: "1"`) and Deployments `names` reading its key
    `a` (each with the annotations given), Ready and healthy; the template record each was
    stamped with."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        kube.create(path("configmaps", ns), configmap("cfg", data or {"a": "1"}))
        for name, notes_ in names.items():
            kube.create(path("deployments", ns), reader(name, annotations=notes_))
        before = {n: sources(stamped(kube, ns, n)) for n in names}
        wait_healthy(kube, ns, list(names))
    return before


def _seen_as_canary(kube: Kube, ns: str, replicas: list[Configpin], name: str = "canary") -> None:
    """The premise of a canary: the leader has seen it healthy. Its index, fed by its own
    watch, may lag the API server's view (`wait_healthy`) on a loaded machine, and a workload
    it has not seen healthy cannot vouch for a change: it joins the last wave, and the rest
    roll first. Seen once the leader's preview of a change of `cfg` names it in wave 1."""
    old = get(kube, ns, "cfg", "configmaps")
    new = copy.deepcopy(old)
    new["data"]["a"] = "preview"
    wanted = f"configpin: wave 1: Deployment {name}"

    def seen() -> bool:
        lead = leader(replicas)
        said = ask_replica(lead, source_review(old, new, user=ALICE)) if lead else {}
        return wanted in (said.get("warnings") or ())

    wait_for(seen, timeout=60, what=f"the leader seeing {ns}/{name} healthy (in wave 1)")


def _wait_state(kube: Kube, ns: str, name: str, wanted: str, timeout: float = 60) -> None:
    wait_for(
        lambda: state(get(kube, ns, name)) == wanted,
        timeout=timeout,
        what=f"{ns}/{name}'s rollout {wanted}",
    )


def _read_from(kube: Kube, ns: str, name: str, source: str) -> None:
    """Deployment `name`'s first variable read from ConfigMap `source` (its template changed)."""
    kube.patch(
        path("deployments", ns, name),
        [
            {
                "op": "replace",
                "path": "/spec/template/spec/containers/0/env/0/valueFrom/configMapKeyRef/name",
                "value": source,
            }
        ],
        content_type="application/json-patch+json",
    )


def _approved_text(kube: Kube, ns: str) -> str | None:
    """The approval record on ConfigMap `cfg`, as stored."""
    found = (get(kube, ns, "cfg", "configmaps")["metadata"].get("annotations") or {}).get(
        ANN_APPROVED
    )
    return str(found) if found is not None else None


# --- approval -------------------------------------------------------------------------------


def test_a_workload_that_asks_for_approval_waits_for_it_though_the_cluster_does_not(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    plain_namespaces: Callable[[], str],
    tmp_path: Path,
) -> None:
    """The cluster's waves (1,100%) hold no `approve`; `gated`'s own wave list does: a change
    rolls the canary and `api`, and `gated` waits, said by an Event and status, until the
    change is approved. Then it rolls, and its record names who changed the source."""
    ns = plain_namespaces()
    own = {ANN_ROLLOUT_WAVES: "1,approve,100%"}
    before = _workloads(kube, ns, {"web": CANARY, "api": {}, "gated": own})
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("web", "api", "gated")
        set_cm(As(k8s, ALICE), ns, "2")
        for name in ("web", "api"):
            _wait_state(kube, ns, name, "complete")
        wait_event(kube, ns, "gated", "ConfigRolloutAwaitingApproval", "Normal")
        [note] = notes(kube, ns, "gated", "ConfigRolloutAwaitingApproval")
        assert ANN_ROLLOUT_WAVES in note, note
        assert f"kubectl configpin approve configmap/cfg -n {ns}" in note, note
        assert status(control_plane, ns)["gated"]["state"] == "awaiting-approval"
        quiet(kube, ns, {"gated": before["gated"]}, 2 * RESYNC)

        approve(editor, ns)
        _wait_state(kube, ns, "gated", "complete")
        assert sources(get(kube, ns, "gated")) == sources(get(kube, ns, "api"))
        assert record(get(kube, ns, "gated"))["by"].startswith(f"{ALICE} at ")


def test_an_approval_copied_from_another_namespace_is_not_believed(
    kube: Kube, k8s: client.ApiClient, control_plane: ControlPlane, namespaces: Callable[[], str]
) -> None:
    """Namespace `a`'s approval of the very content `b`'s source now holds, copied onto `b`'s
    source of the same name: `b`'s waves after `approve` stay waiting. `b`'s own approval
    rolls them."""
    a, b = namespaces(), namespaces()
    before = _workloads(kube, b, {"canary": CANARY, "later": {}})
    with Kubelet(kube, b) as kubelet:
        kubelet.allow("canary", "later")
        set_cm(As(k8s, ALICE), b, "2")
        _wait_state(kube, b, "canary", "complete")
        wait_event(kube, b, "later", "ConfigRolloutAwaitingApproval", "Normal")

        kube.create(path("configmaps", a), configmap("cfg", {"a": "2"}))
        approve(control_plane.kubeconfig, a)
        copied = _approved_text(kube, a)
        assert copied is not None
        kube.patch(
            path("configmaps", b, "cfg"),
            {"metadata": {"annotations": {ANN_APPROVED: copied}}},
            content_type=MERGE_PATCH,
        )
        assert _approved_text(kube, b) == copied  # stored as written: configpin changes no data
        assert get(kube, b, "cfg", "configmaps")["data"] == {"a": "2"}
        quiet(kube, b, {"later": before["later"]}, 3 * RESYNC)
        assert status(control_plane, b)["later"]["state"] == "awaiting-approval"

        approve(control_plane.kubeconfig, b)
        _wait_state(kube, b, "later", "complete")


def test_an_approval_after_a_persons_rollback_starts_no_wave(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    namespaces: Callable[[], str],
    replicas: list[Configpin],
) -> None:
    """The canary of a change is rolled back by a person (`kubectl rollout undo`) while
    configpin rolls it: the change has failed, its later waves are stopped, and approving the
    change afterwards starts none of them."""
    ns = namespaces()
    before = _workloads(kube, ns, {"canary": CANARY, "later-0": {}, "later-1": {}})
    later = {n: s for n, s in before.items() if n != "canary"}
    _seen_as_canary(kube, ns, replicas)
    first = revision(get(kube, ns, "canary"))
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(carrying(before["canary"]))  # the change's pods stay Pending
        set_cm(As(k8s, ALICE), ns, "2")
        _wait_state(kube, ns, "canary", "rolling")
        wait_for(  # (a revision to undo: the Deployment controller may lag configpin's write)
            lambda: revision(get(kube, ns, "canary")) > first, what="the canary's new revision"
        )
        rollout_undo(k8s, ns, "canary")
        _wait_state(kube, ns, "canary", "failed")
        assert record(get(kube, ns, "canary"))["action"] == "rolled-back-by-person"
        for name in later:  # stopped, said before the approval
            wait_for(
                lambda name=name: any(
                    "the waves after it are not rolled" in n
                    for n in notes(kube, ns, name, "ConfigRolloutWaiting")
                ),
                what=f"{name} stopped by the canary's failure",
            )

        said = approve(control_plane.kubeconfig, ns)
        assert "approved configmap/cfg" in said, said
        assert _approved_text(kube, ns) is not None
        quiet(kube, ns, later, 3 * RESYNC)
        rows = status(control_plane, ns)
        for name in later:
            assert rows[name]["state"] == "waiting", rows[name]
            assert "failed" in rows[name]["reason"], rows[name]
            assert not notes(kube, ns, name, "ConfigRolloutAwaitingApproval")


def test_an_approval_names_its_approver_and_approves_only_the_content_it_saw(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    namespaces: Callable[[], str],
    tmp_path: Path,
) -> None:
    """`configpin approve`, given while the canary still rolls, records on the source who
    approved and the digest of the content it holds then, never a value. The content changes
    again before the later waves are reached: the approval stays on the source, and the new
    content waits for its own."""
    ns = namespaces()
    before = _workloads(kube, ns, {"canary": CANARY, "later-0": {}, "later-1": {}})
    later = {n: s for n, s in before.items() if n != "canary"}
    editor = namespace_editor(control_plane, kube, ns, tmp_path, verbs=("get", "update"))
    approver = f"system:serviceaccount:{ns}:editor"
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(carrying(before["canary"]))  # the canary rolls on, not complete
        set_cm(As(k8s, ALICE), ns, VALUE)
        _wait_state(kube, ns, "canary", "rolling")
        said = approve(editor, ns)
        assert approver in said and VALUE not in said, said
        text = _approved_text(kube, ns)
        assert text is not None and VALUE not in text, text
        first = json.loads(text)
        assert first["user"] == approver, first
        assert re.fullmatch(r"[0-9a-f]{20}", first["content"]), first
        assert abs(first["at"] - time.time()) < 60, first

        rolling = sources(get(kube, ns, "canary"))
        set_cm(As(k8s, ALICE), ns, "3")
        wait_for(
            lambda: sources(get(kube, ns, "canary")) not in (rolling, before["canary"]),
            what="the canary re-stamped for a=3",
        )
        kubelet.allow("canary", "later-0", "later-1")
        _wait_state(kube, ns, "canary", "complete")
        for name in later:
            wait_event(kube, ns, name, "ConfigRolloutAwaitingApproval", "Normal")
        assert _approved_text(kube, ns) == text  # still there, for the content it saw
        quiet(kube, ns, later, 3 * RESYNC)
        rows = status(control_plane, ns)
        assert all(rows[n]["state"] == "awaiting-approval" for n in later), rows

        approve(editor, ns)
        second = json.loads(_approved_text(kube, ns) or "{}")
        assert second["user"] == approver and second["content"] != first["content"], second
        for name in later:
            _wait_state(kube, ns, name, "complete")
        assert all(sources(get(kube, ns, n)) == sources(get(kube, ns, "canary")) for n in later)


def test_a_write_of_a_key_nobody_reads_starts_no_wave_that_awaits_an_approval(
    kube: Kube, k8s: client.ApiClient, control_plane: ControlPlane, namespaces: Callable[[], str]
) -> None:
    """alice changes key `a`, which every workload reads; the canary rolls it and completes,
    the others await the change's approval. bob then changes key `b`, which no workload reads:
    nothing rolls (his write made a new change, whose canary is the one that rolled alice's
    content, complete), the others still await an approval, now of the content bob's write
    left, said by status. Approved, both roll alice's content, credited to her."""
    ns = namespaces()
    before = _workloads(
        kube, ns, {"canary": CANARY, "later-0": {}, "later-1": {}}, {"a": "1", "b": "1"}
    )
    later = {n: s for n, s in before.items() if n != "canary"}
    cfg = path("configmaps", ns, "cfg")
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("canary", "later-0", "later-1")
        set_cm(As(k8s, ALICE), ns, "2")
        _wait_state(kube, ns, "canary", "complete")
        for name in later:
            wait_event(kube, ns, name, "ConfigRolloutAwaitingApproval", "Normal")

        As(k8s, BOB).patch(cfg, {"data": {"b": "2"}}, content_type=MERGE_PATCH)
        assert (changed_by(kube, ns) or {}).get("user") == BOB
        quiet(kube, ns, later, 3 * RESYNC)
        rows = status(control_plane, ns)
        assert all(rows[n]["state"] == "awaiting-approval" for n in later), rows
        assert state(get(kube, ns, "canary")) == "complete"

        approve(control_plane.kubeconfig, ns)
        for name in later:
            _wait_state(kube, ns, name, "complete")
            assert sources(get(kube, ns, name)) == sources(get(kube, ns, "canary"))
            assert record(get(kube, ns, name))["by"].startswith(f"{ALICE} at ")


def test_content_that_failed_on_the_canary_reaches_no_one_after_a_write_of_another_key(
    kube: Kube, k8s: client.ApiClient, control_plane: ControlPlane, namespaces: Callable[[], str]
) -> None:
    """alice's change of key `a` fails on the canary (its new pods never become Ready within
    its progress deadline: held, the content rejected there), which stops the later waves.
    bob then changes key `b`, which no workload reads: the failure stands for his change too,
    and neither later workload rolls the content that failed."""
    ns = namespaces()
    data = {"a": "1", "b": "1"}
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("canary", "later-0", "later-1")
        kube.create(path("configmaps", ns), configmap("cfg", data))
        kube.create(path("deployments", ns), reader("canary", annotations=CANARY, deadline=5))
        for name in ("later-0", "later-1"):
            kube.create(path("deployments", ns), reader(name))
        before = {n: sources(stamped(kube, ns, n)) for n in ("canary", "later-0", "later-1")}
        wait_healthy(kube, ns, list(before))
        later = {n: s for n, s in before.items() if n != "canary"}
        kubelet.clear()
        kubelet.allow(carrying(before["canary"]), "later-0", "later-1")  # alice's: Pending
        set_cm(As(k8s, ALICE), ns, "2")
        _wait_state(kube, ns, "canary", "failed", timeout=90)
        for name in later:
            wait_for(
                lambda name=name: any(
                    "the waves after it are not rolled" in n
                    for n in notes(kube, ns, name, "ConfigRolloutWaiting")
                ),
                what=f"{name} stopped by the canary's failure",
            )

        cfg = path("configmaps", ns, "cfg")
        As(k8s, BOB).patch(cfg, {"data": {"b": "2"}}, content_type=MERGE_PATCH)
        assert (changed_by(kube, ns) or {}).get("user") == BOB
        quiet(kube, ns, later, 3 * RESYNC)
        rows = status(control_plane, ns)
        for name in later:
            assert rows[name]["state"] == "waiting", rows[name]
            assert "failed" in rows[name]["reason"], rows[name]
        assert state(get(kube, ns, "canary")) == "failed"


# --- who changed it -------------------------------------------------------------------------


def _replace_as(kube: Kube, user: str, ns: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """`kubectl replace -f` (a GitOps tool's update; `kubectl create configmap --dry-run=client
    -o yaml | kubectl replace -f -`) of `manifest`, as `user`: the annotations stored are
    those of the manifest, and of admission. Returns them."""
    current = get(kube, ns, "cfg", "configmaps")
    body = json.loads(json.dumps(manifest))
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    As(kube.api, user).replace(path("configmaps", ns, "cfg"), body)
    found: dict[str, Any] = get(kube, ns, "cfg", "configmaps")["metadata"].get("annotations") or {}
    return found


def test_a_reapply_that_drops_the_record_of_who_changed_it_keeps_it(
    kube: Kube, plain_namespaces: Callable[[], str]
) -> None:
    """A source's manifest never holds configpin's record. Re-applied with its content
    unchanged by a whole-object update (`kubectl replace`, a GitOps tool's update), the
    request drops the record and admission puts it back as it was; re-applied with new
    content, the record names the user of that write. (`kubectl apply`, client-side or
    server-side, leaves the record alone: no manager owns what admission added, measured on
    1.20.2 and 1.36.2.)"""
    ns = plain_namespaces()
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    manifest = configmap("cfg", {"a": "2"}, annotations={"team": "web"})

    stored = _replace_as(kube, ALICE, ns, manifest)
    kept = stored[ANN_CHANGED_BY]
    assert (changed_by(kube, ns) or {}).get("user") == ALICE
    stored = _replace_as(kube, BOB, ns, manifest)  # the same manifest again
    assert stored == {ANN_CHANGED_BY: kept, "team": "web"}, stored

    stored = _replace_as(kube, CAROL, ns, configmap("cfg", {"a": "3"}))
    assert (changed_by(kube, ns) or {}).get("user") == CAROL and "team" not in stored


def test_an_editor_configpin_cannot_read_is_unknown_and_the_rollout_goes_on(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    plain: Plain,
    plain_namespaces: Callable[[], str],
) -> None:
    """The leader's read of who changed the source is refused (403): the rollout goes on,
    and its record, its Event and `configpin status` say the change was made by `unknown`."""
    ns = plain_namespaces()
    assert plain.leader.metric("configpin_leader") == 1
    before = _workloads(kube, ns, {"web": {}})
    source = path("configmaps", ns, "cfg")
    refused_before = len(plain.proxy.refused)
    plain.proxy.refuse = lambda method, target: method == "GET" and urlsplit(target).path == source
    try:
        with Kubelet(kube, ns) as kubelet:
            kubelet.allow("web")
            set_cm(As(k8s, ALICE), ns, "2")
            wait_for(lambda: sources(get(kube, ns, "web")) != before["web"], what="web re-stamped")
            _wait_state(kube, ns, "web", "complete")
    finally:
        plain.proxy.refuse = None
    assert len(plain.proxy.refused) > refused_before  # the read was made, and refused
    assert (changed_by(kube, ns) or {}).get("user") == ALICE  # the record is there
    assert record(get(kube, ns, "web"))["by"] == "unknown"
    [note] = notes(kube, ns, "web", "RolloutStarted")
    assert "(changed by unknown)" in note, note
    assert status(control_plane, ns)["web"]["rollout"]["by"] == "unknown"


def test_an_editor_read_after_a_write_of_a_key_it_does_not_read_names_who_made_what_it_reads(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    plain: Plain,
    plain_namespaces: Callable[[], str],
) -> None:
    """alice changes key `a`, which `web` reads; the leader's read of who did reaches the API
    server only after bob changed key `b`, which `web` does not read. The record the source
    carries then is bob's, and carries alice's change of `a` on: `web`'s rollout, its Event
    and `configpin status` name alice, never bob, and it completes."""
    ns = plain_namespaces()
    assert plain.leader.metric("configpin_leader") == 1
    before = _workloads(kube, ns, {"web": {}}, {"a": "1", "b": "1"})
    source = path("configmaps", ns, "cfg")
    plain.proxy.stall(lambda method, target: method == "GET" and urlsplit(target).path == source)
    try:
        with Kubelet(kube, ns) as kubelet:
            kubelet.allow("web")
            set_cm(As(k8s, ALICE), ns, "2")
            wait_for(lambda: plain.proxy.stalled, what="the leader reading who changed cfg")
            As(k8s, BOB).patch(source, {"data": {"b": "2"}}, content_type=MERGE_PATCH)
            assert (changed_by(kube, ns) or {}).get("user") == BOB
            plain.proxy.let_go()
            wait_for(lambda: sources(get(kube, ns, "web")) != before["web"], what="web re-stamped")
            _wait_state(kube, ns, "web", "complete")
    finally:
        plain.proxy.let_go()
    assert record(get(kube, ns, "web"))["by"].startswith(f"{ALICE} at ")
    [note] = notes(kube, ns, "web", "RolloutStarted")
    assert f"(changed by {ALICE} at " in note, note
    assert status(control_plane, ns)["web"]["rollout"]["by"].startswith(f"{ALICE} at ")


def test_two_writes_before_the_controller_saw_either_credit_each_reader_with_its_own(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    plain: Plain,
    plain_namespaces: Callable[[], str],
) -> None:
    """alice changes key `a` and bob key `b` while the leader's watch of ConfigMaps lags (two
    writes within the coalescing window, made certain): `web`, which reads `a`, rolls to
    alice's content and its record, Event and status say so; `api`, which reads `b`, is
    bob's; `both`, which reads both, is bob's, the last to change one of its keys."""
    ns = plain_namespaces()
    assert plain.leader.metric("configpin_leader") == 1
    readers = {"web": ("a",), "api": ("b",), "both": ("a", "b")}
    cfg = path("configmaps", ns, "cfg")
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*readers)
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "1", "b": "1"}))
        for name, keys in readers.items():
            kube.create(path("deployments", ns), reader(name, keys=keys))
        before = {n: sources(stamped(kube, ns, n)) for n in readers}
        wait_healthy(kube, ns, list(readers))
        plain.proxy.hold.set()
        try:
            set_cm(As(k8s, ALICE), ns, "2")
            As(k8s, BOB).patch(cfg, {"data": {"b": "2"}}, content_type=MERGE_PATCH)
            assert (changed_by(kube, ns) or {}).get("user") == BOB
        finally:
            plain.proxy.release()
        for name in readers:
            wait_for(
                lambda name=name: sources(get(kube, ns, name)) != before[name],
                what=f"{name} re-stamped",
            )
            _wait_state(kube, ns, name, "complete")
    rows = status(control_plane, ns)
    for name, who in {"web": ALICE, "api": BOB, "both": BOB}.items():
        assert record(get(kube, ns, name))["by"].startswith(f"{who} at "), name
        [note] = notes(kube, ns, name, "RolloutStarted")
        assert f"(changed by {who} at " in note, (name, note)
        assert rows[name]["rollout"]["by"].startswith(f"{who} at "), rows[name]


def _stamped_now(kube: Kube, ns: str) -> dict[str, str]:
    """What the webhook's replica stamps now on a reader of `cfg`'s key `a`, from what it holds
    of the source: a server-side dry run of a new Deployment (nothing is stored)."""
    obj, _ = write_warned(kube, "POST", path("deployments", ns), reader("probe"), dry_run=True)
    return sources(obj)


def test_a_re_stamp_admitted_with_newer_content_than_decided_is_configpins_own_rollout(
    kube: Kube,
    k8s: client.ApiClient,
    plain: Plain,
    plain_namespaces: Callable[[], str],
) -> None:
    """The leader decides to roll the canary to alice's content; its write reaches the API
    server only after bob changed the source again and the webhook's replica saw it, so
    admission stamps bob's content, newer than decided. That is configpin's own rollout, no
    person's rollback: the canary's record comes to name the content its template names,
    made by bob, and completes; the later wave rolls to the same content."""
    ns = plain_namespaces()
    assert plain.leader.metric("configpin_leader") == 1
    before = _workloads(kube, ns, {"canary": CANARY, "later": {}})
    canary = path("deployments", ns, "canary")
    held = len(plain.proxy.stalled)
    plain.proxy.stall(lambda method, target: method == "PATCH" and urlsplit(target).path == canary)
    try:
        with Kubelet(kube, ns) as kubelet:
            kubelet.allow("canary", "later")
            set_cm(As(k8s, ALICE), ns, "2")
            wait_for(lambda: len(plain.proxy.stalled) > held, what="the re-stamp of the canary")
            alices = wait_for(
                lambda: (found := _stamped_now(kube, ns)) != before["canary"] and found,
                what="the webhook's replica holding alice's content",
            )
            set_cm(As(k8s, BOB), ns, "3")
            bobs = wait_for(
                lambda: (
                    (found := _stamped_now(kube, ns)) not in (before["canary"], alices) and found
                ),
                what="the webhook's replica holding bob's content",
            )
            plain.proxy.let_go()
            wait_for(
                lambda: state(get(kube, ns, "canary")) in ("complete", "failed"),
                timeout=60,
                what="the canary's rollout ended",
            )
            done = get(kube, ns, "canary")
            assert sources(done) == bobs  # admission pinned bob's content
            assert record(done)["state"] == "complete", record(done)
            assert record(done)["to"] == bobs
            assert record(done)["by"].startswith(f"{BOB} at "), record(done)
            assert not notes(kube, ns, "canary", "ConfigRolledBackByPerson")
            _wait_state(kube, ns, "later", "complete")
            assert sources(get(kube, ns, "later")) == bobs
    finally:
        plain.proxy.let_go()


def test_a_failed_rollout_names_who_changed_the_source(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    plain_namespaces: Callable[[], str],
) -> None:
    """A change alice made, whose new pods never become Ready within the Deployment's
    progress deadline: the Warning Event (ConfigRolloutFailed in checksum mode, held;
    ConfigRolledBack in snapshot mode, undone) and `configpin status` name her."""
    kinds = {plain_namespaces(): "ConfigRolloutFailed", plain_namespaces(): "ConfigRolledBack"}
    modes = {"ConfigRolloutFailed": {}, "ConfigRolledBack": {ANN_MODE: MODE_SNAPSHOT}}
    with Kubelet(kube, *kinds) as kubelet:
        kubelet.allow("web")
        for ns, reason in kinds.items():
            kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
            kube.create(
                path("deployments", ns), reader("web", annotations=modes[reason], deadline=5)
            )
        before = {ns: sources(stamped(kube, ns, "web")) for ns in kinds}
        for ns in kinds:
            wait_healthy(kube, ns, ["web"])
        kubelet.clear()
        for ns in kinds:  # the change's pods never start
            kubelet.allow(carrying(before[ns]))
        for ns in kinds:
            set_cm(As(k8s, ALICE), ns, "2")
        for ns, reason in kinds.items():
            _wait_state(kube, ns, "web", "failed", timeout=90)
            wait_event(kube, ns, "web", reason, "Warning")
            [note] = notes(kube, ns, "web", reason)
            assert f"changed by {ALICE} at " in note, note
            row = status(control_plane, ns)["web"]
            assert row["state"] == "failed", row
            assert row["rollout"]["by"].startswith(f"{ALICE} at "), row
            assert f"(changed by {ALICE} at " in row["reason"], row


# --- the preview ----------------------------------------------------------------------------


def _preview(kube: Kube, ns: str) -> str:
    """What a dry run of a change of key `a` of `cfg` says first."""
    _, said = write_warned(
        kube,
        "PATCH",
        path("configmaps", ns, "cfg"),
        {"data": {"a": str(time.monotonic())}},
        content_type=MERGE_PATCH,
        dry_run=True,
    )
    return said[0] if said else ""


def test_the_preview_follows_its_consumers_as_they_come_change_and_go(
    kube: Kube, control_plane: ControlPlane, plain_namespaces: Callable[[], str], tmp_path: Path
) -> None:
    """Each write's preview names the consumers the index holds at that moment: a workload
    that starts consuming the source, one that stops, one deleted, each moves the next
    preview (the lists of consumers are kept between writes, per version of the index)."""
    ns = plain_namespaces()
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1", "b": "1"}))
    kube.create(path("configmaps", ns), configmap("elsewhere", {"a": "1"}))
    kube.create(path("deployments", ns), reader("web", replicas=0))
    kube.create(path("deployments", ns), reader("other", keys=("b",), replicas=0))
    late = reader("late", replicas=0)
    late["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"][
        "name"
    ] = "elsewhere"
    kube.create(path("deployments", ns), late)
    for name in ("web", "other", "late"):
        stamped(kube, ns, name)
    manifest = tmp_path / "cfg.yaml"

    def plan() -> dict[str, str]:
        manifest.write_text(yaml.safe_dump(configmap("cfg", {"a": str(time.monotonic())})))
        done = kubectl_configpin(
            ["plan", "-f", str(manifest), "-n", ns, "-o", "json"], control_plane.kubeconfig
        )
        assert done.returncode == 0, done.stderr
        [found] = json.loads(done.stdout)
        return {r["name"]: r["action"] for r in found["rows"]}

    def moves_to(wanted: dict[str, str], count: int) -> None:
        line = f"configpin: ConfigMap {ns}/cfg keys [a] -> {count} workloads:"
        wait_for(
            lambda: _preview(kube, ns).startswith(line) and plan() == wanted,
            timeout=30,
            what=f"the preview naming {sorted(wanted)}",
        )

    moves_to({"web": "roll", "other": "nothing"}, 2)
    # starts consuming it (its template changed to read `cfg`)
    _read_from(kube, ns, "late", "cfg")
    moves_to({"web": "roll", "other": "nothing", "late": "roll"}, 3)
    # stops consuming it
    _read_from(kube, ns, "web", "elsewhere")
    moves_to({"other": "nothing", "late": "roll"}, 2)
    # deleted
    kube.delete(path("deployments", ns, "late"))
    moves_to({"other": "nothing"}, 1)
