"""The sources webhook (chart entry `sources.configpin.io`) at its own path, `/sources`,
against the API server with the webhook registered as the chart registers it for the server's
version, two replicas running as the chart runs them:

- a ConfigMap write gets its preview from `/sources`; registered as an older chart registers
  it (`/mutate`), configpin answers it the same (kept for one release);
- what the API server keeps off it: deletions of Helm release Secrets, service-account
  tokens, leader-election ConfigMaps and ignored sources (the DELETE branch of the chart's
  matchConditions, 1.28+; configpin leaves them alone itself where the API server has no
  matchConditions), writes of service-account tokens (matchConditions) and of configpin's own
  copies (objectSelector, every version); counted by what configpin received;
- a Secret write: its preview, the signed record of who made it, and `kubectl configpin
  approve secret/NAME` recording the approval on it; never a value in any of them.

No kubelet: pods stay Pending unless the fake `Kubelet` reports them Ready.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.apps import write_warned
from harness.configpin import CONFIGPIN_NAMESPACE, Configpin, instance_namespace
from harness.controlplane import (
    ControlPlane,
    chart_webhooks,
    wait_for,
)
from harness.kubelet import Kubelet
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from tests.integration.instances import replicas_fixture
from tests.integration.workloads import (
    As,
    get,
    kubectl_configpin,
    namespace_editor,
    record,
    sources,
    stamped,
    wait_event,
    wait_healthy,
)
from webhook.core.audit import APPROVED, ChangedBy
from webhook.core.constants import ANN_APPROVE, ANN_APPROVED, ANN_CHANGED_BY
from webhook.core.model import SourceId, SourceKind
from webhook.kube.digestkey import read_digest_key
from webhook.kube.errors import NotFound
from webhook.kube.raw import MERGE_PATCH, Kube, path

INSTANCE = "sourcehook"
HOOK = "configpin-sourcehook"
HOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", "2",
    "--rollout-waves", "1,approve,100%",
]  # fmt: skip
EDITOR = "alice@example.com"
VALUE = "s3cr3t-value"  # a value that must never be shown
SHOWN = (VALUE, base64.b64encode(VALUE.encode()).decode())  # as given, as stored
JSON_PATCH = "application/json-patch+json"
SNAPSHOT_LABEL = {"configpin.io/snapshot": "true"}

replicas = replicas_fixture(INSTANCE, "sourcehook", ARGS)


@pytest.fixture
def ns(k8s: client.ApiClient, kube: Kube, replicas: list[Configpin]) -> Iterator[str]:
    """A fresh namespace of this module's configpin, gone before the next test starts: the
    deletions that empty it would reach configpin and be counted in that test."""
    with instance_namespace(k8s, INSTANCE, "srchook") as name:
        yield name
    wait_for(lambda: _gone(kube, name), timeout=120, what=f"namespace {name} gone")


def _gone(kube: Kube, name: str) -> bool:
    try:
        kube.get(path("namespaces", None, name))
    except NotFound:
        return True
    return False


def _patch(
    kube: Kube, ns: str, resource: str, name: str, body: Mapping[str, Any], dry_run: bool = False
) -> tuple[dict[str, Any], list[str]]:
    return write_warned(
        kube, "PATCH", path(resource, ns, name), body, content_type=MERGE_PATCH, dry_run=dry_run
    )


def _received(cp: Configpin, webhook_path: str) -> float:
    """Requests `cp` received at `webhook_path`."""
    return cp.metric("configpin_webhook_requests_total", path=webhook_path)


def _answered(cp: Configpin, **labels: str) -> float:
    """Reviews `cp` answered (each review it receives is answered and counted once)."""
    return cp.metric("configpin_admissions_total", **labels)


def _app(name: str, *, replicas: int = 0) -> dict[str, Any]:
    """Deployment `name` reading key `a` of ConfigMap `cfg`."""
    env = [env_key_ref("configmap", "cfg", "a", "A")]
    return deployment(name, pod_spec(container(env=env)), replicas=replicas)


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def _served(k8s: client.ApiClient) -> bool:
    """Whether the chart's sources entry carries matchConditions for this server (1.28+)."""
    return bool(chart_webhooks(k8s)[1].get("matchConditions"))


# --- its own path -----------------------------------------------------------------------------


