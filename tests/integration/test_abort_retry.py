"""`kubectl configpin abort` and `retry` against the API server (issue 47, shared/SPEC.md
"Acting on a change"), with both webhooks registered as the chart registers them and two
replicas running as the chart runs them (waves `1,1,100%`: the canary, then `b`, then `c` and
`d`), each verb with another actor in the middle:

- abort while wave 2 rolls (snapshot mode): wave 3 never starts; the canary (complete) and `b`
  (rolling) go back to the copies of the content before, that content rejected there; the
  ConfigRollout says Stalled/Aborted with who, `configpin status` says `aborted` for wave 3,
  which gets ConfigRolloutAborted, `configpin wait` exits 1; the same content stored again
  after another is still aborted; retry rolls it again from the first wave, to the end;
- abort in checksum mode, with wave 1 rolling: that rollout is followed to the end (nothing to
  take back), no wave 2;
- retry of a failure held in checksum mode (the canary's progress deadline passed): the canary
  is restarted (its template holds the content already) and completes, then the later waves
  roll;
- retry after a newer change: the retry names the content the source holds now, the newer
  change rolls as usual and the aborted content stays where it was (on no workload);
- a user who may only read the source is refused (tests/integration/test_pause.py, each verb).

No kubelet: pods stay Pending unless the fake `Kubelet` reports them Ready.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client

from harness.configpin import CONFIGPIN_NAMESPACE
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap
from tests.integration.instances import Replicas, replicas_fixtures
from tests.integration.workloads import (
    As,
    annotation,
    get,
    kubectl_configpin,
    namespace_editor,
    notes,
    quiet,
    reader,
    record,
    replicasets,
    set_cm,
    sources,
    stamped,
    state,
    status,
    wait_event,
    wait_healthy,
)
from webhook.core.constants import ANN_ACTED, ANN_MODE, ANN_REJECTED, ANN_WAVE
from webhook.core.model import SourceId, SourceKind
from webhook.core.rollouts import GROUP, PLURAL, VERSION
from webhook.core.verbs import Acted, Verb
from webhook.kube.digestkey import read_digest_key
from webhook.kube.errors import NotFound
from webhook.kube.raw import Kube, path

RESYNC = 2.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
    "--lease-duration", "4",
    "--rollout-waves", "1,1,100%",
]  # fmt: skip
ALICE = "alice@example.com"
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
APPS = ("canary", "b", "c", "d")
WAVES = {"canary": "-2", "b": "-1"}
ABORTED = "ConfigRolloutAborted"

replicas, ns = replicas_fixtures("abort", ARGS)


def _cr(kube: Kube, ns: str) -> dict[str, Any]:
    try:
        return kube.get(path(PLURAL, ns, "configmap-cfg", prefix=f"/apis/{GROUP}/{VERSION}"))
    except NotFound:
        return {}


def _said(kube: Kube, ns: str) -> tuple[str, str] | None:
    """The condition True of the ConfigRollout, once its status is about the ConfigMap as it
    stands: (type, reason)."""
    obj = _cr(kube, ns)
    cm = kube.get(path("configmaps", ns, "cfg"))
    status_ = obj.get("status") or {}
    if (status_.get("source") or {}).get("resourceVersion") != cm["metadata"]["resourceVersion"]:
        return None
    for c in status_.get("conditions") or ():
        if c.get("status") == "True":
            return (c["type"], c.get("reason", ""))
    return None


def _ref(obj: dict[str, Any]) -> str:
    """The ConfigMap its container reads (snapshot mode: a copy)."""
    env = obj["spec"]["template"]["spec"]["containers"][0]["env"][0]
    return str(env["valueFrom"]["configMapKeyRef"]["name"])


def _world(
    kube: Kube, ns: str, kubelet: Kubelet, mode: str, deadline: int = 600
) -> dict[str, dict[str, str]]:
    """ConfigMap `cfg` (a: 1) and the four readers of it in `mode`, healthy; then no more
    pods made Ready. Their template records. `deadline`: the canary's progressDeadlineSeconds."""
    kubelet.allow(*APPS)
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    for name in APPS:
        notes_ = {ANN_MODE: mode, **({ANN_WAVE: WAVES[name]} if name in WAVES else {})}
        limit = deadline if name == "canary" else 600
        kube.create(path("deployments", ns), reader(name, annotations=notes_, deadline=limit))
    before = {n: sources(stamped(kube, ns, n)) for n in APPS}
    wait_healthy(kube, ns, list(APPS))
    kubelet.clear()
    return before


