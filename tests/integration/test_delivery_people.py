"""Safe delivery under what people and tools do (shared/SPEC.md, docs/safe-delivery.md): the
promise of a followed rollout holds whatever else happens around it.

- a person's rollback of a workload configpin is rolling is a verdict on the change there;
- a workload scaled to zero or deleted while rolling proves nothing: it leaves its wave;
- `--max-rolling` is a cap: never more config rollouts in flight than it, counted at every
  stored version while eight workers ask at once; a workload over it waits, and says so;
- a new change always rolls: a superseded rollout, a paused workload, one nobody follows
  (`configpin.io/mode: off`, a record configpin did not write for it), a namespace that is no
  longer configpin's hold no place under `--max-rolling` (which counts per namespace);
- an undo goes back to the last content that completed, never an intermediate one;
- rejected content stays rejected at admission too (a re-apply);
- a workload that was not healthy before a change is no canary, and its failure stops no one
  (one that rolls after it, held back by its own wave list until approved, rolls);
- a kind without a deadline of its own fails by time without progress, not by a total;
- tenants are isolated, unless the source says it is shared across namespaces.

Two configpin replicas of instance `people` run as the chart runs them (one Lease, the webhook
registered from the chart's own entry, every controller write through admission); the tests
of `--max-rolling` run against one configpin of their own (`people-cap`: a cap of 2, no
waves). No kubelet: pods stay Pending unless the fake `Kubelet` reports them Ready, which it
does by what they carry, so that pods created before a change stay Ready while those of the
change stay Pending (a bad config that keeps the new pods from starting).
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pytest
from kubernetes import client

from harness.apps import rollout_undo
from harness.configpin import (
    Configpin,
    instance_namespace,
    leading_configpin,
)
from harness.controlplane import ENABLED_LABEL, ControlPlane, wait_for
from harness.kubelet import Kubelet, carrying, in_namespace, pod_sources, referencing
from harness.manifests import configmap, container, deployment, env_key_ref, pod_spec
from tests.integration.instances import replicas_fixture
from tests.integration.workloads import (
    annotation as _annotation,
)
from tests.integration.workloads import approve
from tests.integration.workloads import (
    get as _get,
)
from tests.integration.workloads import (
    record as _record,
)
from tests.integration.workloads import (
    set_cm as _set_cm,
)
from tests.integration.workloads import (
    sources as _sources,
)
from tests.integration.workloads import (
    stamped as _stamped,
)
from tests.integration.workloads import (
    state as _state,
)
from tests.integration.workloads import (
    status as _status,
)
from tests.integration.workloads import (
    wait_event as _wait_event,
)
from tests.integration.workloads import (
    wait_healthy as _wait_healthy,
)
from webhook.core.constants import (
    ANN_MODE,
    ANN_PROGRESS_DEADLINE,
    ANN_REJECTED,
    ANN_ROLLOUT,
    ANN_ROLLOUT_WAVES,
    ANN_WAVE,
)
from webhook.kube.errors import Conflict, NotFound
from webhook.kube.raw import MERGE_PATCH, Kube, path

T = TypeVar("T")

INSTANCE = "people"
CAP_INSTANCE = "people-cap"
RESYNC = 2.0
ARGS = [
    "--coalesce-window", "0.5",
    "--min-rollout-interval", "0",
    "--resync-period", str(RESYNC),
]  # fmt: skip
CAP = 2
CAP_ARGS = [*ARGS, "--max-rolling", str(CAP), "--rollout-waves", "off"]
SHORT = 5  # progressDeadlineSeconds where a failure is wanted
LONG = 600  # where it is not: a rollout whose pods are not Ready stays `rolling`
# The owner's mark of a source shared across namespaces, spelt out rather than imported: these
# tests also run against the code from before it had a name, to show what that did instead.
ANN_SHARED = "configpin.io/shared"
SNAPSHOT, CHECKSUM = "snapshot", "checksum"
ROLLING, COMPLETE, FAILED, LEFT = "rolling", "complete", "failed", "left"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


# --- fixtures -------------------------------------------------------------------------------


replicas = replicas_fixture(INSTANCE, "people", ARGS)


@pytest.fixture(scope="module")
def capped(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Configpin]:
    """One configpin of its own for the tests of `--max-rolling` (one replica: what is
    counted does not depend on which replica leads, and CI runs this on two cores)."""
    with leading_configpin(
        control_plane,
        tmp_path_factory.mktemp("configpin-people-cap"),
        instance=CAP_INSTANCE,
        webhook_name="configpin-people-cap",
        args=CAP_ARGS,
    ) as cp:
        yield cp


def _namespace_factory(k8s: client.ApiClient, instance: str) -> Iterator[Callable[[], str]]:
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(instance_namespace(k8s, instance, "people"))


@pytest.fixture
def namespaces(k8s: client.ApiClient, replicas: list[Configpin]) -> Iterator[Callable[[], str]]:
    """Fresh namespaces opted in for instance `people`, as many as a test asks for."""
    yield from _namespace_factory(k8s, INSTANCE)


@pytest.fixture
def capped_namespaces(k8s: client.ApiClient, capped: Configpin) -> Iterator[Callable[[], str]]:
    """Fresh namespaces opted in for instance `people-cap`."""
    yield from _namespace_factory(k8s, CAP_INSTANCE)


# --- workloads ------------------------------------------------------------------------------


def _app(
    name: str,
    *,
    mode: str = CHECKSUM,
    deadline: int = LONG,
    annotations: Mapping[str, str] | None = None,
    source: str = "cfg",
) -> dict[str, Any]:
    """Deployment `name`, one replica, reading key `a` of ConfigMap `source` into its env."""
    dep = deployment(
        name,
        pod_spec(container(env=[env_key_ref("configmap", source, "a", "A")])),
        replicas=1,
        annotations={ANN_MODE: mode, **(annotations or {})},
    )
    dep["spec"]["progressDeadlineSeconds"] = deadline
    return dep


def _deployments(
    kube: Kube,
    ns: str,
    names: Sequence[str],
    *,
    value: str,
    mode: str = CHECKSUM,
    deadline: int = LONG,
    shared: bool = False,
    source: str = "cfg",
    first: int = 0,
    step: int = 1,
) -> dict[str, dict[str, str]]:
    """ConfigMap `source` (`a: value`) and Deployments consuming it, in the order of `names`
    (their configpin.io/wave: `first`, then every `step`), so that the test says which rolls
    first; the template record each was stamped with."""
    annotations = {ANN_SHARED: "true"} if shared else None
    kube.create(path("configmaps", ns), configmap(source, {"a": value}, annotations=annotations))
    for place, name in enumerate(names):
        wave = {ANN_WAVE: str(first + place * step)}
        body = _app(name, mode=mode, deadline=deadline, source=source, annotations=wave)
        kube.create(path("deployments", ns), body)
    return {name: _sources(_stamped(kube, ns, name)) for name in names}


def _ref(obj: Mapping[str, Any]) -> str:
    """The name the container's env reference names (snapshot mode: a copy of `cfg`)."""
    name: str = obj["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"][
        "configMapKeyRef"
    ]["name"]
    return name


