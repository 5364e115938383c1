"""The health checks the chart ships for Argo CD (charts/configpin/files/argocd, Lua) and the
`healthCheckExprs` the docs give Flux (CEL), run as those tools run them (harness/health.py:
Lua 5.1 as gopher-lua is, cel-python as kustomize-controller evaluates), on hand-built objects:

- each script keeps Argo CD's built-in verdict (gitops-engine pkg/health) on objects shaped like
  gitops-engine's own fixtures (fixtures/argocd/) and on every branch of its Go code;
- configpin's part, the same in the three scripts, on every branch: the rollout record as
  configpin writes it (webhook.core.record), `configpin.io/held` as the controller writes it
  (webhook.core.rollouts.held_text), what is not either, and Argo CD's sandbox without
  `useOpenLibs`;
- the CEL of docs/gitops.md (the same in docs/configrollouts.md) on every branch of each kind;
- the recipes the docs give build the argocd-cm keys from the chart's files, and the chart
  renders nothing for Argo CD.
"""

from __future__ import annotations

import copy
import itertools
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import chart
from harness.health import (
    ARGOCD_CHECKS,
    KINDS,
    HealthError,
    argocd_check,
    argocd_health,
    documented_flux_exprs,
    fenced,
    flux_health,
    lua_runtime,
)
from webhook.core.model import SourceId, SourceKind
from webhook.core.record import Action, Change, RolloutRecord, State

REPO = Path(__file__).resolve().parents[3]
ARGOCD = ARGOCD_CHECKS
FIXTURES = Path(__file__).parent / "fixtures" / "argocd"
ROLLOUT, HELD = "configpin.io/rollout", "configpin.io/held"
# what argocd-cm holds: each kind's health key, the chart's file for it, and its useOpenLibs
HEALTH_KEYS = {
    f"resource.customizations.health.apps_{k}": f"charts/configpin/files/argocd/health-apps_{k}.lua"
    for k in KINDS
}
LIBS_KEYS = {f"resource.customizations.useOpenLibs.apps_{k}": "true" for k in KINDS}


def lua(kind: str) -> str:
    return argocd_check(kind)


def flux_exprs(page: str = "gitops.md") -> list[dict[str, str]]:
    return documented_flux_exprs(page)


# --- objects -------------------------------------------------------------------------------


def deployment(
    *,
    replicas: int | None = 1,
    generation: int = 3,
    observed: int | None = 3,
    total: int | None = None,
    updated: int | None = None,
    available: int | None = None,
    progressing: str | None = "NewReplicaSetAvailable",
    paused: bool = False,
) -> dict[str, Any]:
    """A Deployment as the API server returns it; counts default to `replicas` (all rolled)."""
    n = replicas or 0
    status: dict[str, Any] = {}
    if observed is not None:
        status["observedGeneration"] = observed
    for key, value in (
        ("replicas", total),
        ("updatedReplicas", updated),
        ("readyReplicas", available),
        ("availableReplicas", available),
    ):
        count = n if value is None else value
        if count:  # (the API server leaves out a count of 0)
            status[key] = count
    if progressing is not None:
        status["conditions"] = [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {
                "type": "Progressing",
                "status": "False" if progressing == "ProgressDeadlineExceeded" else "True",
                "reason": progressing,
            },
        ]
    spec: dict[str, Any] = {"progressDeadlineSeconds": 600}
    if replicas is not None:
        spec["replicas"] = replicas
    if paused:
        spec["paused"] = True
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "generation": generation},
        "spec": spec,
        "status": status,
    }


def statefulset(
    *,
    replicas: int | None = 3,
    generation: int = 2,
    observed: int | None = 2,
    ready: int | None = None,
    updated: int | None = None,
    current: int | None = None,
    strategy: str | None = "RollingUpdate",
    partition: int | None = 0,
    rolling_update: bool = True,
    revisions: tuple[str, str] = ("db-7b8f75b98", "db-7b8f75b98"),
) -> dict[str, Any]:
    """A StatefulSet as the API server returns it; counts default to `replicas`."""
    n = replicas or 0
    status: dict[str, Any] = {"currentRevision": revisions[0], "updateRevision": revisions[1]}
    if observed is not None:
        status["observedGeneration"] = observed
    for key, value in (
        ("replicas", None),
        ("readyReplicas", ready),
        ("updatedReplicas", updated),
        ("currentReplicas", current),
    ):
        count = n if value is None else value
        if count:
            status[key] = count
    update: dict[str, Any] = {}
    if strategy is not None:
        update["type"] = strategy
    if strategy == "RollingUpdate" and rolling_update:
        update["rollingUpdate"] = {} if partition is None else {"partition": partition}
    spec: dict[str, Any] = {"serviceName": "db", "updateStrategy": update}
    if replicas is not None:
        spec["replicas"] = replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "shop", "generation": generation},
        "spec": spec,
        "status": status,
    }