@contextlib.contextmanager
def _sources_entry_at(kube: Kube, cp: Configpin, ns: str, webhook_path: str) -> Iterator[None]:
    """The module's sources entry posting to `webhook_path` of `cp` (an older chart's
    registration: `/mutate`) until the block ends; in effect (the API server reads webhook
    configurations through an informer) once a dry-run write reaches that path."""
    config = kube.get(f"{HOOKS}/{HOOK}")
    at = [h["name"] for h in config["webhooks"]].index("sources.configpin.io")
    url = f"/webhooks/{at}/clientConfig/url"

    def moved_to(where: str) -> None:
        kube.patch(
            f"{HOOKS}/{HOOK}",
            [{"op": "replace", "path": url, "value": cp.url + where}],
            content_type=JSON_PATCH,
        )

        def there() -> bool:
            before = _received(cp, where)
            _patch(kube, ns, "configmaps", "cfg", {"data": {"probe": where}}, dry_run=True)
            return _received(cp, where) > before

        wait_for(there, what=f"the sources entry posting to {where}")

    moved_to(webhook_path)
    try:
        yield
    finally:
        moved_to("/sources")


def test_a_configmap_write_is_previewed_at_sources_and_at_an_older_charts_mutate(
    kube: Kube, k8s: client.ApiClient, replicas: list[Configpin], ns: str
) -> None:
    """The chart's sources entry posts to /sources, and a ConfigMap write through the API
    server gets its preview (and its signed editor) from there. The same entry registered as
    an older chart registers it, at /mutate, is answered the same."""
    called = replicas[0]  # the replica the webhook calls
    hooks = {h["name"]: h["clientConfig"]["url"] for h in kube.get(f"{HOOKS}/{HOOK}")["webhooks"]}
    assert hooks == {
        "mutate.configpin.io": called.url + "/mutate",
        "sources.configpin.io": called.url + "/sources",
    }
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), _app("web"))
    stamped(kube, ns, "web")

    # (the workloads entry is called meanwhile too, for web's ReplicaSet on 1.20: /mutate's
    # count is only ever compared by at least)
    before = {p: _received(called, p) for p in ("/mutate", "/sources")}
    _, said = _patch(kube, ns, "configmaps", "cfg", {"data": {"a": "2"}}, dry_run=True)
    assert said and said[0].startswith(f"configpin: ConfigMap {ns}/cfg keys [a] -> 1 workloads")
    assert _received(called, "/sources") == before["/sources"] + 1

    with _sources_entry_at(kube, called, ns, "/mutate"):
        before = {p: _received(called, p) for p in ("/mutate", "/sources")}
        _, again = _patch(kube, ns, "configmaps", "cfg", {"data": {"a": "2"}}, dry_run=True)
        assert again == said
        assert _received(called, "/mutate") >= before["/mutate"] + 1
        assert _received(called, "/sources") == before["/sources"]
        written, _ = _patch(As(k8s, EDITOR), ns, "configmaps", "cfg", {"data": {"a": "2"}})
        assert json.loads(_annotations(written)[ANN_CHANGED_BY])["user"] == EDITOR

    # back at /sources: the same record, made there
    written, _ = _patch(As(k8s, EDITOR), ns, "configmaps", "cfg", {"data": {"a": "3"}})
    assert json.loads(_annotations(written)[ANN_CHANGED_BY])["user"] == EDITOR


# --- what the API server keeps off it ---------------------------------------------------------


def _token(ns: str, name: str = "robot-token") -> dict[str, Any]:
    """A service-account token Secret of the namespace's `default` account (filled in by the
    token controller)."""
    return {
        "metadata": {
            "name": name,
            "annotations": {"kubernetes.io/service-account.name": "default"},
        },
        "type": "kubernetes.io/service-account-token",
    }


def _filled(kube: Kube, ns: str, name: str = "robot-token") -> dict[str, Any]:
    """The token Secret once the token controller has written its token (an UPDATE of its
    own, which would reach configpin where nothing keeps it off)."""

    def token() -> dict[str, Any] | None:
        found = kube.get(path("secrets", ns, name))
        return found if (found.get("data") or {}).get("token") else None

    filled: dict[str, Any] = wait_for(token, what=f"{ns}/{name} filled in")
    return filled