def _replicasets(kube: Kube, ns: str, app: str) -> int:
    return len(kube.get(path("replicasets", ns), labelSelector=f"app={app}").get("items") or ())


def _restamped(kube: Kube, ns: str, before: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Which of `before` no longer carry the template record they had (gone ones left out)."""
    out = []
    for name, sources in before.items():
        with contextlib.suppress(NotFound):
            if _sources(_get(kube, ns, name)) != sources:
                out.append(name)
    return out


def _until(
    predicate: Callable[[], T],
    *,
    never: Callable[[], str | None] = lambda: None,
    timeout: float = 30,
    what: str,
) -> T:
    """Wait for `predicate`; fail at once, saying why, as soon as `never` says something that
    must not happen did."""

    def check() -> T:
        wrong = never()
        if wrong:
            raise AssertionError(f"while waiting for {what}: {wrong}")
        return predicate()

    return wait_for(check, timeout=timeout, interval=0.3, what=what)


def _wait_state(
    kube: Kube,
    ns: str,
    name: str,
    state: str,
    *,
    timeout: float = 30,
    resource: str = "deployments",
) -> dict[str, Any]:
    """Wait until `name`'s record says `state`; fail at once when it ends otherwise."""
    ends = {COMPLETE, FAILED, LEFT} - {state}

    def wrong() -> str | None:
        record = _record(_get(kube, ns, name, resource))
        if record.get("state") in ends:
            return f"{ns}/{name} ended {record.get('state')} ({record.get('signal') or '-'})"
        return None

    _until(
        lambda: _state(_get(kube, ns, name, resource)) == state,
        never=wrong,
        timeout=timeout,
        what=f"{ns}/{name} {state}",
    )
    return _get(kube, ns, name, resource)


def _untouched(
    kube: Kube, before: Mapping[str, Mapping[str, Mapping[str, str]]], seconds: float
) -> None:
    """For `seconds` (several resync periods), none of `before` ({namespace: {name: template
    record}}) is re-stamped: its template record is what it was and it has its one
    ReplicaSet."""
    deadline = time.monotonic() + seconds
    while True:
        for ns, workloads in before.items():
            for name, sources in workloads.items():
                assert _sources(_get(kube, ns, name)) == sources, f"{ns}/{name} was re-stamped"
                assert _replicasets(kube, ns, name) == 1, f"{ns}/{name} rolled"
        if time.monotonic() >= deadline:
            return
        time.sleep(1.0)


def _but(before: Mapping[str, Mapping[str, str]], *names: str) -> dict[str, Mapping[str, str]]:
    return {n: s for n, s in before.items() if n not in names}


def _rolling(kube: Kube, ns: str, names: Sequence[str]) -> list[str]:
    return [n for n in names if _state(_get(kube, ns, n)) == ROLLING]


# --- a person's rollback --------------------------------------------------------------------


def _rolled_back_by_a_person(
    kube: Kube, ns: str, canary: str, before: Mapping[str, Mapping[str, str]]
) -> dict[str, Any]:
    """Wait for the verdict on `canary` after a person's rollback; fail at once when today's
    behaviour shows instead (its rollout counted complete, a later wave started)."""

    def instead() -> str | None:
        if _state(_get(kube, ns, canary)) == COMPLETE:
            return f"{ns}/{canary}'s rollout was counted complete"
        found = _restamped(kube, ns, _but(before, canary))
        return f"a later wave started in {ns} ({', '.join(found)})" if found else None

    _until(
        lambda: _state(_get(kube, ns, canary)) == FAILED,
        never=instead,
        what=f"{ns}/{canary}'s change failed by the person's rollback",
    )
    return _get(kube, ns, canary)


def test_a_persons_rollback_of_the_canary_fails_the_change_and_no_later_wave_starts(
    kube: Kube, k8s: client.ApiClient, namespaces: Callable[[], str], control_plane: ControlPlane
) -> None:
    """A person's rollback is a verdict: the canary of a change that a person rolls back
    (`kubectl rollout undo`) while configpin rolls it has failed that change there. Its record
    ends `failed` (rolled back by a person), the content is recorded as rejected, a Warning
    Event says so, the template stays where the person put it, and no later wave starts. In
    snapshot mode and in checksum mode (a namespace each, at once)."""
    names = [f"app-{i}" for i in range(4)]
    modes = {namespaces(): SNAPSHOT, namespaces(): CHECKSUM}
    # content of its own in each: equal content in two namespaces is one change on today's main
    before = {
        ns: _deployments(kube, ns, names, value=f"{mode}-1", mode=mode)
        for ns, mode in modes.items()
    }
    canary = {ns: names[0] for ns in modes}  # the first in order (`_deployments`)
    with Kubelet(kube, *modes) as kubelet:
        kubelet.allow(*names)
        for ns in modes:
            _wait_healthy(kube, ns, names)
        kubelet.clear()
        first = {ns: _get(kube, ns, canary[ns]) for ns in modes}
        for ns in modes:  # the old content's pods start, the change's stay Pending
            kubelet.allow(carrying(_sources(first[ns])))
        for ns, mode in modes.items():
            _set_cm(kube, ns, f"{mode}-2")
        rolled_to = {}
        for ns in modes:
            record = _record(_wait_state(kube, ns, canary[ns], ROLLING))
            rolled_to[ns] = record["to"]["configmap/cfg"]
            assert _restamped(kube, ns, before[ns]) == [canary[ns]]
        for ns in modes:
            rollout_undo(k8s, ns, canary[ns])
        for ns, mode in modes.items():
            dep = _rolled_back_by_a_person(kube, ns, canary[ns], before[ns])
            record = _record(dep)
            assert "rolled back by a person" in record["signal"], record
            assert record["action"] == "rolled-back-by-person", record
            assert _annotation(dep, ANN_REJECTED) == {"configmap/cfg": rolled_to[ns]}
            # where the person put it: the old copy (snapshot mode), the old content's record
            if mode == SNAPSHOT:
                assert _ref(dep) == _ref(first[ns])
            assert _sources(dep) == _sources(first[ns])
        for ns in modes:
            _wait_event(kube, ns, canary[ns], "ConfigRolledBackByPerson", "Warning")
        # there it stays, and no other workload is re-stamped, whatever resyncs come
        left = {ns: _get(kube, ns, canary[ns])["spec"]["template"] for ns in modes}
        _untouched(kube, {ns: _but(before[ns], canary[ns]) for ns in modes}, 3 * RESYNC)
        for ns in modes:
            assert _get(kube, ns, canary[ns])["spec"]["template"] == left[ns]
            row = _status(control_plane, ns)[canary[ns]]
            assert row["state"] == "failed" and "rolled back by a person" in row["reason"], row


# --- a workload that leaves its wave --------------------------------------------------------


def test_a_canary_scaled_to_zero_or_deleted_proves_nothing(
    kube: Kube, namespaces: Callable[[], str]
) -> None:
    """A workload of a wave that is scaled to zero or deleted proves nothing: it leaves the
    wave (a record `left`, a Normal Event `ConfigRolloutLeft`), the next workload in order
    becomes the canary on its own, and the others wait until it is complete."""
    ns = namespaces()
    names = [f"app-{i}" for i in range(6)]
    before = _deployments(kube, ns, names, value="1")
    order = names  # in this order (`_deployments`)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        _wait_healthy(kube, ns, names)
        kubelet.clear()
        _set_cm(kube, ns, "2")
        _wait_state(kube, ns, order[0], ROLLING)
        assert _restamped(kube, ns, before) == [order[0]]
        # scaled to zero while rolling: no pod of it ran the new content
        kube.patch(
            path("deployments", ns, order[0]), {"spec": {"replicas": 0}}, content_type=MERGE_PATCH
        )
        _wait_state(kube, ns, order[0], LEFT)
        _wait_event(kube, ns, order[0], "ConfigRolloutLeft", "Normal")
        _wait_state(kube, ns, order[1], ROLLING)
        _untouched(kube, {ns: _but(before, *order[:2])}, 2 * RESYNC)
        # deleted while rolling: it leaves too
        kube.delete(path("deployments", ns, order[1]))

        def more() -> str | None:
            found = _restamped(kube, ns, _but(before, *order[:3]))
            return f"{', '.join(found)} rolled with it" if found else None

        _until(
            lambda: _state(_get(kube, ns, order[2])) == ROLLING,
            never=more,
            what=f"{order[2]} the canary",
        )
        _untouched(kube, {ns: _but(before, *order[:3])}, 2 * RESYNC)
        # the new canary's pods start: it completes, then the others roll
        kubelet.allow(order[2])
        _wait_state(kube, ns, order[2], COMPLETE)
        kubelet.allow(*order[3:])
        for name in order[3:]:
            _wait_state(kube, ns, name, COMPLETE, timeout=60)
            assert _sources(_get(kube, ns, name)) == _sources(_get(kube, ns, order[2]))


# --- a new change always rolls (--max-rolling 2, no waves) ---------------------------------


class InFlight:
    """Counts the config rollouts in flight among Deployments `before` of `ns` ({name: the
    template record each had before the change}) at every version of them the API server
    stores, from a watch that runs while the block does: a rollout is in flight from the
    write that re-stamps its template (its record `rolling`) until its record ends. `most`:
    the largest count seen; `seen`: every count, in order."""

    def __init__(self, k8s: client.ApiClient, ns: str, before: Mapping[str, Mapping[str, str]]):
        self.kube = Kube(k8s)  # (its own connections: it watches from another thread)
        self.ns = ns
        self.before = before
        self.rolling: dict[str, bool] = {}
        self.seen: list[int] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="in-flight", daemon=True)
        self._version = ""

    @property
    def most(self) -> int:
        return max(self.seen, default=0)

    def _look(self, dep: Mapping[str, Any]) -> None:
        name = dep["metadata"]["name"]
        if name in self.before:
            self.rolling[name] = _state(dep) == ROLLING and _sources(dep) != self.before[name]
            self.seen.append(sum(self.rolling.values()))

    def __enter__(self) -> InFlight:
        listed = self.kube.get(path("deployments", self.ns))
        for dep in listed.get("items") or ():
            self._look(dep)
        self._version = listed["metadata"]["resourceVersion"]
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self.kube.watch(
                    path("deployments", self.ns), self._version, timeout_seconds=5
                ) as events:
                    for event in events:
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            raise AssertionError(f"the watch ended: {obj}")
                        self._version = obj["metadata"]["resourceVersion"]
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._look(obj)
        except BaseException as e:  # said in the test's thread
            self.failure = e

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.failure is not None:
            raise AssertionError("the watch of the rollouts in flight failed") from self.failure


