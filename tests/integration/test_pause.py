"""`kubectl configpin pause` and `resume` against the API server (issue 47, shared/SPEC.md
"Acting on a change"), with both webhooks registered as the chart registers them and two
replicas running as the chart runs them (waves `1,100%`: the canary, then `b` and `c`):

- pause while wave 1 rolls: its rollout is followed to the end, wave 2 does not start; the
  ConfigRollout says Stalled/Paused with who, `configpin status` says `paused` and who, the
  waiting workloads get ConfigRolloutPaused, `configpin wait` exits 1; a person's `kubectl
  rollout restart` of a paused wave-2 workload restarts it, as asked (its pods read the
  source as it is now), but starts no wave: the other member stays; resume: wave 2 rolls;
- a user who may only read the source is refused by the API server, and nothing is recorded;
- a pause of content A holds no change B stored after it, nor A stored again after B
  (admission takes the record away with the write that changes the content);
- a record copied from another source (genuine there) is not believed.

No kubelet: pods stay Pending unless the fake `Kubelet` reports them Ready.
"""

from __future__ import annotations

import json
import time
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
from webhook.core.constants import ANN_ACT, ANN_ACTED, ANN_WAVE
from webhook.core.model import SourceId, SourceKind
from webhook.core.rollouts import GROUP, PLURAL, VERSION
from webhook.core.verbs import Acted, Verb
from webhook.kube.digestkey import read_digest_key
from webhook.kube.errors import NotFound
from webhook.kube.raw import MERGE_PATCH, Kube, path

RESYNC = 2.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
    "--lease-duration", "4",
    "--rollout-waves", "1,100%",
]  # fmt: skip
ALICE = "alice@example.com"
CFG = SourceId(SourceKind.CONFIGMAP, "cfg")
APPS = ("canary", "b", "c")
PAUSED = "ConfigRolloutPaused"

replicas, ns = replicas_fixtures("pause", ARGS)


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


def _world(kube: Kube, ns: str, kubelet: Kubelet) -> dict[str, dict[str, str]]:
    """ConfigMap `cfg` (a: 1), the canary (wave 1) and `b`, `c` (wave 2) reading it, healthy;
    then no more pods made Ready. Their template records."""
    kubelet.allow(*APPS)
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), reader("canary", annotations={ANN_WAVE: "-1"}))
    for name in ("b", "c"):
        kube.create(path("deployments", ns), reader(name))
    before = {n: sources(stamped(kube, ns, n)) for n in APPS}
    wait_healthy(kube, ns, list(APPS))
    kubelet.clear()
    return before