def test_deletions_configpin_has_nothing_to_say_about_never_reach_it(
    kube: Kube, k8s: client.ApiClient, replicas: list[Configpin], ns: str
) -> None:
    """The DELETE branch of the chart's matchConditions (which read a deletion's old object):
    deleting a Helm release Secret, a service-account token, a leader-election ConfigMap or
    an ignored source never reaches configpin where the API server has matchConditions
    (1.28+); where it has not (1.20), each reaches it and is left alone (`skipped`, nothing
    said). Deleting a consumed ConfigMap reaches it on both and says who breaks."""
    served = _served(k8s)
    called = replicas[0]
    release = {
        "metadata": {"name": "sh.helm.release.v1.web.v1", "labels": {"owner": "helm"}},
        "type": "helm.sh/release.v1",
        "data": {"release": base64.b64encode(b"H4sI").decode()},
    }
    kube.create(path("secrets", ns), release)
    kube.create(path("secrets", ns), _token(ns))
    leader = {"control-plane.alpha.kubernetes.io/leader": "{}"}
    kube.create(path("configmaps", ns), configmap("lock", {"a": "1"}, annotations=leader))
    ignored = {"configpin.io/ignore": "true"}
    kube.create(path("configmaps", ns), configmap("quiet", {"a": "1"}, annotations=ignored))
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), _app("web"))
    stamped(kube, ns, "web")
    _filled(kube, ns)

    def deletions() -> dict[str, float]:
        return {
            kind: _answered(called, kind=kind, operation="DELETE")
            for kind in ("Secret", "ConfigMap")
        } | {"skipped": _answered(called, operation="DELETE", result="skipped")}

    before = deletions()
    for resource, name in [
        ("secrets", "sh.helm.release.v1.web.v1"),
        ("secrets", "robot-token"),
        ("configmaps", "lock"),
        ("configmaps", "quiet"),
    ]:
        _, said = write_warned(kube, "DELETE", path(resource, ns, name))
        assert said == [], (name, said)
    _, said = write_warned(kube, "DELETE", path("configmaps", ns, "cfg"))
    assert said[:2] == [
        f"configpin: deleting ConfigMap {ns}/cfg: 1 workloads consume it",
        "configpin: 1 require it, their next pod start fails: Deployment web",
    ], said
    after = deletions()
    reached = {k: after[k] - before[k] for k in after}
    if served:
        assert reached == {"Secret": 0, "ConfigMap": 1, "skipped": 0}
    else:
        assert reached == {"Secret": 2, "ConfigMap": 3, "skipped": 4}


def test_writes_of_tokens_and_of_configpins_own_copies_never_reach_it(
    kube: Kube, k8s: client.ApiClient, replicas: list[Configpin], ns: str
) -> None:
    """Updates of configpin's own copies (label configpin.io/snapshot) are kept off by the
    entry's objectSelector on every version; of service-account tokens, by its
    matchConditions (1.28+), and where the API server has none (1.20) configpin leaves them
    alone itself. Nothing is written on them and nothing is said; what configpin received
    says which reached it."""
    served = _served(k8s)
    called = replicas[0]
    copy_cm = configmap("cfg-0123456789", {"a": "1"}, labels=SNAPSHOT_LABEL)
    copy_secret = {
        "metadata": {"name": "creds-0123456789", "labels": SNAPSHOT_LABEL},
        "data": {"k": base64.b64encode(b"v").decode()},
    }
    for resource, body in [("configmaps", copy_cm), ("secrets", copy_secret)]:
        kube.create(path(resource, ns), {**body, "immutable": True})
    kube.create(path("secrets", ns), _token(ns))
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    _filled(kube, ns)

    def counts() -> dict[str, float]:
        return {
            kind: _answered(called, kind=kind, operation="UPDATE")
            for kind in ("Secret", "ConfigMap")
        } | {
            "skipped": _answered(called, operation="UPDATE", result="skipped"),
            "received": _received(called, "/sources"),
        }

    before = counts()
    annotate = {"metadata": {"annotations": {"team": "web"}}}
    for resource, name in [
        ("configmaps", "cfg-0123456789"),
        ("secrets", "creds-0123456789"),
        ("secrets", "robot-token"),
    ]:
        written, said = _patch(kube, ns, resource, name, annotate)
        assert said == [], (name, said)
        assert ANN_CHANGED_BY not in _annotations(written), name
    reached = {k: v - before[k] for k, v in counts().items()}
    token = 0 if served else 1
    assert reached == {"Secret": token, "ConfigMap": 0, "skipped": token, "received": token}

    # a write it does hear, counted the same way
    _patch(kube, ns, "configmaps", "cfg", {"data": {"a": "2"}})
    reached = {k: v - before[k] for k, v in counts().items()}
    assert reached == {"Secret": token, "ConfigMap": 1, "skipped": token, "received": token + 1}


# --- Secret writes ----------------------------------------------------------------------------