def _at_the_cap(kube: Kube, ns: str, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """After a change reaches more workloads than the cap: those rolling, as many as the cap
    (checked again after a resync), and those waiting."""
    wait_for(
        lambda: len(_rolling(kube, ns, names)) >= CAP, what=f"{CAP} rollouts (the cap) started"
    )
    time.sleep(RESYNC)  # the others wait their turn
    rolling = _rolling(kube, ns, names)
    assert len(rolling) == CAP, f"{', '.join(rolling)} roll at once (--max-rolling {CAP})"
    return rolling, [n for n in names if n not in rolling]


def test_max_rolling_is_a_cap_whatever_number_of_workers_ask_at_once(
    kube: Kube, k8s: client.ApiClient, capped_namespaces: Callable[[], str]
) -> None:
    """`--max-rolling` caps the config rollouts in flight: one change reaches eight workloads
    at once (the controller's eight workers ask the gate together); at no version of them the
    API server stores are more than the cap rolling, from the change until every one has
    rolled and completed (their pods held back at first, then Ready)."""
    ns = capped_namespaces()
    names = [f"app-{i}" for i in range(8)]
    before = _deployments(kube, ns, names, value="1")
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        _wait_healthy(kube, ns, names)
        kubelet.clear()  # the change's pods are not Ready yet
        with InFlight(k8s, ns, before) as flight:
            _set_cm(kube, ns, "2")
            _, waiting = _at_the_cap(kube, ns, names)
            _untouched(kube, {ns: {n: before[n] for n in waiting}}, 2 * RESYNC)
            kubelet.allow(*names)  # they complete, and the others roll as places free
            for name in names:
                _wait_state(kube, ns, name, COMPLETE, timeout=120)
    assert flight.most == CAP, f"{flight.most} config rollouts in flight at once: {flight.seen}"
    assert all(_sources(_get(kube, ns, n)) != before[n] for n in names)


def test_a_quick_fix_rolls_everywhere_at_once_whatever_rolls_already(
    kube: Kube, capped_namespaces: Callable[[], str], control_plane: ControlPlane
) -> None:
    """A new change always rolls: a rollout superseded by a newer change of its source ends and
    frees its place at once. A bad change fills the cap (its pods never Ready, nothing fails
    for ten minutes), a third workload waits (not re-stamped, and told why); the quick fix that
    follows reaches all three within seconds (and, its pods Ready, completes)."""
    ns = capped_namespaces()
    names = ["app-0", "app-1", "app-2"]
    before = _deployments(kube, ns, names, value="1")
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names)
        _wait_healthy(kube, ns, names)
        kubelet.clear()
        _set_cm(kube, ns, "2")  # the bad change
        rolling, waiting = _at_the_cap(kube, ns, names)
        [third] = waiting
        assert _sources(_get(kube, ns, third)) == before[third]
        _wait_event(kube, ns, third, "ConfigRolloutWaiting", "Normal")
        row = _status(control_plane, ns)[third]
        assert row["state"] == "waiting" and f"--max-rolling {CAP}" in row["reason"], row
        bad = _sources(_get(kube, ns, rolling[0]))
        kubelet.allow(lambda pod: pod_sources(pod) != bad)  # the fix's pods start
        _set_cm(kube, ns, "3")  # the quick fix

        def fixed() -> bool:
            found = [_sources(_get(kube, ns, n)) for n in names]
            return all(s == found[0] for s in found) and found[0] not in (bad, before[names[0]])

        wait_for(fixed, timeout=20, what="every workload re-stamped to the quick fix")
        for name in names:
            _wait_state(kube, ns, name, COMPLETE)