def _verb(kubeconfig: Path, verb: str, ns: str) -> str:
    done = kubectl_configpin([verb, "configmap/cfg", "-n", ns], kubeconfig)
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def _rolled_in_every_wave(kube: Kube, ns: str, what: str) -> dict[str, str]:
    wait_for(
        lambda: (
            all(state(get(kube, ns, n)) == "complete" for n in APPS)
            and len({_ref(get(kube, ns, n)) for n in APPS}) == 1
        ),
        timeout=120,
        what=what,
    )
    return sources(get(kube, ns, "canary"))


def test_abort_while_wave_2_rolls_takes_waves_1_and_2_back_and_retry_rolls_it_again(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    replicas: Replicas,
    ns: str,
    tmp_path: Path,
) -> None:
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    user = f"system:serviceaccount:{ns}:editor"
    hkey = read_digest_key(kube, CONFIGPIN_NAMESPACE, "configpin-digest-key")
    with Kubelet(kube, ns) as kubelet:
        before = _world(kube, ns, kubelet, "snapshot")
        old = {n: _ref(get(kube, ns, n)) for n in APPS}
        set_cm(As(k8s, ALICE), ns, "2")
        kubelet.allow("canary")
        wait_for(lambda: state(get(kube, ns, "canary")) == "complete", what="wave 1 complete")
        wait_for(lambda: state(get(kube, ns, "b")) == "rolling", what="wave 2 rolling")
        new = _ref(get(kube, ns, "b"))
        assert new != old["b"] and _ref(get(kube, ns, "canary")) == new

        said = _verb(editor, "abort", ns)  # while wave 2's new pod is not Ready
        assert said.startswith(f"aborted configmap/cfg in {ns}") and f"by {user}" in said, said
        stored = get(kube, ns, "cfg", "configmaps")["metadata"]["annotations"]
        acted = Acted.decode(hkey, ns, CFG, stored[ANN_ACTED])
        assert acted is not None and (acted.verb, acted.user) == (Verb.ABORT, user)

        for name in ("canary", "b"):  # taken back to the copy of the content before
            wait_for(
                lambda name=name: state(get(kube, ns, name)) == "failed",
                timeout=60,
                what=f"{name} taken back",
            )
            obj = get(kube, ns, name)
            assert _ref(obj) == old[name], name
            assert sources(obj) == before[name], name
            rolled = record(obj)
            assert rolled["action"] == "undo" and f"aborted by {user}" in rolled["signal"], rolled
            assert set(annotation(obj, ANN_REJECTED) or {}) == {"configmap/cfg"}, name
        wait_event(kube, ns, "c", ABORTED, "Warning")
        said_c = notes(kube, ns, "c", ABORTED)
        assert any("kubectl configpin retry configmap/cfg" in n for n in said_c), said_c
        wait_for(
            lambda: _said(kube, ns) == ("Stalled", "Aborted"), what="the ConfigRollout aborted"
        )
        change = _cr(kube, ns)["status"]["change"]
        assert change["abortedBy"] == user and change["abortedAt"], change
        rows = status(control_plane, ns)
        assert rows["c"]["state"] == "aborted" and user in rows["c"]["reason"], rows["c"]
        wait = ["wait", "configmap/cfg", "-n", ns, "--timeout", "30s"]
        waited = kubectl_configpin(wait, control_plane.kubeconfig)
        assert waited.returncode == 1, waited.stdout + waited.stderr
        kubelet.allow(*APPS)  # (their pods could start now: nothing starts them)
        quiet(kube, ns, {n: before[n] for n in APPS}, 3 * RESYNC)  # no wave 3, no re-roll

        # The aborted content stored again after another change is still aborted.
        set_cm(kube, ns, "3")
        third = _rolled_in_every_wave(kube, ns, "the next change rolled")
        set_cm(kube, ns, "2")
        wait_for(lambda: _said(kube, ns) == ("Stalled", "Aborted"), what="aborted content again")
        quiet(kube, ns, {n: third for n in APPS}, 2 * RESYNC)

        said = _verb(editor, "retry", ns)
        assert said.startswith(f"retried configmap/cfg in {ns}"), said
        wait_for(lambda: sources(get(kube, ns, "canary")) != third, what="retried: wave 1")
        _rolled_in_every_wave(kube, ns, "retried: rolled from the first wave to the end")
        assert all(annotation(get(kube, ns, n), ANN_REJECTED) in (None, {}) for n in APPS)
        wait_for(lambda: _said(kube, ns) == ("Ready", "Delivered"), what="delivered")