def _consumer(name: str) -> dict[str, Any]:
    """Deployment `name` (1 replica) reading key `password` of Secret `creds`."""
    env = [env_key_ref("secret", "creds", "password", "PASSWORD")]
    dep = deployment(name, pod_spec(container(env=env)), replicas=1)
    dep["spec"]["progressDeadlineSeconds"] = 600
    return dep


def _notes(kube: Kube, ns: str) -> list[str]:
    found = kube.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")
    return [e.get("note") or "" for e in found.get("items") or ()]


def _never_shown(texts: Sequence[str]) -> None:
    leaked = [t for t in texts for v in SHOWN if v in t]
    assert not leaked, leaked


def test_a_secret_write_is_previewed_recorded_and_approved_never_showing_a_value(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    replicas: list[Configpin],
    ns: str,
    tmp_path: Path,
) -> None:
    """An update of a consumed Secret, by a user: the preview (its changed key, the waves, the
    one that rolls first, who waits for an approval), on a dry run and on the write; the
    signed record of that user on the Secret, which the rollout believes; `kubectl configpin
    approve secret/creds` by a user allowed to read and update it records that user's
    signed approval on the Secret, and the waves after `approve` roll. No value, as given or
    as stored, in any warning, record or Event."""
    names = [f"app-{i}" for i in range(3)]
    creds = SourceId(SourceKind.SECRET, "creds")
    hkey = read_digest_key(kube, CONFIGPIN_NAMESPACE, "configpin-digest-key")
    editor = namespace_editor(
        control_plane, kube, ns, tmp_path, verbs=("get", "update"), resource="secrets"
    )
    change = {"data": {"password": SHOWN[1]}}
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        first = {"password": base64.b64encode(b"first").decode()}
        kube.create(path("secrets", ns), {"metadata": {"name": "creds"}, "data": first})
        for name in names:
            kube.create(path("deployments", ns), _consumer(name))
        v1 = {n: sources(stamped(kube, ns, n)) for n in names}
        wait_healthy(kube, ns, names)

        _, said = _patch(As(k8s, EDITOR), ns, "secrets", "creds", change, dry_run=True)
        assert said[0].startswith(
            f"configpin: Secret {ns}/creds keys [password] -> 3 workloads: 3 roll in 2 waves"
        ), said
        assert "2 wait for an approval" in said[0], said
        assert said[1].startswith("configpin: wave 1: Deployment "), said
        canary = said[1].rsplit(" ", 1)[1]
        assert canary in names
        _never_shown(said)
        assert ANN_CHANGED_BY not in _annotations(get(kube, ns, "creds", "secrets"))

        written, again = _patch(As(k8s, EDITOR), ns, "secrets", "creds", change)
        assert again == said
        changed_by = _annotations(written)[ANN_CHANGED_BY]
        who = ChangedBy.decode(hkey, ns, creds, changed_by, None)
        assert who is not None and who.user == EDITOR, changed_by
        wait_for(
            lambda: record(get(kube, ns, canary)).get("state") == "complete",
            timeout=60,
            what=f"the first wave, {canary}, complete",
        )
        assert record(get(kube, ns, canary))["by"].startswith(f"{EDITOR} at ")
        later = [n for n in names if n != canary]
        for name in later:
            wait_event(kube, ns, name, "ConfigRolloutAwaitingApproval", "Normal")
        assert all(sources(get(kube, ns, n)) == v1[n] for n in later)

        done = kubectl_configpin(["approve", "secret/creds", "-n", ns], editor)
        assert done.returncode == 0, done.stderr + done.stdout
        approver = f"system:serviceaccount:{ns}:editor"
        assert done.stdout.startswith(f"approved secret/creds in {ns}"), done.stdout
        assert approver in done.stdout, done.stdout
        annotations = _annotations(get(kube, ns, "creds", "secrets"))
        assert ANN_APPROVE not in annotations  # the request, never stored
        approved = ChangedBy.decode(
            hkey, ns, creds, annotations[ANN_APPROVED], None, domain=APPROVED
        )
        assert approved is not None and approved.user == approver, annotations[ANN_APPROVED]
        assert approved.content == who.content  # the content it holds, that the editor wrote
        wait_for(
            lambda: all(sources(get(kube, ns, n)) != v1[n] for n in later),
            timeout=30,
            what="the waves after approve rolled",
        )
        records = [json.dumps(record(get(kube, ns, n))) for n in names]
    _never_shown([*said, *annotations.values(), *records, *_notes(kube, ns), done.stdout])