def test_a_paused_workload_holds_no_place(kube: Kube, capped_namespaces: Callable[[], str]) -> None:
    """A new change always rolls: a paused workload never holds a place. Two rollouts fill the
    cap, a third workload's rollout waits; one of the two is paused (`spec.paused`), and the
    third rolls."""
    ns = capped_namespaces()
    names = ["app-0", "app-1"]
    _deployments(kube, ns, names, value="1")
    # The third consumes a source of its own, changed once the two are rolling: it waits
    # for the cap alone (workloads checked at the same moment may all take the last place).
    third = _deployments(kube, ns, ["app-2"], value="1", source="cfg2")["app-2"]
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*names, "app-2")
        _wait_healthy(kube, ns, [*names, "app-2"])
        kubelet.clear()
        _set_cm(kube, ns, "2")
        wait_for(lambda: len(_rolling(kube, ns, names)) == CAP, what="the cap reached")
        _set_cm(kube, ns, "2", source="cfg2")
        _wait_event(kube, ns, "app-2", "ConfigRolloutWaiting", "Normal")
        assert _sources(_get(kube, ns, "app-2")) == third
        kube.patch(
            path("deployments", ns, names[0]),
            {"spec": {"paused": True}},
            content_type=MERGE_PATCH,
        )
        wait_for(
            lambda: _sources(_get(kube, ns, "app-2")) != third,
            timeout=20,
            what=f"app-2 rolled once {names[0]} was paused",
        )
        assert _state(_get(kube, ns, names[1])) == ROLLING