def daemonset(
    *,
    desired: int = 2,
    generation: int = 5,
    observed: int | None = 5,
    updated: int | None = None,
    available: int | None = None,
    strategy: str = "RollingUpdate",
) -> dict[str, Any]:
    """A DaemonSet as the API server returns it; counts default to `desired`."""
    status: dict[str, Any] = {
        "currentNumberScheduled": desired,
        "desiredNumberScheduled": desired,
        "numberMisscheduled": 0,
        "numberReady": desired if available is None else available,
    }
    if observed is not None:
        status["observedGeneration"] = observed
    for key, value in (("updatedNumberScheduled", updated), ("numberAvailable", available)):
        count = desired if value is None else value
        if count:
            status[key] = count
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "shop", "generation": generation},
        "spec": {"updateStrategy": {"type": strategy}},
        "status": status,
    }


BUILDERS: dict[str, Callable[..., dict[str, Any]]] = {
    "Deployment": deployment,
    "StatefulSet": statefulset,
    "DaemonSet": daemonset,
}


def annotated(obj: Mapping[str, Any], **annotations: Any) -> dict[str, Any]:
    """`obj` with these annotations on its own metadata (`rollout`, `held` name configpin's)."""
    out = copy.deepcopy(dict(obj))
    names = {"rollout": ROLLOUT, "held": HELD}
    notes = out["metadata"].setdefault("annotations", {})
    for key, value in annotations.items():
        notes[names.get(key, key)] = value
    return out


def record(state: State, signal: str = "", action: Action | None = None, by: str = "") -> str:
    """A rollout record's text, as configpin writes it (signed, canonical JSON)."""
    sid = SourceId(SourceKind.CONFIGMAP, "cfg")
    return RolloutRecord(
        state=state,
        to={str(sid): "a" * 64},
        before={str(sid): "b" * 64},
        since=1764000000.0,
        changes=(Change("shop", sid, "0123456789"),),
        refs={"configmap/cfg-0123456789": "configmap/cfg/cfg-9876543210"},
        template="f" * 32,
        signal=signal,
        action=action,
        by=by or "alice at 2026-01-01T00:00:00Z",
        generation=3,
    ).encode(b"k" * 32, "Deployment/shop/web")


DEADLINE = 'its progress deadline (5 s) passed: ReplicaSet "web-6d4f" has timed out progressing.'


# --- Argo CD's built-in verdict ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("deployment-healthy", "Healthy"),
        ("deployment-progressing", "Progressing"),
        ("deployment-suspended", "Suspended"),
        ("deployment-degraded", "Degraded"),
        ("statefulset", "Healthy"),
        ("statefulset-ondelete", "Healthy"),
        ("daemonset-ondelete", "Healthy"),
    ],
)
def test_gitops_engines_fixtures_keep_their_verdicts(fixture: str, expected: str) -> None:
    """What gitops-engine's health_test.go expects of each fixture, with and without the
    string library (no configpin annotation: the script never needs it)."""
    obj = yaml.safe_load((FIXTURES / f"{fixture}.yaml").read_text())
    assert argocd_health(lua(obj["kind"]), obj)[0] == expected
    assert argocd_health(lua(obj["kind"]), obj, open_libs=False)[0] == expected


