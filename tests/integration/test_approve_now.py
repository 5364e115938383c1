"""`kubectl configpin approve --now` against the API server (issue 40, shared/SPEC.md "Windows
and budgets": the override of an emergency), with the webhook registered as the chart
registers it and two replicas running as the chart runs them (waves `1,approve,100%`):

- asked by a user who may update the ConfigMap (or the Secret), it records, on the source,
  the signed approval with `now` and that user, never the request; a configpin cache over the
  cluster (the running configpin's digest key, its watch) reads it as `approved_now` and
  `approved`, and the running configpin rolls the waves after `approve`;
- asked by a user who may only read the source, the API server refuses it (403) and nothing
  is recorded: the source is as it was.

No kubelet: pods stay Pending unless the fake `Kubelet` reports them Ready.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness.configpin import CONFIGPIN_NAMESPACE, Configpin, instance_namespace
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap
from tests.integration.instances import replicas_fixture
from tests.integration.workloads import (
    As,
    get,
    kubectl_configpin,
    namespace_editor,
    reader,
    set_cm,
    sources,
    stamped,
    state,
    wait_event,
    wait_healthy,
)
from webhook.core import digest
from webhook.core.audit import APPROVED, ChangedBy
from webhook.core.constants import ANN_APPROVE, ANN_APPROVED, ANN_WAVE
from webhook.core.model import SourceId, SourceKind, SourceRecord
from webhook.kube.cache import SourceCache
from webhook.kube.digestkey import read_digest_key
from webhook.kube.raw import Kube, path
from webhook.process.metrics import Metrics

INSTANCE = "approve-now"
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", "2",
    "--rollout-waves", "1,approve,100%",
]  # fmt: skip
ALICE = "alice@example.com"
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
CREDS = SourceId(SourceKind.SECRET, "creds")

replicas = replicas_fixture(INSTANCE, INSTANCE, ARGS)


@pytest.fixture
def namespaces(k8s: client.ApiClient, replicas: list[Configpin]) -> Iterator[Callable[[], str]]:
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(instance_namespace(k8s, INSTANCE, INSTANCE))


@pytest.fixture
def hkey(kube: Kube, replicas: list[Configpin]) -> bytes:
    """The running configpin's digest key."""
    return read_digest_key(kube, CONFIGPIN_NAMESPACE, "configpin-digest-key")


@contextlib.contextmanager
def _cache(kube: Kube, hkey: bytes) -> Iterator[SourceCache]:
    """The source cache a configpin runs, over the cluster with the running one's key."""
    cache = SourceCache(kube, hkey, Metrics())
    cache.start()
    try:
        assert cache.wait_synced(30)
        yield cache
    finally:
        cache.stop()


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def _content(hkey: bytes, kind: SourceKind, obj: dict[str, Any]) -> str:
    return digest.content_id(digest.source_digest(hkey, digest.record_from_object(hkey, kind, obj)))


def _approved_now(cache: SourceCache, ns: str, sid: SourceId, content: str) -> None:
    def read() -> bool:
        found = cache.peek(ns, sid)
        return isinstance(found, SourceRecord) and found.approved_now == content

    wait_for(read, timeout=30, what=f"the cache reading {ns}/{sid} approved --now")
    found = cache.peek(ns, sid)
    assert isinstance(found, SourceRecord) and found.approved == content