def _labelled(kube: Kube, ns: str, enabled: bool) -> None:
    """Opt `ns` in (`configpin.io/enabled: "true"`) or out (the label removed)."""
    value = "true" if enabled else None
    kube.patch(
        path("namespaces", name=ns),
        {"metadata": {"labels": {ENABLED_LABEL: value}}},
        content_type=MERGE_PATCH,
    )


def _done(dep: Mapping[str, Any]) -> bool:
    """The Deployment's own status says its rollout completed (whatever configpin says)."""
    status = dep.get("status") or {}
    want = dep["spec"]["replicas"]
    return (
        status.get("observedGeneration", 0) >= dep["metadata"]["generation"]
        and status.get("updatedReplicas") == want
        and status.get("readyReplicas") == want
        and status.get("replicas") == want
    )


def test_a_namespace_at_its_cap_keeps_no_other_waiting(
    kube: Kube, capped_namespaces: Callable[[], str]
) -> None:
    """Tenants are isolated, and `--max-rolling` counts per namespace the rollouts configpin
    follows in namespaces it acts on. A namespace with as many rollouts in flight as the cap
    holds a third change of its own back, and another namespace's change from nothing.
    Unlabelled while its rollouts are in flight, it is configpin's no more: nothing there is
    followed (those rollouts end, their records say nothing of it) or rolled. Labelled again,
    its rollouts that ended meanwhile are followed to their end, and the places they held are
    free: its third change rolls."""
    full, other = capped_namespaces(), capped_namespaces()
    names = ["app-0", "app-1"]
    before = _deployments(kube, full, names, value="1")
    # content of their own: equal content in two namespaces is one change on today's main
    third = _deployments(kube, full, ["app-2"], value="1", source="cfg2")["app-2"]
    web = _deployments(kube, other, ["web"], value="x1")["web"]
    with Kubelet(kube, full, other) as kubelet:
        kubelet.allow(*names, "app-2", "web")
        _wait_healthy(kube, full, [*names, "app-2"])
        _wait_healthy(kube, other, ["web"])
        kubelet.clear()
        kubelet.allow(in_namespace(other))
        _set_cm(kube, full, "2")
        wait_for(lambda: len(_rolling(kube, full, names)) == CAP, what=f"{full} at its cap")
        _set_cm(kube, full, "2", source="cfg2")
        _wait_event(kube, full, "app-2", "ConfigRolloutWaiting", "Normal")
        _set_cm(kube, other, "x2")
        wait_for(
            lambda: _sources(_get(kube, other, "web")) != web,
            timeout=15,
            what="the other namespace's change rolled",
        )
        _wait_state(kube, other, "web", COMPLETE)
        assert _sources(_get(kube, full, "app-2")) == third, "app-2 rolled past the cap"
        # no longer configpin's while its rollouts are in flight: they end unseen
        _labelled(kube, full, False)
        kubelet.allow(in_namespace(full))
        wait_for(
            lambda: all(_done(_get(kube, full, n)) for n in names),
            timeout=60,
            what=f"{full}'s rollouts completed by their Deployments",
        )
        _untouched(kube, {full: {"app-2": third}}, 2 * RESYNC)
        assert _rolling(kube, full, names) == names, "followed in a namespace not configpin's"
        # configpin's again
        _labelled(kube, full, True)
        for name in names:
            _wait_state(kube, full, name, COMPLETE)
        wait_for(
            lambda: _sources(_get(kube, full, "app-2")) != third,
            timeout=20,
            what="app-2 rolled once the places were free",
        )
        _wait_state(kube, full, "app-2", COMPLETE)
        assert all(_sources(_get(kube, full, n)) != before[n] for n in names)