def test_abort_in_checksum_mode_follows_wave_1_to_the_end_and_starts_no_wave_2(
    kube: Kube, control_plane: ControlPlane, replicas: Replicas, ns: str, tmp_path: Path
) -> None:
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    with Kubelet(kube, ns) as kubelet:
        before = _world(kube, ns, kubelet, "checksum")
        set_cm(kube, ns, "2")
        wait_for(lambda: state(get(kube, ns, "canary")) == "rolling", what="wave 1 rolling")
        rolled_to = sources(get(kube, ns, "canary"))
        _verb(editor, "abort", ns)
        kubelet.allow(*APPS)
        wait_for(lambda: state(get(kube, ns, "canary")) == "complete", what="wave 1 followed")
        assert sources(get(kube, ns, "canary")) == rolled_to  # (nothing to take back)
        wait_event(kube, ns, "b", ABORTED, "Warning")
        quiet(kube, ns, {n: before[n] for n in ("b", "c", "d")}, 3 * RESYNC)
        wait_for(
            lambda: _said(kube, ns) == ("Stalled", "Aborted"), what="the ConfigRollout aborted"
        )


def test_retry_of_a_failure_held_in_checksum_mode_restarts_it_and_rolls_the_later_waves(
    kube: Kube, control_plane: ControlPlane, replicas: Replicas, ns: str, tmp_path: Path
) -> None:
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    with Kubelet(kube, ns) as kubelet:
        before = _world(kube, ns, kubelet, "checksum", deadline=5)
        set_cm(kube, ns, "2")  # (a node short of memory: the canary's new pod never starts)
        wait_for(lambda: state(get(kube, ns, "canary")) == "failed", timeout=90, what="held")
        assert record(get(kube, ns, "canary"))["action"] == "hold"
        held_at = replicasets(kube, ns, "canary")
        quiet(kube, ns, {n: before[n] for n in ("b", "c", "d")}, 2 * RESYNC)
        kubelet.allow(*APPS)  # (the node has room again: nothing rolls by itself)
        quiet(kube, ns, {n: before[n] for n in ("b", "c", "d")}, 2 * RESYNC)
        assert state(get(kube, ns, "canary")) == "failed"

        _verb(editor, "retry", ns)
        wait_for(lambda: replicasets(kube, ns, "canary") > held_at, what="the canary restarted")
        _rolled_in_every_wave(kube, ns, "retried: the canary, then the later waves")
        wait_for(lambda: _said(kube, ns) == ("Ready", "Delivered"), what="delivered")


def test_retry_after_a_newer_change_rolls_the_newer_change_and_not_the_aborted_one(
    kube: Kube, control_plane: ControlPlane, replicas: Replicas, ns: str, tmp_path: Path
) -> None:
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    with Kubelet(kube, ns) as kubelet:
        _world(kube, ns, kubelet, "snapshot")
        set_cm(kube, ns, "2")
        wait_for(lambda: state(get(kube, ns, "canary")) == "rolling", what="wave 1 rolling")
        aborted = _ref(get(kube, ns, "canary"))
        _verb(editor, "abort", ns)
        wait_for(lambda: state(get(kube, ns, "canary")) == "failed", what="the canary back")
        kubelet.allow(*APPS)
        set_cm(kube, ns, "3")  # a fix, pushed while the abort stands: it rolls
        said = _verb(editor, "retry", ns)  # of the content the source holds now: the fix
        assert "retried configmap/cfg" in said, said
        _rolled_in_every_wave(kube, ns, "the newer change rolled in every wave")
        assert all(_ref(get(kube, ns, n)) != aborted for n in APPS)
        wait_for(lambda: _said(kube, ns) == ("Ready", "Delivered"), what="delivered")