WAIT = "Waiting for rollout to finish: "
DEPLOYMENT_CASES = [
    ("paused", deployment(paused=True, updated=0), "Suspended", "Deployment is paused"),
    (
        "generation not observed",
        deployment(observed=2),
        "Progressing",
        WAIT + "observed deployment generation less than desired generation",
    ),
    ("no status yet", deployment(observed=None, progressing=None, total=0, updated=0,
                                 available=0), "Progressing", None),
    (
        "progress deadline exceeded",
        deployment(progressing="ProgressDeadlineExceeded", updated=0, total=2),
        "Degraded",
        'Deployment "web" exceeded its progress deadline',
    ),
    (
        "not all updated",
        deployment(replicas=3, updated=1, progressing="ReplicaSetUpdated"),
        "Progressing",
        WAIT + "1 out of 3 new replicas have been updated...",
    ),
    (
        "old replicas pending termination",
        deployment(replicas=2, total=3),
        "Progressing",
        WAIT + "1 old replicas are pending termination...",
    ),
    (
        "updated not all available",
        deployment(replicas=2, available=1),
        "Progressing",
        WAIT + "1 of 2 updated replicas are available...",
    ),
    ("rolled out", deployment(replicas=2), "Healthy", ""),
    ("scaled to zero", deployment(replicas=0), "Healthy", ""),
    ("no replicas field: not compared", deployment(replicas=None), "Healthy", ""),
    ("no conditions", deployment(progressing=None), "Healthy", ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "status", "message"),
    [c[1:] for c in DEPLOYMENT_CASES],
    ids=[c[0] for c in DEPLOYMENT_CASES],
)
def test_the_deployment_script_says_what_gitops_engine_says(
    obj: dict[str, Any], status: str, message: str | None
) -> None:
    said = argocd_health(lua("Deployment"), obj)
    assert said[0] == status
    if message is not None:
        assert said[1] == message


def test_the_first_progressing_condition_is_the_one_read() -> None:
    """gitops-engine looks at the first condition of type Progressing only."""
    obj = deployment()
    obj["status"]["conditions"].append(
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    )
    assert argocd_health(lua("Deployment"), obj)[0] == "Healthy"


STATEFULSET_CASES = [
    ("never observed", statefulset(observed=None), "Progressing",
     "Waiting for statefulset spec update to be observed..."),
    ("never observed, no generation", statefulset(observed=None, generation=0), "Progressing",
     "Waiting for statefulset spec update to be observed..."),
    ("generation not observed", statefulset(observed=1), "Progressing",
     "Waiting for statefulset spec update to be observed..."),
    ("not all ready", statefulset(ready=1), "Progressing", "Waiting for 2 pods to be ready..."),
    ("partition not reached", statefulset(partition=1, updated=1), "Progressing",
     "Waiting for partitioned roll out to finish: 1 out of 2 new pods have been updated..."),
    ("partition reached", statefulset(partition=1, updated=2), "Healthy",
     "partitioned roll out complete: 2 new pods have been updated..."),
    ("rolling update, no partition", statefulset(partition=None, updated=1), "Healthy",
     "partitioned roll out complete: 1 new pods have been updated..."),
    ("rolled out, partition 0", statefulset(), "Healthy",
     "partitioned roll out complete: 3 new pods have been updated..."),
    ("OnDelete", statefulset(strategy="OnDelete", updated=0), "Healthy",
     "statefulset has 3 ready pods"),
    ("no strategy, revisions differ", statefulset(strategy=None, revisions=("db-1", "db-2"),
                                                  updated=1), "Progressing",
     "waiting for statefulset rolling update to complete 1 pods at revision db-2..."),
    ("no strategy, one revision", statefulset(strategy=None), "Healthy",
     "statefulset rolling update complete 3 pods at revision db-7b8f75b98..."),
    ("RollingUpdate without rollingUpdate, revisions differ",
     statefulset(rolling_update=False, revisions=("db-1", "db-2")), "Progressing",
     "waiting for statefulset rolling update to complete 3 pods at revision db-2..."),
    ("no replicas field: not compared", statefulset(replicas=None, partition=1), "Healthy",
     "partitioned roll out complete: 0 new pods have been updated..."),
]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "status", "message"),
    [c[1:] for c in STATEFULSET_CASES],
    ids=[c[0] for c in STATEFULSET_CASES],
)
def test_the_statefulset_script_says_what_gitops_engine_says(
    obj: dict[str, Any], status: str, message: str
) -> None:
    assert argocd_health(lua("StatefulSet"), obj) == (status, message)