def test_a_workload_nobody_follows_holds_no_place(
    kube: Kube, capped_namespaces: Callable[[], str]
) -> None:
    """A paused workload or one nobody follows never holds a place. Two rollouts fill the cap
    (their pods never Ready), a third workload's change waits. One of the two is turned
    `configpin.io/mode: off`: configpin follows it no more, and the third rolls. Then a record
    configpin did not write for that workload (copied from another one's, as an export and a
    re-apply under another name copy it) is no rollout configpin follows either: with one
    place taken and that copy beside it, a fourth change rolls, and the copy is left as it
    is (not judged, not ended)."""
    ns = capped_namespaces()
    names = ["app-0", "app-1"]
    _deployments(kube, ns, names, value="1")
    third = _deployments(kube, ns, ["app-2"], value="1", source="cfg2")["app-2"]
    copied = _deployments(kube, ns, ["copy"], value="1", source="cfg3")["copy"]
    fourth = _deployments(kube, ns, ["app-4"], value="1", source="cfg4")["app-4"]
    everyone = [*names, "app-2", "copy", "app-4"]
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*everyone)
        _wait_healthy(kube, ns, everyone)
        kubelet.clear()
        _set_cm(kube, ns, "2")
        wait_for(lambda: len(_rolling(kube, ns, names)) == CAP, what="the cap reached")
        _set_cm(kube, ns, "2", source="cfg2")
        _wait_event(kube, ns, "app-2", "ConfigRolloutWaiting", "Normal")
        assert _sources(_get(kube, ns, "app-2")) == third
        off, kept = names
        kube.patch(
            path("deployments", ns, off),
            {"metadata": {"annotations": {ANN_MODE: "off"}}},
            content_type=MERGE_PATCH,
        )
        wait_for(
            lambda: _sources(_get(kube, ns, "app-2")) != third,
            timeout=20,
            what=f"app-2 rolled once {off} was configpin's no more",
        )
        assert _state(_get(kube, ns, off)) == ROLLING  # (its record, not followed any more)
        # the record of a rollout in flight, on another workload
        text = _get(kube, ns, kept)["metadata"]["annotations"][ANN_ROLLOUT]
        kube.patch(
            path("deployments", ns, "copy"),
            {"metadata": {"annotations": {ANN_ROLLOUT: text}}},
            content_type=MERGE_PATCH,
        )
        assert _state(_get(kube, ns, "copy")) == ROLLING
        kubelet.allow(kept)
        _wait_state(kube, ns, kept, COMPLETE)  # in flight now: app-2 (and the copy?)
        _set_cm(kube, ns, "2", source="cfg4")
        wait_for(
            lambda: _sources(_get(kube, ns, "app-4")) != fourth,
            timeout=20,
            what="app-4 rolled beside app-2 and the copied record",
        )
        # nobody follows it: configpin neither judged nor ended it, nor rolled it
        annotations = _get(kube, ns, "copy")["metadata"]["annotations"]
        assert annotations[ANN_ROLLOUT] == text, _record(_get(kube, ns, "copy"))
        assert ANN_REJECTED not in annotations
        assert _sources(_get(kube, ns, "copy")) == copied


# --- undo and re-apply ----------------------------------------------------------------------


def test_an_undo_goes_back_to_the_last_content_that_completed(
    kube: Kube, namespaces: Callable[[], str]
) -> None:
    """Undo goes back to content that worked: v1 rolled out and completed; v2 is rolling (its
    pods not Ready) when v3 comes; v3 fails too. The undo points the template at v1's copy, not
    at v2's, which never completed anywhere."""
    ns = namespaces()
    _deployments(kube, ns, ["web"], value="0", mode=SNAPSHOT)
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("web")
        _wait_healthy(kube, ns, ["web"])
        c0 = _ref(_get(kube, ns, "web"))
        _set_cm(kube, ns, "1")
        web = _wait_state(kube, ns, "web", COMPLETE)
        c1, v1 = _ref(web), _sources(web)
        assert c1 != c0
        kubelet.clear()
        kubelet.allow(referencing(c1))  # v1's copy works; v2's and v3's pods never start
        _set_cm(kube, ns, "2")
        wait_for(lambda: _ref(_get(kube, ns, "web")) not in (c0, c1), what="v2 rolled")
        c2 = _ref(_get(kube, ns, "web"))
        _set_cm(kube, ns, "3")
        wait_for(lambda: _ref(_get(kube, ns, "web")) not in (c0, c1, c2), what="v3 rolled")
        assert _state(_get(kube, ns, "web")) == ROLLING
        # Only now does a deadline apply (the Deployment controller counts it from the v3
        # ReplicaSet): v2's rollout was never judged, it was superseded.
        kube.patch(
            path("deployments", ns, "web"),
            {"spec": {"progressDeadlineSeconds": 3}},
            content_type=MERGE_PATCH,
        )
        web = _wait_state(kube, ns, "web", FAILED, timeout=40)
        assert _record(web)["action"] == "undo", _record(web)
        assert _ref(web) != c2, "undone to v2's copy, which never completed"
        assert _ref(web) == c1
        assert _sources(web) == v1
        _wait_healthy(kube, ns, ["web"])  # back on what runs