def _notes(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def _verb(kubeconfig: Path, verb: str, ns: str, source: str = "configmap/cfg") -> str:
    done = kubectl_configpin([verb, source, "-n", ns], kubeconfig)
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def _restart(k8s: client.ApiClient, ns: str, name: str) -> None:
    """What `kubectl rollout restart deployment/NAME` does."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {
        "spec": {
            "template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": at}}}
        }
    }
    client.AppsV1Api(k8s).patch_namespaced_deployment(name, ns, body)


def test_pause_in_wave_1_starts_no_wave_2_a_restart_is_no_wave_and_resume_rolls_it(
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
        before = _world(kube, ns, kubelet)
        set_cm(As(k8s, ALICE), ns, "2")
        wait_for(lambda: state(get(kube, ns, "canary")) == "rolling", what="wave 1 started")

        said = _verb(editor, "pause", ns)
        assert said.startswith(f"paused configmap/cfg in {ns}"), said
        assert f"by {user}" in said, said
        stored = _notes(get(kube, ns, "cfg", "configmaps"))
        assert ANN_ACT not in stored  # the request, never stored
        acted = Acted.decode(hkey, ns, CFG, stored[ANN_ACTED])
        assert acted is not None and (acted.verb, acted.user) == (Verb.PAUSE, user), stored

        assert state(get(kube, ns, "canary")) == "rolling"  # (its new pods are not Ready)
        kubelet.allow("canary")  # wave 1's started rollout is followed to the end
        wait_for(
            lambda: state(get(kube, ns, "canary")) == "complete",
            timeout=60,
            what="the canary's rollout followed to the end",
        )
        wait_event(kube, ns, "b", PAUSED, "Normal")
        assert any(user in n and "kubectl configpin resume configmap/cfg" in n
                   for n in notes(kube, ns, "b", PAUSED)), notes(kube, ns, "b", PAUSED)  # fmt: skip
        wait_for(lambda: _said(kube, ns) == ("Stalled", "Paused"), what="the ConfigRollout paused")
        change = _cr(kube, ns)["status"]
        assert change["change"]["pausedBy"] == user and change["change"]["pausedAt"], change
        rows = status(control_plane, ns)
        assert rows["b"]["state"] == "paused" and user in json.dumps(rows["b"]), rows["b"]
        wait = ["wait", "configmap/cfg", "-n", ns, "--timeout", "30s"]
        waited = kubectl_configpin(wait, control_plane.kubeconfig)
        assert waited.returncode == 1, waited.stdout + waited.stderr
        quiet(kube, ns, {n: before[n] for n in ("b", "c")}, 3 * RESYNC)  # no wave 2

        # A person's restart of a paused wave-2 workload: it restarts, as asked, reading the
        # source as it is now; configpin starts no wave for it: `c` stays, still paused.
        kubelet.allow("b", "c")
        _restart(k8s, ns, "b")
        wait_for(lambda: replicasets(kube, ns, "b") == 2, what="the person's restart rolled")
        wait_healthy(kube, ns, ["b"])
        assert sources(get(kube, ns, "b")) == sources(get(kube, ns, "canary"))
        assert record(get(kube, ns, "b")) == {}  # (a person's rollout: not configpin's)
        quiet(kube, ns, {"c": before["c"]}, 3 * RESYNC)
        assert _said(kube, ns) == ("Stalled", "Paused")

        said = _verb(editor, "resume", ns)
        assert said.startswith(f"resumed configmap/cfg in {ns}"), said
        wait_for(lambda: state(get(kube, ns, "c")) == "complete", timeout=60, what="wave 2 rolled")
        assert sources(get(kube, ns, "c")) == sources(get(kube, ns, "canary"))
        wait_for(lambda: _said(kube, ns) == ("Ready", "Delivered"), what="delivered")


def test_a_user_who_may_only_read_the_source_is_refused_and_nothing_is_recorded(
    kube: Kube, control_plane: ControlPlane, replicas: Replicas, ns: str, tmp_path: Path
) -> None:
    viewer = namespace_editor(control_plane, kube, ns, tmp_path, verbs=("get", "list"))
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    held = get(kube, ns, "cfg", "configmaps")
    for verb in ("pause", "resume", "abort", "retry"):
        done = kubectl_configpin([verb, "configmap/cfg", "-n", ns], viewer)
        assert done.returncode == 2, done.stderr + done.stdout
        assert "403" in done.stderr, done.stderr
    after = get(kube, ns, "cfg", "configmaps")
    assert after["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
    assert ANN_ACT not in _notes(after) and ANN_ACTED not in _notes(after), _notes(after)


def test_a_pause_of_content_a_holds_no_change_b_stored_after_it(
    kube: Kube,
    k8s: client.ApiClient,
    control_plane: ControlPlane,
    replicas: Replicas,
    ns: str,
    tmp_path: Path,
) -> None:
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    with Kubelet(kube, ns) as kubelet:
        before = _world(kube, ns, kubelet)
        set_cm(kube, ns, "2")
        wait_for(lambda: state(get(kube, ns, "canary")) == "rolling", what="wave 1 of A")
        _verb(editor, "pause", ns)
        kubelet.allow(*APPS)
        wait_for(lambda: state(get(kube, ns, "canary")) == "complete", what="wave 1 of A done")
        wait_event(kube, ns, "b", PAUSED, "Normal")
        quiet(kube, ns, {n: before[n] for n in ("b", "c")}, 2 * RESYNC)
        a = sources(get(kube, ns, "canary"))
        set_cm(kube, ns, "3")  # change B, after the pause of A: it rolls, every wave
        # (admission took A's record away with the write that changed the content)
        assert ANN_ACTED not in _notes(get(kube, ns, "cfg", "configmaps"))
        b = _all_rolled(kube, ns, a, "change B")
        set_cm(kube, ns, "2")  # A again: a newer change, which the pause of A does not hold
        assert _all_rolled(kube, ns, b, "A again") == a


def _all_rolled(kube: Kube, ns: str, before: dict[str, str], what: str) -> dict[str, str]:
    """The canary re-stamped away from `before`, then every wave rolled what it runs, and the
    ConfigRollout says Delivered: the sources rolled."""
    wait_for(lambda: sources(get(kube, ns, "canary")) != before, what=f"{what}: the canary")
    wanted = sources(get(kube, ns, "canary"))
    wait_for(
        lambda: all(
            state(get(kube, ns, n)) == "complete" and sources(get(kube, ns, n)) == wanted
            for n in APPS
        ),
        timeout=90,
        what=f"{what} rolled in both waves",
    )
    wait_for(lambda: _said(kube, ns) == ("Ready", "Delivered"), what=f"{what} delivered")
    return wanted


def test_a_pause_record_copied_from_another_source_is_not_believed(
    kube: Kube, control_plane: ControlPlane, replicas: Replicas, ns: str, tmp_path: Path
) -> None:
    """`other` holds the very content `cfg` changes to, and is paused by an editor: its record,
    genuine there, copied onto `cfg` once it holds that content pauses nothing."""
    editor = namespace_editor(control_plane, kube, ns, tmp_path)
    with Kubelet(kube, ns) as kubelet:
        _world(kube, ns, kubelet)
        kube.create(path("configmaps", ns), configmap("other", {"a": "2"}))
        _verb(editor, "pause", ns, "configmap/other")
        copied = _notes(get(kube, ns, "other", "configmaps"))[ANN_ACTED]
        set_cm(kube, ns, "2")
        wait_for(lambda: state(get(kube, ns, "canary")) == "rolling", what="wave 1")
        # (in a write of its own: a write that changes the content takes a record away)
        body = {"metadata": {"annotations": {ANN_ACTED: copied}}}
        kube.patch(path("configmaps", ns, "cfg"), body, content_type=MERGE_PATCH)
        assert _notes(get(kube, ns, "cfg", "configmaps"))[ANN_ACTED] == copied
        kubelet.allow(*APPS)
        wait_for(
            lambda: all(state(get(kube, ns, n)) == "complete" for n in APPS),
            timeout=90,
            what="the change rolled in both waves",
        )
        assert not notes(kube, ns, "b", PAUSED)