DAEMONSET_CASES = [
    ("generation not observed", daemonset(observed=4), "Progressing",
     "Waiting for rollout to finish: observed daemon set generation less than desired generation"),
    ("OnDelete", daemonset(strategy="OnDelete", updated=0), "Healthy",
     "daemon set 0 out of 2 new pods have been updated"),
    ("not all updated", daemonset(updated=1), "Progressing",
     'Waiting for daemon set "agent" rollout to finish: 1 out of 2 new pods have been updated...'),
    ("not all available", daemonset(available=1), "Progressing",
     'Waiting for daemon set "agent" rollout to finish: 1 of 2 updated pods are available...'),
    ("rolled out", daemonset(), "Healthy", ""),
    ("no node to run on", daemonset(desired=0), "Healthy", ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "status", "message"),
    [c[1:] for c in DAEMONSET_CASES],
    ids=[c[0] for c in DAEMONSET_CASES],
)
def test_the_daemonset_script_says_what_gitops_engine_says(
    obj: dict[str, Any], status: str, message: str
) -> None:
    assert argocd_health(lua("DaemonSet"), obj) == (status, message)


# --- configpin's part -----------------------------------------------------------------------

FAILED = "configpin: config rollout failed"
IN_PROGRESS = "configpin: config rollout in progress"
APPROVAL = "AwaitingApproval: wave 2 of 2 waits for `kubectl configpin approve configmap/cfg`"
# (id, annotations, Argo CD status, its message, Flux) on a workload otherwise rolled out
CONFIGPIN_CASES = [
    ("nothing of configpin's", {}, "Healthy", None, "current"),
    ("other annotations only", {"team": "shop"}, "Healthy", None, "current"),
    ("rollout complete", {"rollout": record(State.COMPLETE)}, "Healthy", None, "current"),
    ("rollout left", {"rollout": record(State.LEFT)}, "Healthy", None, "current"),
    ("rolling", {"rollout": record(State.ROLLING)}, "Progressing", IN_PROGRESS, "inProgress"),
    ("failed and held", {"rollout": record(State.FAILED, DEADLINE, Action.HOLD)}, "Degraded",
     f"{FAILED}: {DEADLINE} (hold)", "failed"),
    ("failed and undone", {"rollout": record(State.FAILED, "3 restarts", Action.UNDO)},
     "Degraded", f"{FAILED}: 3 restarts (undo)", "failed"),
    ("failed, no action", {"rollout": record(State.FAILED, "x", Action.NONE)}, "Degraded",
     f"{FAILED}: x (none)", "failed"),
    ("rolled back by a person",
     {"rollout": record(State.FAILED, "rolled back by a person", Action.PERSON)}, "Degraded",
     f"{FAILED}: rolled back by a person (rolled-back-by-person)", "failed"),
    ("failed, no signal nor action", {"rollout": record(State.FAILED)}, "Degraded", FAILED,
     "failed"),
    ("awaiting approval", {"held": APPROVAL}, "Progressing",
     "configpin: wave 2 of 2 waits for `kubectl configpin approve configmap/cfg`", "inProgress"),
    ("awaiting a window", {"held": "AwaitingWindow: opens at 2026-01-02T22:00:00Z"},
     "Progressing", "configpin: opens at 2026-01-02T22:00:00Z", "inProgress"),
    ("flapping", {"held": "Flapping: 6 rollouts in 1h; again at 2026-01-02T10:00:00Z"},
     "Progressing", "configpin: 6 rollouts in 1h; again at 2026-01-02T10:00:00Z",
     "inProgress"),
    ("paused by a person", {"held": "Paused: paused by alice"}, "Suspended",
     "configpin: paused by alice", "current"),
    ("aborted by a person", {"held": "Aborted: aborted by alice"}, "Degraded",
     "configpin: aborted by alice", "failed"),
    ("paused while rolling", {"held": "Paused: paused by alice",
                              "rollout": record(State.ROLLING)}, "Suspended",
     "configpin: paused by alice", "inProgress"),
    ("held after an earlier failure", {"held": APPROVAL,
                                       "rollout": record(State.FAILED, "x", Action.HOLD)},
     "Degraded", f"{FAILED}: x (hold)", "failed"),
    ("held after a rollout that completed", {"held": APPROVAL,
                                             "rollout": record(State.COMPLETE)},
     "Progressing", "configpin: wave 2 of 2", "inProgress"),
    ("rolling and held", {"held": APPROVAL, "rollout": record(State.ROLLING)}, "Progressing",
     IN_PROGRESS, "inProgress"),
    ("held, a reason not known", {"held": "Waiting: for the cap"}, "Progressing",
     "configpin: for the cap", "inProgress"),
    ("held, no words", {"held": "AwaitingApproval:"}, "Progressing",
     "configpin: AwaitingApproval", "inProgress"),
    ("held, not REASON: words", {"held": "held for a reason"}, "Progressing",
     "configpin: held for a reason", "inProgress"),
    ("a record that is not JSON", {"rollout": "rolling"}, "Healthy", None, "current"),
    ("a record with no state", {"rollout": '{"signal":"x"}'}, "Healthy", None, "current"),
    ("a state that is not a string", {"rollout": '{"state":1}'}, "Healthy", None, "current"),
    ("an unterminated state", {"rollout": '{"state":"fail'}, "Healthy", None, "current"),
    ("another field's words", {"rollout": record(
        State.COMPLETE, by='mallory","state":"failed" at 2026-01-01T00:00:00Z')}, "Healthy",
     None, "current"),
]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("annotations", "status", "message", "flux"),
    [c[1:] for c in CONFIGPIN_CASES],
    ids=[c[0] for c in CONFIGPIN_CASES],
)
def test_configpins_part_on_a_rolled_out_workload(
    kind: str, annotations: dict[str, str], status: str, message: str | None, flux: str
) -> None:
    """What configpin says, on a workload whose own rollout is done, in Argo CD (status and
    message; None: the built-in's) and in Flux."""
    obj = annotated(BUILDERS[kind](), **annotations)
    said = argocd_health(lua(kind), obj)
    assert said[0] == status
    if message is None:
        assert said == argocd_health(lua(kind), BUILDERS[kind]())
    else:
        assert said[1].startswith(message), said
    assert flux_health(flux_exprs(), obj) == flux