def _failed_snapshot(kube: Kube, ns: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`web` (snapshot mode) on v1, healthy; v2's rollout failed and was undone. The
    Deployment as first created, and as it is now."""
    manifest = _app("web", mode=SNAPSHOT, deadline=SHORT)
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), copy.deepcopy(manifest))
    _stamped(kube, ns, "web")
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("web")
        _wait_healthy(kube, ns, ["web"])
    first = _get(kube, ns, "web")
    _set_cm(kube, ns, "2")
    _wait_state(kube, ns, "web", ROLLING)
    web = _wait_state(kube, ns, "web", FAILED, timeout=40)
    assert _record(web)["action"] == "undo" and _ref(web) == _ref(first)
    return manifest, web


def test_a_reapply_keeps_a_snapshot_workload_off_rejected_content(
    kube: Kube, namespaces: Callable[[], str]
) -> None:
    """Rejected content stays rejected at admission too: after a failed rollout was undone, a
    re-apply of the original manifest (its reference naming `cfg` itself, as `kubectl apply`
    sends it) keeps the workload on its last good copy, with a warning; no new ReplicaSet."""
    ns = namespaces()
    manifest, undone = _failed_snapshot(kube, ns)
    good, v1 = _ref(undone), _sources(undone)
    rejected = _annotation(undone, ANN_REJECTED)
    assert set(rejected) == {"configmap/cfg"} and rejected["configmap/cfg"] != v1["configmap/cfg"]
    replicasets = _replicasets(kube, ns, "web")
    # what `kubectl apply -f` of the manifest sends: the fields that differ, the reference
    env = manifest["spec"]["template"]["spec"]["containers"][0]["env"]
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "app", "env": env}]}}}}
    resp = kube.open(
        "PATCH", path("deployments", ns, "web"), body=patch, content_type=STRATEGIC_MERGE_PATCH
    )
    try:
        applied = json.loads(resp.read())
        warnings = " ".join(resp.headers.getlist("Warning"))
    finally:
        resp.release_conn()
    assert _ref(applied) == good, "re-pointed at the rejected content"
    assert _sources(applied) == v1
    assert "rejected" in warnings, warnings
    time.sleep(2 * RESYNC)
    web = _get(kube, ns, "web")
    assert _ref(web) == good and _sources(web) == v1
    assert _replicasets(kube, ns, "web") == replicasets


def test_a_reapply_of_rejected_content_in_checksum_mode_is_followed(
    kube: Kube, k8s: client.ApiClient, namespaces: Callable[[], str]
) -> None:
    """Rejected content stays rejected at admission too; in checksum mode the rollout a
    re-apply causes is followed like any other: a person rolls back a rollout in progress
    (their template is kept on the old record, the content rejected), then a re-apply of the
    manifest stamps that content again; that rollout is recorded (`rolling`, to the rejected
    digest) and, its pods never Ready, held."""
    ns = namespaces()
    manifest = _app("web", deadline=SHORT)  # what Git says now
    first = copy.deepcopy(manifest)
    first["spec"]["progressDeadlineSeconds"] = 600  # the change is not judged before the undo
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    kube.create(path("deployments", ns), first)
    v1 = _sources(_stamped(kube, ns, "web"))
    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("web")
        _wait_healthy(kube, ns, ["web"])
        kubelet.clear()
        _set_cm(kube, ns, "2")
        rolled = _wait_state(kube, ns, "web", ROLLING)
        v2 = _sources(rolled)
        assert v2 != v1
        rollout_undo(k8s, ns, "web")
        judged = _wait_state(kube, ns, "web", FAILED, timeout=30)
    assert _record(judged)["action"] == "rolled-back-by-person"
    assert _sources(judged) == v1  # as the person left it
    assert _annotation(judged, ANN_REJECTED) == {"configmap/cfg": v2["configmap/cfg"]}
    # A re-apply of the whole spec as Git has it now (`kubectl replace`, a tool that owns the
    # spec), its pod template changed since (a re-apply of the same template, its record
    # dropped, keeps the record it had: nothing rolls): admission stamps the content there is.
    # Read and written again on a 409, as the tool does: the Deployment controller may still
    # be writing the status the undo left moving.
    for attempt in range(5):
        obj = _get(kube, ns, "web")
        obj["metadata"].pop("managedFields", None)
        obj["spec"] = copy.deepcopy(manifest["spec"])
        obj["spec"]["template"]["metadata"]["labels"]["release"] = "2"
        try:
            kube.replace(path("deployments", ns, "web"), obj)
            break
        except Conflict:
            if attempt == 4:
                raise
    assert _sources(_get(kube, ns, "web")) == v2

    def recorded() -> dict[str, Any]:
        record = _record(_get(kube, ns, "web"))
        return record if record.get("since", 0) > _record(judged)["since"] else {}

    following = wait_for(recorded, timeout=15, what="the re-apply's rollout recorded")
    assert following["state"] == ROLLING and following["to"] == v2, following
    web = _wait_state(kube, ns, "web", FAILED, timeout=40)
    assert _record(web)["action"] == "hold"
    assert _record(web)["since"] == following["since"]


# --- a workload that was not healthy before --------------------------------------------------


def test_a_broken_neighbour_is_no_canary_and_stops_no_one(
    kube: Kube, namespaces: Callable[[], str], control_plane: ControlPlane
) -> None:
    """A workload that was not healthy before the change (never available, its progress
    deadline passed) is no canary, even where `configpin.io/wave: "-1"` puts it first: a
    healthy one is. Its own rollout fails, and stops no one: `late`, healthy, in the last wave
    with it but rolling only once the change is approved (its own wave list asks for that),
    comes after that failure, and rolls and completes; so do the others."""
    ns = namespaces()
    healthy = [f"app-{i}" for i in range(3)]
    before = _deployments(kube, ns, healthy, value="1")
    # last of the healthy ones (their configpin.io/wave 0, 1, 2), and held back by its own
    # wave list until approved
    late = _app("late", annotations={ANN_WAVE: "3", ANN_ROLLOUT_WAVES: "approve,100%"})
    kube.create(path("deployments", ns), late)
    broken = _app("broken", deadline=SHORT, annotations={ANN_WAVE: "-1"})
    kube.create(path("deployments", ns), broken)
    for name in ("late", "broken"):
        before[name] = _sources(_stamped(kube, ns, name))
    order = healthy  # in this order (`_deployments`)

    def failing(dep: Mapping[str, Any]) -> bool:
        conditions = {c.get("type"): c for c in (dep.get("status") or {}).get("conditions") or ()}
        return (conditions.get("Available") or {}).get("status") == "False" and (
            conditions.get("Progressing") or {}
        ).get("reason") == "ProgressDeadlineExceeded"

    with Kubelet(kube, ns) as kubelet:
        kubelet.allow(*healthy, "late")  # the broken one's pods never start
        _wait_healthy(kube, ns, [*healthy, "late"])
        wait_for(lambda: failing(_get(kube, ns, "broken")), what="the broken one failing")
        kubelet.clear()
        _set_cm(kube, ns, "2")
        first = wait_for(
            lambda: _restamped(kube, ns, before), interval=0.2, what="the canary re-stamped"
        )
        assert first == [order[0]], f"the canary was {first}, not {order[0]}"
        kubelet.allow(*healthy, "late")
        for name in healthy:
            _wait_state(kube, ns, name, COMPLETE, timeout=60)
        # it rolls too (last), followed and reported as it was: failed, held
        broken_record = _record(_wait_state(kube, ns, "broken", FAILED, timeout=40))
        assert _sources(_get(kube, ns, "late")) == before["late"], "late rolled before it"
        _wait_event(kube, ns, "late", "ConfigRolloutAwaitingApproval", "Normal")
        approve(control_plane.kubeconfig, ns)
        _wait_state(kube, ns, "late", COMPLETE, timeout=60)
    assert broken_record["action"] == "hold", broken_record
    assert _sources(_get(kube, ns, "broken")) != before["broken"]
    assert _sources(_get(kube, ns, "late")) != before["late"]


# --- a kind without a deadline of its own ---------------------------------------------------


def test_a_statefulset_that_keeps_progressing_is_not_failed_by_a_total(
    kube: Kube, namespaces: Callable[[], str]
) -> None:
    """Signals are about this rollout: for kinds without a deadline of their own the deadline
    is time without progress. A StatefulSet (3 replicas, `configpin.io/progress-deadline: 8`)
    whose updated pods become Ready one every ~5 s takes longer than 8 s in all, never 8 s
    without one: its rollout completes."""
    ns = namespaces()
    deadline, step = 8, 4.5
    kube.create(path("configmaps", ns), configmap("cfg", {"a": "1"}))
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": "db",
            "annotations": {ANN_MODE: CHECKSUM, ANN_PROGRESS_DEADLINE: str(deadline)},
        },
        "spec": {
            "serviceName": "db",
            "replicas": 3,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": pod_spec(container(env=[env_key_ref("configmap", "cfg", "a", "A")])),
            },
        },
    }
    kube.create(path("statefulsets", ns), sts)

    def settled() -> bool:
        db = _get(kube, ns, "db", "statefulsets")
        status = db.get("status") or {}
        return (
            status.get("observedGeneration", 0) >= db["metadata"]["generation"]
            and status.get("readyReplicas") == 3
            and status.get("updatedReplicas") == 3
            and status.get("currentRevision") == status.get("updateRevision")
        )

    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("db")
        wait_for(settled, timeout=60, what="db healthy")
        kubelet.clear()
        # one updated pod at a time (highest ordinal first), each Ready `step` s after it
        # appeared: progress every ~5 s
        kubelet.allow("db", after=step)
        _set_cm(kube, ns, "2")
        _wait_state(kube, ns, "db", ROLLING, resource="statefulsets")
        started = time.monotonic()
        _wait_state(kube, ns, "db", COMPLETE, timeout=60, resource="statefulsets")
        took = time.monotonic() - started
    assert took > deadline, f"complete after {took:.1f} s: the test proved nothing"
    assert settled()


# --- tenants --------------------------------------------------------------------------------


def test_tenants_are_isolated_unless_the_source_is_shared(
    kube: Kube, namespaces: Callable[[], str]
) -> None:
    """Tenants are isolated: two namespaces with a ConfigMap `cfg` of the same content; the
    canary of one fails, the other's workloads all roll and complete (waves of its own).
    Unless the source's owner marks it shared (`configpin.io/shared: "true"` on each copy):
    then it is one change, in waves across both, and a failure in its first wave stops the
    workloads of both namespaces."""
    names = ["app-0", "app-1", "app-2"]
    one, two = namespaces(), namespaces()
    # The one that fails comes first in the order of both namespaces' workloads (its waves 0,
    # 2, 4; the other's 1, 3, 5): a configpin that took equal content in two namespaces for one
    # change would start with it, and there stop the other namespace's rollouts.
    failing, other = one, two
    shared = [namespaces(), namespaces()]
    shared_canary = (shared[0], names[0])  # likewise first across the shared pair
    before = {
        failing: _deployments(kube, failing, names, value="t1", deadline=SHORT, step=2),
        other: _deployments(kube, other, names, value="t1", first=1, step=2),
        # content of their own: they must not be one change with the pair above
        **{
            ns: _deployments(
                kube, ns, names, value="u1", deadline=SHORT, shared=True, first=i, step=2
            )
            for i, ns in enumerate(shared)
        },
    }
    with Kubelet(kube, *before) as kubelet:
        kubelet.allow(*names)
        for ns in before:
            _wait_healthy(kube, ns, names)
        kubelet.clear()
        kubelet.allow(in_namespace(other))
        kubelet.allow(  # all but the shared change's canary would start
            lambda pod: (
                pod["metadata"]["namespace"] in shared
                and (pod["metadata"]["namespace"], pod["metadata"]["labels"]["app"])
                != shared_canary
            )
        )
        for ns in (failing, other):
            _set_cm(kube, ns, "t2")
        for ns in shared:
            _set_cm(kube, ns, "u2")
        canary = names[0]
        _wait_state(kube, failing, canary, FAILED, timeout=40)
        for name in names:
            _wait_state(kube, other, name, COMPLETE, timeout=40)
        shared_ns, shared_name = shared_canary
        _wait_state(kube, shared_ns, shared_name, FAILED, timeout=40)
        # nothing else of the failed changes rolls, whatever resyncs come
        stopped = {ns: _but(before[ns], shared_name if ns == shared_ns else "") for ns in shared}
        _untouched(kube, {failing: _but(before[failing], canary), **stopped}, 3 * RESYNC)
