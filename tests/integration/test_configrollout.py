"""Each change an object: the ConfigRollout configpin publishes for a consumed ConfigMap,
against the real API server and controller-manager (its garbage collector), read the way
users' tools read it: `kubectl get`, `kubectl wait --for=condition=...`, its conditions as
kstatus reads them.

Two configpin replicas of instance `cfgro` run as the chart runs them (one Lease, both webhooks
registered from the chart's own entries, the CRD installed from the chart's crds/), waves
`1,approve,100%`. Nothing runs pods: `Kubelet` marks the allowed apps' pods Ready, as a
kubelet would; a Deployment whose pods are not marked fails by its progress deadline.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from harness.apps import rollout_undo
from harness.configpin import REPO, instance_namespace
from harness.controlplane import ControlPlane, wait_for
from harness.kubelet import Kubelet
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec, secret
from tests.integration.instances import Replicas, replicas_fixtures
from tests.integration.workloads import (
    approve,
    get,
    quiet,
    reader,
    readers_of_cfg,
    replicasets,
    set_cm,
    sources,
    stamped,
    state,
    wait_healthy,
)
from webhook.core.constants import ANN_APPROVED, ANN_HELD, ANN_ROLLOUT_WINDOWS
from webhook.core.rollouts import GROUP, PLURAL, VERSION
from webhook.kube.errors import NotFound
from webhook.kube.raw import MERGE_PATCH, Kube, path

RESYNC = 2.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
    "--lease-duration", "4",
    "--rollout-waves", "1,approve,100%",
]  # fmt: skip
PREFIX = f"/apis/{GROUP}/{VERSION}"
NAME = "configmap-cfg"
APPS = ("a", "b", "c")
# A window that never opens: each day's deny lasts two days. (Its wait reads the same at every
# look, "they do not open within a year": a list that opens somewhere ahead says when, a text
# that moves with the clock and has the hold decided again.)
NEVER_OPEN = json.dumps([{"kind": "deny", "schedule": "0 0 * * *", "duration": "48h"}])

replicas, ns = replicas_fixtures("cfgro", ARGS)


# --- helpers ------------------------------------------------------------------------------


def _cr(kube: Kube, ns: str, name: str = NAME) -> dict[str, Any] | None:
    try:
        return kube.get(path(PLURAL, ns, name, prefix=PREFIX))
    except NotFound:
        return None


def _conditions(obj: dict[str, Any] | None) -> dict[str, tuple[str, str]]:
    status = (obj or {}).get("status") or {}
    return {c["type"]: (c["status"], c.get("reason", "")) for c in status.get("conditions") or []}


def _about_now(kube: Kube, ns: str, obj: dict[str, Any] | None) -> bool:
    """Its status is about the ConfigMap as it stands, and about its own generation."""
    if obj is None:
        return False
    cm = kube.get(path("configmaps", ns, "cfg"))
    source = (obj.get("status") or {}).get("source") or {}
    return (
        source.get("resourceVersion") == cm["metadata"]["resourceVersion"]
        and source.get("uid") == cm["metadata"]["uid"]
        and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]
    )


def _wait_condition(
    kube: Kube,
    ns: str,
    ctype: str,
    reason: str,
    timeout: float = 60,
    members: int | None = None,
    consumers: int | None = None,
) -> dict:
    """The ConfigRollout, once its status about the ConfigMap as it stands says `ctype` True
    with `reason` (and, `members`, says so of that many of its members; `consumers`: counts
    that many)."""
    found: dict[str, Any] = {}

    def says() -> bool:
        obj = _cr(kube, ns)
        if obj is None or not _about_now(kube, ns, obj):
            return False
        found.clear()
        found.update(obj)
        of = [m for m in obj["status"].get("members") or () if m.get("reason") == reason]
        counted = obj["status"].get("counts", {}).get("consumers")
        return (
            _conditions(obj).get(ctype) == ("True", reason)
            and (members is None or len(of) == members)
            and (consumers is None or counted == consumers)
        )

    wait_for(
        says, timeout=timeout, what=f"{NAME} {ctype} True ({reason}): {_conditions(_cr(kube, ns))}"
    )
    return found


def _kubectl(
    plane: ControlPlane, *argv: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(plane.kubeconfig), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _wait_cli(plane: ControlPlane, ns: str, *argv: str) -> subprocess.Popen[str]:
    """`kubectl configpin wait configmap/cfg -n NS ARGV`, started now."""
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
    plugin = str(Path(sys.executable).parent / "kubectl-configpin")
    return subprocess.Popen(
        [plugin, "wait", "configmap/cfg", "-n", ns, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _apps(kube: Kube, ns: str, names: tuple[str, ...] = APPS, deadline: int = 600) -> None:
    readers_of_cfg(kube, ns, names, deadline)


# --- tests --------------------------------------------------------------------------------


def test_a_change_under_approve_is_in_progress_awaiting_approval_then_ready_once_approved(
    kube: Kube, control_plane: ControlPlane, ns: str
) -> None:
    """Three readers of `cfg`, waves 1,approve,100%. Before any change the ConfigRollout is
    Ready. A change: Reconciling (the first wave rolls, then AwaitingApproval with the other
    two waiting in wave 2 of 2), `kubectl wait --for=condition=Ready` times out, `kubectl get`
    shows the wave and 1/3 ready; `kubectl configpin wait`, started the instant the change was
    written, is still waiting. Approved, the wait exits 0 once all three run the new content,
    the ConfigRollout is Ready, `kubectl wait` returns 0, and the change before it is in its
    history."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*APPS)
        _apps(kube, ns)
        wait_healthy(kube, ns, list(APPS))
        before = _wait_condition(kube, ns, "Ready", "Delivered", consumers=3)
        before_apps = kube.get(path("deployments", ns, "a"))
        owner = before["metadata"]["ownerReferences"][0]
        cm = kube.get(path("configmaps", ns, "cfg"))
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "ConfigMap",
            "cfg",
            cm["metadata"]["uid"],
        )

        set_cm(kube, ns, "2")
        cli = _wait_cli(control_plane, ns, "--timeout", "120s")  # (the same instant)
        held = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval", members=2)
        conditions = _conditions(held)
        assert conditions["Ready"][0] == "False" and conditions["Stalled"][0] == "False"
        status = held["status"]
        assert status["change"]["keys"] == ["a"]
        [digests] = status["change"]["keyDigests"]  # (keyed: the old and the new content of a)
        assert digests["key"] == "a" and digests["old"] != digests["new"], digests
        assert all(len(digests[k]) == 16 and int(digests[k], 16) >= 0 for k in ("old", "new"))
        assert status["summary"]["wave"] == "2/2" and status["summary"]["ready"] == "1/3"
        waiting = [m for m in status["members"] if m["state"] == "waiting"]
        assert len(waiting) == 2 and {m["reason"] for m in waiting} == {"AwaitingApproval"}
        assert all(m["wave"] == 2 for m in waiting)
        for m in waiting:  # (what Argo CD's and Flux's health checks read; its template kept)
            held_app = kube.get(path("deployments", ns, m["name"]))
            note = held_app["metadata"]["annotations"][ANN_HELD]
            assert note.startswith("AwaitingApproval: "), note
            assert sources(held_app) == sources(before_apps)
        early = _kubectl(
            control_plane, "wait", "--for=condition=Ready", f"{PLURAL}/{NAME}", "-n", ns,
            "--timeout=3s",
        )  # fmt: skip
        assert early.returncode != 0, early.stdout
        shown = _kubectl(control_plane, "get", "cfgro", "-n", ns)
        assert shown.returncode == 0, shown.stderr
        header, row = shown.stdout.splitlines()[:2]
        assert header.split()[:7] == [
            "NAME",
            "SOURCE",
            "KEYS",
            "WAVE",
            "READY",
            "STATE",
            "CHANGED-BY",
        ]
        assert row.split()[:6] == [NAME, "configmap/cfg", "a", "2/2", "1/3", "AwaitingApproval"]

        time.sleep(2)
        assert cli.poll() is None, cli.communicate()  # (not delivered yet)
        approve(control_plane.kubeconfig, ns)
        out, err = cli.communicate(timeout=120)
        assert cli.returncode == 0, out + err
        assert "configmap/cfg delivered" in out, out
        new = sources(kube.get(path("deployments", ns, "a")))
        for name in APPS:
            notes = kube.get(path("deployments", ns, name))["metadata"].get("annotations") or {}
            assert ANN_HELD not in notes, name
        assert all(sources(kube.get(path("deployments", ns, n))) == new for n in APPS)
        assert new != sources(before_apps)
        done = _kubectl(
            control_plane, "wait", "--for=condition=Ready", f"{PLURAL}/{NAME}", "-n", ns,
            "--timeout=60s",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        ready = _wait_condition(kube, ns, "Ready", "Delivered")
        assert ready["status"]["summary"]["ready"] == "3/3"
        [last] = ready["status"]["history"]
        assert (
            last["outcome"] == "Delivered"
            and last["content"] == before["status"]["change"]["content"]
        )


def test_a_secrets_change_says_each_keys_old_and_new_digests_and_never_a_value(
    kube: Kube, ns: str
) -> None:
    """A reader of Secret `sec` (token, user); its token changed and a key added: the
    Secret's ConfigRollout says each changed key with its old and new digests (16 hex digits;
    the added key has no old one), and no value, old or new, plain or base64, is anywhere in
    the object."""
    values = {"token": "tok-old-7f3a9c", "user": "svc-alpha-41"}
    later = {"token": "tok-new-2c8e1d", "extra": "added-5b7f0a"}
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("s")
        kube.create(path("secrets", ns), secret("sec", values))
        env = [env_key_ref("secret", "sec", k, k.upper()) for k in ("token", "user")]
        kube.create(
            path("deployments", ns), deployment("s", pod_spec(container(env=env)), replicas=1)
        )
        stamped(kube, ns, "s")
        wait_healthy(kube, ns, ["s"])
        kube.patch(path("secrets", ns, "sec"), {"stringData": later}, content_type=MERGE_PATCH)
        found: dict[str, Any] = {}

        def says() -> bool:
            obj = _cr(kube, ns, "secret-sec")
            version = kube.get(path("secrets", ns, "sec"))["metadata"]["resourceVersion"]
            status = (obj or {}).get("status") or {}
            if (status.get("source") or {}).get("resourceVersion") != version:
                return False
            found.update(obj or {})
            return "keyDigests" in (status.get("change") or {})

        wait_for(says, timeout=60, what="secret-sec's ConfigRollout says its keys' digests")
    change = found["status"]["change"]
    assert change["keys"] == ["extra", "token"], change
    extra, token = change["keyDigests"]
    assert extra["key"] == "extra" and "old" not in extra and len(extra["new"]) == 16, extra
    assert token["key"] == "token" and token["old"] != token["new"], token
    assert all(len(token[k]) == 16 and int(token[k], 16) >= 0 for k in ("old", "new"))
    text = json.dumps(found)
    for value in [*values.values(), *later.values()]:
        assert value not in text and base64.b64encode(value.encode()).decode() not in text


def test_a_failing_change_is_stalled(kube: Kube, control_plane: ControlPlane, ns: str) -> None:
    """One reader, its progress deadline 5 s: a change whose pods never get Ready fails, is
    held (checksum mode), and its ConfigRollout says Stalled (Held); `kubectl configpin wait`
    started with the change exits 1, and `kubectl wait --for=condition=Stalled` returns 0."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("a")
        _apps(kube, ns, ("a",), deadline=5)
        wait_healthy(kube, ns, ["a"])
        _wait_condition(kube, ns, "Ready", "Delivered")
    set_cm(kube, ns, "2")  # (no kubelet: its new pods stay Pending)
    failing = _wait_cli(control_plane, ns, "--timeout", "120s")
    stalled = _wait_condition(kube, ns, "Stalled", "Held", timeout=90)
    [member] = stalled["status"]["members"]
    assert (member["name"], member["state"], member["reason"]) == ("a", "failed", "Held")
    out, err = failing.communicate(timeout=60)
    assert failing.returncode == 1, out + err
    said = _kubectl(
        control_plane, "wait", "--for=condition=Stalled", f"{PLURAL}/{NAME}", "-n", ns,
        "--timeout=10s",
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    out, err = _wait_cli(control_plane, ns, "--timeout", "30s").communicate(timeout=60)
    assert "Held" in out + err, out + err


def test_a_forged_status_and_spec_are_written_back(kube: Kube, ns: str) -> None:
    """Someone with write access sets the ConfigRollout's status to Stalled and its spec to
    another source: configpin writes both back, its status about the new generation."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("a")
        _apps(kube, ns, ("a",))
        true = _wait_condition(kube, ns, "Ready", "Delivered")
    forged = {
        **true,
        "status": {
            **true["status"],
            "conditions": [
                {"type": "Stalled", "status": "True", "reason": "Failed", "message": "forged",
                 "lastTransitionTime": "2020-01-01T00:00:00Z"},
            ],
        },
    }  # fmt: skip
    kube.replace(path(PLURAL, ns, NAME, prefix=PREFIX) + "/status", forged)
    wait_for(
        lambda: _conditions(_cr(kube, ns)).get("Ready") == ("True", "Delivered"),
        what="the forged status written back",
    )
    obj = _cr(kube, ns)
    assert obj is not None
    obj["spec"] = {"source": {"kind": "Secret", "name": "other"}}
    kube.replace(path(PLURAL, ns, NAME, prefix=PREFIX), obj)
    again = _wait_condition(kube, ns, "Ready", "Delivered")
    assert again["spec"] == {"source": {"kind": "ConfigMap", "name": "cfg"}}
    assert again["metadata"]["generation"] > true["metadata"]["generation"]


def test_the_source_deleted_takes_its_configrollout(kube: Kube, ns: str) -> None:
    """The garbage collector deletes the ConfigRollout with its ConfigMap (owned by it)."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("a")
        _apps(kube, ns, ("a",))
        _wait_condition(kube, ns, "Ready", "Delivered")
    kube.delete(path("configmaps", ns, "cfg"))
    wait_for(
        lambda: _cr(kube, ns) is None, timeout=60, what="the ConfigRollout deleted with its source"
    )
    time.sleep(3)  # (several resyncs: not made again for a source that is gone)
    assert _cr(kube, ns) is None


def test_a_leader_change_in_the_middle_keeps_the_object_true(
    kube: Kube, control_plane: ControlPlane, replicas: Replicas, ns: str
) -> None:
    """The leader is killed (SIGKILL) while the change awaits approval, and a newer change
    comes while the new leader starts: the ConfigRollout says AwaitingApproval about the
    newer content (the older one in its history), and once approved, Ready."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*APPS)
        _apps(kube, ns)
        wait_healthy(kube, ns, list(APPS))
        _wait_condition(kube, ns, "Ready", "Delivered", consumers=3)
        set_cm(kube, ns, "2")
        second = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval")
        replicas.kill_leader()
        set_cm(kube, ns, "3")  # (a newer change while the leader is new: never the old verdict)
        held = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval")
        # (what it said last of the second content: awaiting approval, or, if the new leader
        # published it before its workers looked, waiting)
        last = held["status"]["history"][0]
        assert last["content"] == second["status"]["change"]["content"]
        assert last["outcome"] in ("AwaitingApproval", "Waiting")
        assert held["status"]["change"]["content"] != last["content"]
        approve(control_plane.kubeconfig, ns)
        ready = _wait_condition(kube, ns, "Ready", "Delivered")
        assert ready["status"]["summary"]["ready"] == "3/3"
        assert all(sources(kube.get(path("deployments", ns, n))) for n in APPS)


def test_a_configrollout_where_another_configpin_acts_is_never_touched(
    kube: Kube, k8s: client.ApiClient, replicas: Replicas
) -> None:
    """A namespace opted in for another configpin (an instance none of this run's serve, so
    that no one else writes there either), with a consumed ConfigMap and a ConfigRollout that
    one published: these replicas watch every ConfigRollout in the cluster and leave that one
    as it is, through several resyncs (it is not theirs to write back or to delete)."""
    with instance_namespace(k8s, f"other-{replicas.instance}", "cfgro-other") as namespace:
        _untouched(kube, namespace)


def _untouched(kube: Kube, namespace: str) -> None:
    kube.create(path("configmaps", namespace), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", namespace), reader("a"))
    theirs = kube.create(
        path(PLURAL, namespace, prefix=PREFIX),
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ConfigRollout",
            "metadata": {"name": NAME},
            "spec": {"source": {"kind": "ConfigMap", "name": "cfg"}},
        },
    )
    time.sleep(3 * 2 + 1)  # (three resyncs)
    now = _cr(kube, namespace)
    assert now is not None
    assert now["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]


def _readme_example() -> tuple[str, list[dict[str, Any]]]:
    """The README's first change: its wait command (the line that runs `configpin wait`), and
    the ConfigMap and Deployment of its YAML blocks (`web-config.yaml`, `web.yaml`)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## A first change, seen working", 1)[1].split("\n## ", 1)[0]
    blocks = [part.split("```", 1)[0] for part in section.split("```yaml")[1:]]
    docs = [d for block in blocks for d in yaml.safe_load_all(block) if d]
    [command] = [line.strip(" -`") for line in section.splitlines() if "configpin wait -f" in line]
    command = command.split("`", 1)[0]
    return command, [d for d in docs if d.get("kind") in ("ConfigMap", "Deployment")]


def test_the_readmes_wait_command_as_written_returns_once_web_runs_the_new_content(
    kube: Kube, control_plane: ControlPlane, ns: str, tmp_path: Path
) -> None:
    """The README's example applied, then its line `kubectl apply -f web-config.yaml &&
    kubectl configpin wait -f web-config.yaml` run as written with a changed log-level: it
    exits 0, and by then `web` holds the new content and its rollout is complete."""
    command, docs = _readme_example()
    assert (
        command == "kubectl apply -f web-config.yaml && kubectl configpin wait -f web-config.yaml"
    )
    cm, dep = (next(d for d in docs if d["kind"] == k) for k in ("ConfigMap", "Deployment"))
    for doc in (cm, dep):  # (the README's namespace is `shop`; the test's its own)
        doc["metadata"].pop("namespace", None)
    env = {
        **os.environ,
        "KUBECONFIG": str(control_plane.kubeconfig),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("web")
        for doc in (cm, dep):
            kube.create(path(f"{doc['kind'].lower()}s", ns), doc)
        before = sources(stamped(kube, ns, "web"))
        wait_healthy(kube, ns, ["web"])
        changed = {
            **cm,
            "metadata": {**cm["metadata"], "namespace": ns},
            "data": {"log-level": "debug"},
        }
        (tmp_path / "web-config.yaml").write_text(yaml.safe_dump(changed))
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=180, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "configmap/web-config delivered" in done.stdout, done.stdout
        web = kube.get(path("deployments", ns, "web"))
        assert sources(web) != before
        assert state(web) == "complete"


def test_a_persons_rollout_undo_of_the_canary_stalls_the_change_as_rolled_back(
    kube: Kube, k8s: client.ApiClient, ns: str
) -> None:
    """Two readers, waves 1,approve,100%: the change rolls the canary, whose new pods never
    get Ready; a person runs `kubectl rollout undo` on it while it rolls. That is their verdict:
    the ConfigRollout says Stalled (RolledBack), its canary failed, and the other waits."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("a", "b")
        readers_of_cfg(kube, ns, ("a", "b"))
        wait_healthy(kube, ns, ["a", "b"])
        _wait_condition(kube, ns, "Ready", "Delivered", consumers=2)
    set_cm(kube, ns, "2")  # (no kubelet now: the canary's new pods stay Pending)
    rolling = _wait_condition(kube, ns, "Reconciling", "Rolling")
    [canary] = [m["name"] for m in rolling["status"]["members"] if m["state"] == "rolling"]
    rollout_undo(k8s, ns, canary)
    stalled = _wait_condition(kube, ns, "Stalled", "RolledBack", timeout=90)
    states = {m["name"]: (m["state"], m.get("reason")) for m in stalled["status"]["members"]}
    assert states[canary] == ("failed", "RolledBack"), states
    [other] = [n for n in ("a", "b") if n != canary]
    assert states[other][0] in ("waiting", "pending"), states


# --- someone else acts in the middle of a change -------------------------------------------


def _held_note(kube: Kube, ns: str, name: str) -> str:
    """Deployment `name`'s configpin.io/held ("" when it carries none)."""
    return str((get(kube, ns, name)["metadata"].get("annotations") or {}).get(ANN_HELD) or "")


def _as_git_says(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    """A GitOps tool re-applies Deployment `name` as Git holds it (Argo CD's `Replace=true`,
    Flux's `force`): a whole-object replace with the reader as it was created, none of
    configpin's annotations on it. What the API server stored."""
    kube.replace(path("deployments", ns, name), reader(name))
    return get(kube, ns, name)


def test_a_gitops_reapply_of_a_workload_held_for_approval_gets_its_held_marker_back(
    kube: Kube, ns: str
) -> None:
    """Two readers, waves 1,approve,100%: the change rolls the canary, and the other awaits
    approval, marked `configpin.io/held`. A GitOps tool re-applies that one as Git says
    (without the marker): the marker comes back, and the change is still held there (its
    template kept, no second ReplicaSet, the ConfigRollout awaiting approval)."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("a", "b")
        _apps(kube, ns, ("a", "b"))
        wait_healthy(kube, ns, ["a", "b"])
        _wait_condition(kube, ns, "Ready", "Delivered", consumers=2)
        set_cm(kube, ns, "2")
        held = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval", members=1)
        [waiting] = [m["name"] for m in held["status"]["members"] if m["state"] == "waiting"]
        wait_for(
            lambda: _held_note(kube, ns, waiting).startswith("AwaitingApproval: "),
            what=f"{waiting} marked held for approval",
        )
        before = sources(get(kube, ns, waiting))

        replaced = _as_git_says(kube, ns, waiting)
        assert ANN_HELD not in (replaced["metadata"].get("annotations") or {})
        assert sources(replaced) == before  # (admission keeps configpin's record)
        wait_for(
            lambda: _held_note(kube, ns, waiting).startswith("AwaitingApproval: "),
            timeout=20,
            what=f"{waiting}'s held marker back after the re-apply",
        )
        quiet(kube, ns, {waiting: before}, 3 * RESYNC)
        still = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval", members=1)
        [member] = [m for m in still["status"]["members"] if m["name"] == waiting]
        assert member["state"] == "waiting", member
        assert _held_note(kube, ns, waiting).startswith("AwaitingApproval: ")
        assert replicasets(kube, ns, waiting) == 1


def test_a_gitops_reapply_of_a_workload_held_for_its_window_gets_its_held_marker_back(
    kube: Kube, k8s: client.ApiClient, replicas: Replicas
) -> None:
    """One reader in a namespace whose rollout window never opens: the change awaits
    the window, marked `configpin.io/held`. A GitOps tool re-applies the Deployment as Git
    says (without the marker): the marker comes back within a few resyncs, and the change is
    still held (its template kept, no second ReplicaSet, the ConfigRollout awaiting the
    window). (The hold is known from memory at each resync and not decided again: the marker
    must come back all the same.)"""
    closed = {ANN_ROLLOUT_WINDOWS: NEVER_OPEN}
    with instance_namespace(k8s, replicas.instance, "cfgro-win", closed) as ns:
        with Kubelet(kube, ns) as kubelet:
            kubelet.allow("a")
            _apps(kube, ns, ("a",))
            wait_healthy(kube, ns, ["a"])
            _wait_condition(kube, ns, "Ready", "Delivered", consumers=1)
        before = sources(get(kube, ns, "a"))
        set_cm(kube, ns, "2")
        _wait_condition(kube, ns, "Reconciling", "AwaitingWindow", members=1)
        wait_for(
            lambda: _held_note(kube, ns, "a").startswith("AwaitingWindow: "),
            what="a marked held for its window",
        )

        replaced = _as_git_says(kube, ns, "a")
        assert ANN_HELD not in (replaced["metadata"].get("annotations") or {})
        assert sources(replaced) == before
        wait_for(
            lambda: _held_note(kube, ns, "a").startswith("AwaitingWindow: "),
            timeout=20,
            what="a's held marker back after the re-apply",
        )
        quiet(kube, ns, {"a": before}, 3 * RESYNC)
        still = _wait_condition(kube, ns, "Reconciling", "AwaitingWindow", members=1)
        [member] = still["status"]["members"]
        assert (member["name"], member["state"]) == ("a", "waiting"), member
        assert _held_note(kube, ns, "a").startswith("AwaitingWindow: ")
        assert replicasets(kube, ns, "a") == 1


def _approved_content(kube: Kube, ns: str) -> str | None:
    """The content configpin recorded as approved on ConfigMap `cfg` (its approval record)."""
    notes = get(kube, ns, "cfg", "configmaps")["metadata"].get("annotations") or {}
    text = notes.get(ANN_APPROVED)
    return json.loads(text).get("content") if text else None


def test_a_second_change_while_the_first_awaits_approval_waits_for_its_own_approval(
    kube: Kube, control_plane: ControlPlane, ns: str
) -> None:
    """Three readers, waves 1,approve,100%: change A rolls the canary, and the other two
    await its approval. A person approves A (`approve` records A's content) and a colleague
    writes change B right after, while wave 2 still waits. The ConfigRollout then describes
    B (its content, about its own generation), its history A with what came of it. A's
    approval does not release B: B's canary rolls it and the other two wait for B's approval
    (they never run B's content before it), and `kubectl configpin wait`, started after B's
    write, is still waiting. Approving B delivers it to all three, and the wait exits 0.

    (Whether the controller acted on A's approval before B's write reached it is the
    machine's race: wave 2 may have started rolling A, which B then supersedes. What is
    asserted holds either way.)"""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*APPS)
        _apps(kube, ns)
        wait_healthy(kube, ns, list(APPS))
        _wait_condition(kube, ns, "Ready", "Delivered", consumers=3)
        set_cm(kube, ns, "2")
        first = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval", members=2)
        change_a = first["status"]["change"]["content"]
        later = sorted(m["name"] for m in first["status"]["members"])  # (not done yet)
        [canary] = [n for n in APPS if n not in later]

        approve(control_plane.kubeconfig, ns)  # (A's content, as the source holds it now)
        set_cm(kube, ns, "3")  # change B, while wave 2 waits
        cli = _wait_cli(control_plane, ns, "--timeout", "180s")
        assert _approved_content(kube, ns) == change_a

        # B's canary rolls it; the others wait for B's approval, not A's
        second = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval", members=2)
        status = second["status"]
        change_b = status["change"]["content"]
        assert change_b != change_a
        assert status["observedGeneration"] == second["metadata"]["generation"]
        last = status["history"][0]
        assert last["content"] == change_a, status["history"]
        assert last["outcome"] in ("AwaitingApproval", "Waiting", "Rolling"), last
        states = {m["name"]: (m["state"], m.get("reason")) for m in status["members"]}
        assert states == {n: ("waiting", "AwaitingApproval") for n in later}, states
        assert status["summary"]["ready"] == "1/3"  # (B's canary, done)
        rolled_b = sources(get(kube, ns, canary))  # (B's content, as its template records it)

        def not_b() -> None:
            moved = [n for n in later if sources(get(kube, ns, n)) == rolled_b]
            assert not moved, f"rolled to B before B was approved: {moved}"

        end = time.monotonic() + 3 * RESYNC
        while time.monotonic() < end:  # (several resyncs: A's approval releases nothing of B)
            not_b()
            time.sleep(0.3)
        held = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval", members=2)
        assert held["status"]["change"]["content"] == change_b
        assert cli.poll() is None, cli.communicate()  # (B is not delivered: still waiting)

        approve(control_plane.kubeconfig, ns)  # B's content
        assert _approved_content(kube, ns) == change_b
        out, err = cli.communicate(timeout=150)
        assert cli.returncode == 0, out + err
        assert "configmap/cfg delivered" in out, out
        assert all(sources(get(kube, ns, n)) == rolled_b for n in APPS)
        ready = _wait_condition(kube, ns, "Ready", "Delivered")
        assert ready["status"]["change"]["content"] == change_b
        assert ready["status"]["summary"]["ready"] == "3/3"
        assert ready["status"]["history"][0]["content"] == change_a


def test_members_scaled_to_zero_while_they_await_approval_await_it_then_leave_the_change(
    kube: Kube, control_plane: ControlPlane, ns: str
) -> None:
    """Three readers, waves 1,approve,100%: the canary runs the change, the two others await
    approval. A person scales both to zero: they still await the approval (no pod, but the
    content is not approved: scaled up again, they would start with it), their templates
    kept. Approved, they are brought to the content without a pod to restart and counted as
    left: the change is Ready, `kubectl configpin wait`, started with the change, exits 0,
    and no template changed twice for the change."""
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*APPS)
        _apps(kube, ns)
        wait_healthy(kube, ns, list(APPS))
        _wait_condition(kube, ns, "Ready", "Delivered", consumers=3)
        before = sources(get(kube, ns, "a"))
        set_cm(kube, ns, "2")
        cli = _wait_cli(control_plane, ns, "--timeout", "180s")
        held = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval", members=2)
        later = sorted(m["name"] for m in held["status"]["members"])
        [canary] = [n for n in APPS if n not in later]
        rolled_to = sources(get(kube, ns, canary))

        for name in later:
            done = _kubectl(control_plane, "scale", f"deployment/{name}", "--replicas=0", "-n", ns)
            assert done.returncode == 0, done.stderr
        wait_for(
            lambda: all(get(kube, ns, n)["status"].get("replicas", 0) == 0 for n in later),
            what=f"{', '.join(later)} scaled to zero",
        )
        quiet(kube, ns, dict.fromkeys(later, before), 3 * RESYNC)
        still = _wait_condition(kube, ns, "Reconciling", "AwaitingApproval", members=2)
        states = {
            m["name"]: (m["state"], m["reason"], m["wave"]) for m in still["status"]["members"]
        }
        assert states == dict.fromkeys(later, ("waiting", "AwaitingApproval", 2)), states
        assert cli.poll() is None, cli.communicate()

        approve(control_plane.kubeconfig, ns)
        out, err = cli.communicate(timeout=120)
        assert cli.returncode == 0, out + err
        assert "configmap/cfg delivered" in out, out
        ready = _wait_condition(kube, ns, "Ready", "Delivered")
        assert ready["status"]["summary"]["ready"] == "3/3"
        rows = [{k: v for k, v in w.items() if k != "wave"} for w in ready["status"]["waves"]]
        assert rows == [{"members": 1, "complete": 1}, {"members": 2, "left": 2}], rows
        now = {n: sources(get(kube, ns, n)) for n in APPS}
        assert now == dict.fromkeys(APPS, rolled_to), now
        assert all(get(kube, ns, n)["spec"]["replicas"] == 0 for n in later)
        quiet(kube, ns, now, 3 * RESYNC)
        assert {n: replicasets(kube, ns, n) for n in APPS} == dict.fromkeys(APPS, 2)