@pytest.mark.parametrize(
    ("obj", "annotations", "status", "message"),
    [
        # the built-in Degraded before anything configpin says but its failure
        (deployment(progressing="ProgressDeadlineExceeded"), {"rollout": record(State.ROLLING)},
         "Degraded", 'Deployment "web" exceeded'),
        (deployment(progressing="ProgressDeadlineExceeded"), {"held": APPROVAL}, "Degraded",
         'Deployment "web" exceeded'),
        (deployment(progressing="ProgressDeadlineExceeded"),
         {"rollout": record(State.FAILED, DEADLINE, Action.HOLD)}, "Degraded", FAILED),
        # paused: Suspended, before configpin rolling; configpin's failure first
        (deployment(paused=True), {"rollout": record(State.ROLLING)}, "Suspended",
         "Deployment is paused"),
        (deployment(paused=True), {"held": "Paused: by alice"}, "Suspended",
         "Deployment is paused"),
        (deployment(paused=True), {"rollout": record(State.FAILED, "x", Action.HOLD)},
         "Degraded", FAILED),
        # configpin rolling or holding before the built-in Progressing
        (deployment(replicas=2, updated=1), {"rollout": record(State.ROLLING)}, "Progressing",
         IN_PROGRESS),
        (deployment(replicas=2, updated=1), {"held": APPROVAL}, "Progressing",
         "configpin: wave 2"),
        (deployment(replicas=2, updated=1), {"held": "Paused: by alice"}, "Suspended",
         "configpin: by alice"),
        (deployment(replicas=2, updated=1), {"rollout": record(State.COMPLETE)}, "Progressing",
         WAIT),
        (statefulset(ready=1), {"rollout": record(State.ROLLING)}, "Progressing", IN_PROGRESS),
        (statefulset(ready=1), {"rollout": record(State.FAILED, "x", Action.HOLD)}, "Degraded",
         FAILED),
        (daemonset(updated=1), {"held": APPROVAL}, "Progressing", "configpin: wave 2"),
        (daemonset(updated=1), {"rollout": record(State.LEFT)}, "Progressing",
         'Waiting for daemon set "agent"'),
    ],
)  # fmt: skip
def test_the_most_urgent_wins(
    obj: dict[str, Any], annotations: dict[str, str], status: str, message: str
) -> None:
    said = argocd_health(lua(obj["kind"]), annotated(obj, **annotations))
    assert said[0] == status and said[1].startswith(message), said


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "signal",
    [
        DEADLINE,
        'a "quoted" \\ back\\slash, a / slash',
        "two\nlines\tand a tab",
        "a control \x01 character",
        "caf\u00e9 \u2014 beyond ASCII",
        "",
    ],
)
def test_the_signal_reads_as_configpin_wrote_it(kind: str, signal: str) -> None:
    """The record's JSON escapes (orjson's: quotes, backslashes, control characters as \\n,
    \\t or \\u00XX; anything else as it is) are read back."""
    obj = annotated(BUILDERS[kind](), rollout=record(State.FAILED, signal, Action.HOLD))
    expected = f"{FAILED}: {signal} (hold)" if signal else f"{FAILED} (hold)"
    assert argocd_health(lua(kind), obj) == ("Degraded", expected)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "metadata",
    [
        {"annotations": {ROLLOUT: 5, HELD: 1}},
        {"annotations": {ROLLOUT: {"state": "failed"}, HELD: ["Paused: x"]}},
        {"annotations": {ROLLOUT: True, HELD: False}},
        {"annotations": ["not", "a", "map"]},
        {"annotations": "not a map"},
        {"annotations": None},
        "not a map",
        None,
    ],
    ids=str,
)
def test_what_is_not_configpins_is_left_alone(kind: str, metadata: Any) -> None:
    """Values of the wrong type where the annotations are: the built-in verdict, no error."""
    base = BUILDERS[kind]()
    obj = {**base, "metadata": metadata}
    if isinstance(metadata, dict) and metadata.get("annotations") is None:
        expected = argocd_health(lua(kind), {**base, "metadata": {}})
    else:
        expected = argocd_health(lua(kind), {**base, "metadata": {"generation": 0}})
    assert argocd_health(lua(kind), obj) == expected


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"metadata": {"annotations": {ROLLOUT: record(State.ROLLING)}}},
        {"spec": "x", "status": 3},
        {"status": {"conditions": "x", "replicas": "2", "observedGeneration": "1"}},
        {"spec": {"updateStrategy": "x", "replicas": "3"}, "status": {"conditions": [1, "x"]}},
    ],
    ids=str,
)
def test_missing_and_odd_fields_never_error(kind: str, obj: dict[str, Any]) -> None:
    status, _ = argocd_health(lua(kind), {"apiVersion": "apps/v1", "kind": kind, **obj})
    assert status in ("Healthy", "Progressing")


