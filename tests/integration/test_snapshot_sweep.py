"""The sweep of unused snapshot copies, against the real API server.

End to end with a configpin of its own (instance `sweep`, a 2 s grace period, its own
Lease); and in process, where the race between a sweep's delete and a re-use is played out
step by step on the real API server's preconditions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.configpin import Configpin
from harness.controlplane import (
    ControlPlane,
    wait_for,
)
from harness.manifests import configmap, container, env_from, pod_spec
from tests.integration.instances import instance_fixtures
from tests.integration.test_events import described_reason
from tests.integration.test_snapshot_mode import (
    copies_in,
    deployment,
    get,
    owner_uids,
    revisions,
    template_spec,
)
from webhook.controller.sweep import SnapshotSweeper
from webhook.core import digest
from webhook.core.constants import ANN_UNUSED
from webhook.core.model import SnapshotRequest, SourceId, SourceKind
from webhook.core.names import snapshot_name
from webhook.kube.cache import SourceCache
from webhook.kube.copies import SnapshotIndex, SnapshotWriter, delete_unchanged
from webhook.kube.errors import Invalid
from webhook.kube.raw import Kube, path
from webhook.process.metrics import Metrics

INSTANCE = "sweep"
GRACE = 2.0
HKEY = b"snapshot-sweep-test-key-0123456789"


cp, ns = instance_fixtures(INSTANCE, "sweep", ["--snapshot-grace-period", str(GRACE)])


def rejected_admission(kube: Kube, ns: str) -> str:
    """A Deployment that configpin admits (making its copy) and the API server then rejects
    (its selector does not match its template): the copy is left with nothing using it."""
    bad = deployment(spec=spec())
    bad["spec"]["selector"] = {"matchLabels": {"app": "other"}}
    with pytest.raises(Invalid, match="selector"):
        kube.create(path("deployments", ns), bad)
    made = kube.get(path("configmaps", ns), labelSelector="configpin.io/snapshot=true")["items"]
    assert len(made) == 1
    assert made[0]["metadata"]["labels"]["configpin.io/source"] == "app-config"
    return str(made[0]["metadata"]["name"])


def spec() -> dict[str, Any]:
    return pod_spec(container(env_from=[env_from("configmap", "app-config")]))


def test_an_unused_copy_is_swept_after_the_grace_period(kube: Kube, ns: str, cp: Configpin) -> None:
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    before = cp.metric("configpin_snapshots_swept_total")
    name = rejected_admission(kube, ns)
    wait_for(
        lambda: (
            ANN_UNUSED
            in ((get(kube, "configmaps", ns, name) or {}).get("metadata") or {}).get(
                "annotations", {}
            )
        ),
        what="the copy marked unused",
    )
    wait_for(lambda: get(kube, "configmaps", ns, name) is None, what="the copy swept")
    assert cp.metric("configpin_snapshots_swept_total") > before
    source = get(kube, "configmaps", ns, "app-config")
    assert source is not None, "sources are never swept"
    # said on the source, where `kubectl describe configmap app-config` finds it (the copy
    # itself is gone)
    removed = described_reason(kube, {"kind": "ConfigMap", **source}, "CopyRemoved")
    assert removed["type"] == "Normal"
    assert name in removed["message"]
    assert removed["related"]["name"] == name


def test_a_copy_reused_after_its_mark_is_kept(kube: Kube, ns: str) -> None:
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    name = rejected_admission(kube, ns)

    def annotations() -> dict[str, Any]:
        obj = get(kube, "configmaps", ns, name)
        assert obj is not None, "swept although re-used"
        return dict(obj["metadata"].get("annotations") or {})

    wait_for(lambda: ANN_UNUSED in annotations(), what="the copy marked unused")
    # Re-use it before the sweep comes back (a grace period after the mark).
    dep = kube.create(path("deployments", ns), deployment(spec=spec()))
    assert copies_in(template_spec(dep))["app-config"] == name
    wait_for(lambda: ANN_UNUSED not in annotations(), what="the mark removed")
    rs = wait_for(lambda: revisions(kube, ns, dep), what="the ReplicaSet")[0]
    wait_for(
        lambda: rs["metadata"]["uid"] in owner_uids(get(kube, "configmaps", ns, name) or {}),
        what="the copy owned by the ReplicaSet",
    )
    time.sleep(2 * GRACE + 1)  # two more sweeps' worth
    assert ANN_UNUSED not in annotations()


def test_objects_that_only_look_like_copies_are_never_swept_or_adopted(
    kube: Kube, ns: str, cp: Configpin
) -> None:
    """The label marks, it does not prove: a user's Secret that carries it (the name pattern
    too), or an immutable look-alike with a made-up signature, survives sweep after sweep, and
    a Pod that uses one does not become its owner (the garbage collector would delete it with
    the Pod). A real copy in the same namespace is swept meanwhile: the sweep does run here."""
    precious = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "precious-0123456789",
            "labels": {"configpin.io/snapshot": "true", "configpin.io/source": "precious"},
        },
        "stringData": {"password": "irreplaceable"},
    }
    kube.create(path("secrets", ns), precious)
    kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    real = rejected_admission(kube, ns)
    forged = configmap(
        "app-config-abcdef0123",
        {"a": "1"},
        labels={"configpin.io/snapshot": "true", "configpin.io/source": "app-config"},
        annotations={"configpin.io/source": "app-config", "configpin.io/signature": "0" * 64},
    )
    forged["immutable"] = True
    kube.create(path("configmaps", ns), forged)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "user"},
        "spec": pod_spec(
            container(env_from=[env_from("secret", "precious-0123456789")]),
        ),
    }
    pod = kube.create(path("pods", ns), pod)
    wait_for(lambda: cp.metric("configpin_snapshot_lookalikes") >= 2, what="look-alikes counted")

    wait_for(lambda: get(kube, "configmaps", ns, real) is None, what="the real copy swept")
    time.sleep(3 * GRACE)  # and several sweep periods more
    for resource, name in (
        ("secrets", "precious-0123456789"),
        ("configmaps", forged["metadata"]["name"]),
    ):
        obj = get(kube, resource, ns, name)
        assert obj is not None, f"{resource}/{name} was deleted"
        assert ANN_UNUSED not in (obj["metadata"].get("annotations") or {}), "marked for deletion"
        assert not obj["metadata"].get("ownerReferences"), "adopted by the Pod that uses it"
    assert cp.metric("configpin_snapshot_lookalikes", kind="secret") >= 1
    assert "carries the snapshot label but is not a copy configpin made" in cp.log()


# --- in process: the race itself, on the real API server's preconditions


class Clocks:
    def __init__(self) -> None:
        self.offset = 0.0
        self.mono = 0.0

    def wall(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds
        self.mono += seconds


@pytest.fixture
def in_process(control_plane: ControlPlane) -> Iterator[tuple[Kube, SnapshotIndex, SnapshotWriter]]:
    with control_plane.api_client() as api:
        kube = Kube(api)
        metrics = Metrics()
        cache = SourceCache(kube, HKEY, metrics)
        index = SnapshotIndex(metrics, HKEY)
        index.attach(cache)
        writer = SnapshotWriter(kube, cache, index, HKEY, metrics)
        cache.start()
        try:
            assert cache.wait_synced(30)
            yield kube, index, writer
        finally:
            cache.stop()


def test_a_delete_that_races_a_reuse_loses(
    in_process: tuple[Kube, SnapshotIndex, SnapshotWriter], plain_namespace: str
) -> None:
    kube, index, writer = in_process
    ns = plain_namespace  # no configpin serves it: this test plays every part itself
    source = kube.create(path("configmaps", ns), configmap("app-config", {"a": "1"}))
    content = digest.source_digest(
        digest.namespace_key(HKEY, ns),
        digest.record_from_object(HKEY, SourceKind.CONFIGMAP, source),
    )
    name = snapshot_name("app-config", content)
    req = SnapshotRequest(SourceId(SourceKind.CONFIGMAP, "app-config"), name, content)
    key = (SourceKind.CONFIGMAP, ns, name)
    writer.ensure(ns, [req])
    wait_for(lambda: index.get(key), what="the copy in the index")

    clocks = Clocks()
    sweep = SnapshotSweeper(
        kube,
        index,
        Metrics(),
        grace=GRACE,
        namespace_filter=lambda n: n == ns,
        wall=clocks.wall,
        monotonic=lambda: clocks.mono,
    )
    clocks.advance(GRACE + 1)
    assert sweep.run_once().marked == [f"configmap/{name}"]
    seen = wait_for(
        lambda: (c := index.get(key)) and c.unused_since and c, what="the mark in the index"
    )

    # An admission re-uses the copy: the writer un-marks it before answering...
    calls = kube.calls
    writer.ensure(ns, [req])
    assert kube.calls == calls + 1
    # ...so the delete the sweep decided on, with what it had seen, fails on the server.
    assert not delete_unchanged(kube, seen)
    assert get(kube, "configmaps", ns, name) is not None

    # And a sweep that sees the re-use starts over instead of deleting.
    wait_for(lambda: (c := index.get(key)) and c.unused_since is None, what="the un-mark seen")
    clocks.advance(GRACE + 1)
    result = sweep.run_once()
    assert result.deleted == []
    assert result.marked == [f"configmap/{name}"]