def test_approve_now_by_an_editor_records_now_and_who_and_the_cache_reads_it(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    namespaces: Callable[[], str],
    hkey: bytes,
    tmp_path: Path,
) -> None:
    """A change rolls the canary, and `later` waits for an approval; `approve --now` by a user
    who may get and patch the ConfigMap records `now` and that user on it, signed for its
    content; the cache reads `approved_now`, and the running configpin rolls `later`."""
    ns = namespaces()
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("canary", "later")
        kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
        kube.create(path("deployments", ns), reader("canary", annotations={ANN_WAVE: "-1"}))
        kube.create(path("deployments", ns), reader("later"))
        before = sources(stamped(kube, ns, "later"))
        stamped(kube, ns, "canary")
        wait_healthy(kube, ns, ["canary", "later"])
        set_cm(As(k8s, ALICE), ns, "2")
        wait_event(kube, ns, "later", "ConfigRolloutAwaitingApproval", "Normal")
        assert sources(get(kube, ns, "later")) == before

        with _cache(kube, hkey) as cache:
            done = kubectl_configpin(["approve", "--now", "configmap/cfg", "-n", ns], editor)
            assert done.returncode == 0, done.stderr + done.stdout
            user = f"system:serviceaccount:{ns}:editor"
            assert done.stdout.startswith(f"approved --now configmap/cfg in {ns}"), done.stdout
            assert f"by {user}" in done.stdout, done.stdout

            stored = get(kube, ns, "cfg", "configmaps")
            notes = _annotations(stored)
            assert ANN_APPROVE not in notes  # the request, never stored
            content = _content(hkey, CFG.kind, stored)
            said = ChangedBy.decode(hkey, ns, CFG, notes[ANN_APPROVED], content, domain=APPROVED)
            assert said is not None and (said.user, said.now) == (user, True), notes
            assert json.loads(notes[ANN_APPROVED])["now"] is True
            _approved_now(cache, ns, CFG, content)

        wait_for(
            lambda: state(get(kube, ns, "later")) == "complete",
            timeout=60,
            what="the wave after approve rolled",
        )
        assert sources(get(kube, ns, "later")) == sources(get(kube, ns, "canary"))


def test_approve_now_of_a_secret_by_a_user_who_may_get_and_update_it(
    kube: Kube,
    control_plane: ControlPlane,
    namespaces: Callable[[], str],
    hkey: bytes,
    tmp_path: Path,
) -> None:
    """`approve --now secret/NAME` by a user who may get and update the Secret but not patch
    it (the command then reads and replaces it): the record says `now` and that user."""
    ns = namespaces()
    editor = namespace_editor(
        control_plane, kube, ns, tmp_path, verbs=("get", "update"), resource="secrets"
    )
    data = {"password": base64.b64encode(b"first").decode()}
    kube.create(path("secrets", ns), {"metadata": {"name": "creds"}, "data": data})
    with _cache(kube, hkey) as cache:
        done = kubectl_configpin(["approve", "--now", "secret/creds", "-n", ns], editor)
        assert done.returncode == 0, done.stderr + done.stdout
        assert done.stdout.startswith(f"approved --now secret/creds in {ns}"), done.stdout
        stored = get(kube, ns, "creds", "secrets")
        notes = _annotations(stored)
        assert ANN_APPROVE not in notes
        content = _content(hkey, CREDS.kind, stored)
        said = ChangedBy.decode(hkey, ns, CREDS, notes[ANN_APPROVED], content, domain=APPROVED)
        user = f"system:serviceaccount:{ns}:editor"
        assert said is not None and (said.user, said.now) == (user, True), notes
        _approved_now(cache, ns, CREDS, content)
        assert "first" not in done.stdout + done.stderr + json.dumps(notes)


def test_approve_now_by_a_user_who_may_only_read_is_refused_and_records_nothing(
    kube: Kube,
    control_plane: ControlPlane,
    namespaces: Callable[[], str],
    tmp_path: Path,
) -> None:
    ns = namespaces()
    viewer = namespace_editor(control_plane, kube, ns, tmp_path, verbs=("get", "list"))
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    held = get(kube, ns, "cfg", "configmaps")
    done = kubectl_configpin(["approve", "--now", "configmap/cfg", "-n", ns], viewer)
    assert done.returncode == 2, done.stderr + done.stdout
    assert "403" in done.stderr, done.stderr
    after = get(kube, ns, "cfg", "configmaps")
    assert after["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
    notes = _annotations(after)
    assert ANN_APPROVE not in notes and ANN_APPROVED not in notes, notes