@pytest.mark.parametrize("kind", KINDS)
def test_held_reads_as_the_controller_writes_it(kind: str) -> None:
    """`configpin.io/held` made by the controller's own function, for each wait it holds a
    workload for: Progressing, with its words; a person's pause: Suspended (and, for Flux, as
    the workload itself is); a person's abort: Degraded (Flux: failed)."""
    from webhook.core.rollouts import HELD as HELD_WAITS
    from webhook.core.rollouts import held_text
    from webhook.core.waves import Wait, WaitReason

    for reason in HELD_WAITS:
        why = f"waits ({reason.value}) until 2026-01-02T22:00:00Z"
        text = held_text(Wait(reason, why))
        assert text is not None
        obj = annotated(BUILDERS[kind](), held=text)
        paused, aborted = reason is WaitReason.PAUSED, reason is WaitReason.ABORTED
        health = "Suspended" if paused else "Degraded" if aborted else "Progressing"
        assert argocd_health(lua(kind), obj) == (health, f"configpin: {why}")
        flux = flux_health(flux_exprs(), BUILDERS[kind]()) if paused else "inProgress"
        flux = "failed" if aborted else flux
        assert flux_health(flux_exprs(), obj) == flux


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "annotations",
    [{"rollout": record(State.FAILED, "x", Action.HOLD)}, {"held": APPROVAL}],
    ids=["record", "held"],
)
def test_without_useopenlibs_the_builtin_verdict_says_what_is_missing(
    kind: str, annotations: dict[str, str]
) -> None:
    """Argo CD's sandbox for a custom check without useOpenLibs has no string library: where
    configpin's annotations are, the script says the built-in verdict and names the setting,
    instead of erroring (which Argo CD would show as Unknown)."""
    with pytest.raises(Exception, match="attempt to index global 'string'"):
        lua_runtime(open_libs=False).execute("return string.find('a', 'a')")
    with pytest.raises(Exception, match="attempt to index"):
        lua_runtime(open_libs=False).execute("return ('a'):find('a')")
    for base, status in (
        (BUILDERS[kind](), "Healthy"),
        (BUILDERS[kind](observed=1), "Progressing"),
    ):
        said = argocd_health(lua(kind), annotated(base, **annotations), open_libs=False)
        assert said[0] == status
        assert f'resource.customizations.useOpenLibs.apps_{kind}: "true"' in said[1], said


def _part(text: str, begin: str, end: str | None) -> str:
    head = text.index(begin)
    return text[head : text.index(end, head) if end else None]


def test_the_three_scripts_share_configpins_part() -> None:
    """configpin's part and the verdict are one text, in each file (Argo CD has no include)."""
    texts = [lua(kind) for kind in KINDS]
    parts = {_part(t, "-- >>> configpin's part", "-- <<< configpin's part") for t in texts}
    verdicts = {_part(t, "-- >>> the verdict", None) for t in texts}
    assert len(parts) == 1 and len(verdicts) == 1
    for kind, text in zip(KINDS, texts, strict=True):
        assert f"resource.customizations.health.apps_{kind}," in text.splitlines()[1]
        assert f"gitops-engine pkg/health/health_{kind.lower()}.go" in text


def test_a_script_that_errors_or_answers_nonsense_is_what_argo_cd_says_it_is() -> None:
    """The harness reads `hs` as Argo CD does."""
    assert argocd_health('hs = {status = "Fine"}; return hs', {}) == (
        "Unknown",
        "Lua returned an invalid health status",
    )
    with pytest.raises(HealthError, match="expect table output"):
        argocd_health('return "Healthy"', {})
    with pytest.raises(HealthError, match="errors"):
        argocd_health("return obj.metadata.name.x", {})
    # (arrays from 1, numbers as Lua numbers: as Argo CD decodes the object's JSON)
    said = argocd_health(
        'return {status = (obj.list[1] == "a" and #obj.list == 2) and "Healthy" or "Degraded",'
        " message = tostring(obj.n)}",
        {"list": ["a", "b"], "n": 2},
    )
    assert said == ("Healthy", "2")


# --- Flux's CEL -----------------------------------------------------------------------------


def test_both_pages_give_flux_the_same_expressions() -> None:
    exprs = flux_exprs()
    assert flux_exprs("configrollouts.md") == exprs
    assert [(e["apiVersion"], e["kind"]) for e in exprs] == [("apps/v1", k) for k in KINDS]
    assert all(set(e) == {"apiVersion", "kind", "inProgress", "failed", "current"} for e in exprs)


FLUX_CASES = [
    ("Deployment rolled out", deployment(), "current"),
    ("Deployment generation not observed", deployment(observed=2), "inProgress"),
    ("Deployment never observed", deployment(observed=None), "inProgress"),
    ("Deployment not all updated", deployment(replicas=3, updated=2), "inProgress"),
    ("Deployment old replicas pending termination", deployment(total=2), "inProgress"),
    ("Deployment not all available", deployment(replicas=2, available=1), "inProgress"),
    ("Deployment scaled to zero", deployment(replicas=0), "current"),
    ("Deployment progress deadline exceeded",
     deployment(progressing="ProgressDeadlineExceeded", updated=0), "failed"),
    ("Deployment with no conditions", deployment(progressing=None), "current"),
    ("Deployment with a condition without a reason",
     {**deployment(), "status": {**deployment()["status"],
                                 "conditions": [{"type": "Progressing", "status": "True"}]}},
     "current"),
    ("Deployment paused, rolled out", deployment(paused=True), "current"),
    ("Deployment held Paused, not rolled out",
     annotated(deployment(replicas=2, updated=1), held="Paused: by alice"), "inProgress"),
    ("StatefulSet rolled out", statefulset(), "current"),
    ("StatefulSet generation not observed", statefulset(observed=1), "inProgress"),
    ("StatefulSet not all ready", statefulset(ready=2), "inProgress"),
    ("StatefulSet not all updated", statefulset(updated=2), "inProgress"),
    ("StatefulSet partition reached", statefulset(partition=2, updated=1), "current"),
    ("StatefulSet partition not reached", statefulset(partition=1, updated=1), "inProgress"),
    ("StatefulSet rollingUpdate without partition", statefulset(partition=None), "current"),
    ("StatefulSet OnDelete, not all ready", statefulset(strategy="OnDelete", ready=1,
                                                        updated=0), "current"),
    ("DaemonSet rolled out", daemonset(), "current"),
    ("DaemonSet generation not observed", daemonset(observed=4), "inProgress"),
    ("DaemonSet not all updated", daemonset(updated=1), "inProgress"),
    ("DaemonSet not all available", daemonset(available=1), "inProgress"),
    ("DaemonSet on no node", daemonset(desired=0), "current"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "expected"), [c[1:] for c in FLUX_CASES], ids=[c[0] for c in FLUX_CASES]
)
def test_flux_keeps_its_own_readiness(obj: dict[str, Any], expected: str) -> None:
    """kstatus's readiness of each kind (which these expressions take the place of), with
    nothing of configpin's on the workload but what the case says."""
    assert flux_health(flux_exprs(), obj) == expected


def test_flux_says_nothing_of_other_kinds_and_errors_on_a_missing_field() -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generation": 1}}
    assert flux_health(flux_exprs(), other) is None
    bare = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"generation": 1}}
    with pytest.raises(HealthError):  # (has(status.x) with no status: Flux waits, as here)
        flux_health(flux_exprs(), bare)
    group_only = [{"apiVersion": "apps/v1", "current": "true"}]
    assert flux_health(group_only, deployment(observed=1)) == "inProgress"
    assert flux_health(group_only, {**deployment(), "status": {}}) == "current"


# --- what the docs tell an operator to run ----------------------------------------------------


def _argv(block: str) -> list[str]:
    return shlex.split(block.replace("\\\n", " "))


def test_the_kubectl_recipe_builds_each_key_from_its_file() -> None:
    """The argocd-cm patch names each kind's file under its health key, and its useOpenLibs;
    tests/integration/test_gitops_health.py runs it against an API server."""
    block = fenced("gitops.md", "sh", "kubectl patch configmap argocd-cm")
    assert block.startswith("kubectl patch configmap argocd-cm -n argocd --type merge -p")
    inner = _argv(block.split('"$(', 1)[1].rsplit(')"', 1)[0])
    assert inner[:5] == ["kubectl", "create", "configmap", "argocd-cm", "--dry-run=client"]
    files = dict(a.removeprefix("--from-file=").split("=", 1) for a in inner if "file=" in a)
    literals = dict(
        a.removeprefix("--from-literal=").split("=", 1) for a in inner if "literal=" in a
    )
    assert files == HEALTH_KEYS
    assert literals == LIBS_KEYS
    assert all((REPO / p).is_file() for p in files.values())


def test_the_helm_recipe_sets_the_same_keys_under_configs_cm() -> None:
    block = fenced("gitops.md", "sh", "helm upgrade argocd")
    argv = _argv(block)
    assert argv[:3] == ["helm", "upgrade", "argocd"]
    sets: dict[str, dict[str, str]] = {"--set-file": {}, "--set-string": {}}
    for flag, value in itertools.pairwise(argv):
        if flag in sets:
            key, path = value.split("=", 1)
            assert key.startswith("configs.cm."), key
            sets[flag][key.removeprefix("configs.cm.").replace("\\.", ".")] = path
    assert sets["--set-file"] == HEALTH_KEYS
    assert sets["--set-string"] == LIBS_KEYS


def test_the_chart_ships_the_checks_and_renders_nothing_for_argo_cd() -> None:
    """The files are in the chart (nothing in .helmignore leaves them out); no object the chart
    renders is Argo CD's ConfigMap or lives in Argo CD's namespace."""
    ignored = (REPO / "charts" / "configpin" / ".helmignore").read_text().split()
    assert not any(p in ("*.lua", "files/", "files/argocd/") for p in ignored)
    assert sorted(p.name for p in ARGOCD.iterdir()) == [
        f"health-apps_{k}.lua" for k in sorted(KINDS)
    ]
    for obj in chart.render({}):
        meta = obj.get("metadata") or {}
        assert meta.get("namespace") != "argocd" and meta.get("name") != "argocd-cm", meta
