"""A kubelet's one job in tests without nodes: report pods Ready.

The control plane of the integration tests runs no kubelet (and no scheduler): every pod stays
Pending, so a Deployment's rollout never completes and fails by its own progress deadline. A
`Kubelet` marks chosen pods Ready through `pods/status`, as a kubelet reports a container that
started and passes its readiness probe. Which pods, a test says by what they carry: their app
label, or any predicate of the pod as read (the content it was created with, the snapshot copy
it references, its namespace), so that the pods created before a change stay Ready while those
of the change stay Pending.

    with Kubelet(kube, ns) as kubelet:
        kubelet.allow("web")                      # the pods of app=web
        kubelet.clear()                           # from now on, no new pod is made Ready
        kubelet.allow(carrying(before))           # ... but those with the old content
        kubelet.allow(apps("db"), after=5.0)      # each pod of app=db, 5 s after it appeared

A pod once Ready stays Ready: nothing here takes readiness back.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeAlias

from webhook.core.constants import ANN_SOURCES
from webhook.core.kept import parse_mapping
from webhook.kube.errors import KubeError
from webhook.kube.raw import MERGE_PATCH, Kube, path

Pod: TypeAlias = Mapping[str, Any]
Rule: TypeAlias = Callable[[Pod], bool]


# --- what a pod carries ------------------------------------------------------------------------


def pod_sources(pod: Pod) -> dict[str, str] | None:
    """The per-source digests a pod was created with (`configpin.io/sources`), None if none."""
    return parse_mapping(((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_SOURCES))


def _configmap_names(node: Any) -> Iterator[str]:
    """The ConfigMap names a pod spec references: volumes, projected volumes, env, envFrom."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("configMap", "configMapKeyRef", "configMapRef") and isinstance(value, dict):
                name = value.get("name")
                if isinstance(name, str):
                    yield name
            yield from _configmap_names(value)
    elif isinstance(node, list):
        for item in node:
            yield from _configmap_names(item)


def apps(*names: str) -> Rule:
    """Pods labelled `app` with one of `names`."""
    chosen = frozenset(names)
    return lambda pod: ((pod.get("metadata") or {}).get("labels") or {}).get("app") in chosen


def carrying(sources: Mapping[str, str]) -> Rule:
    """Pods whose `configpin.io/sources` is exactly `sources`: the content they started with."""
    wanted = dict(sources)
    return lambda pod: pod_sources(pod) == wanted


def referencing(configmap: str) -> Rule:
    """Pods whose spec references ConfigMap `configmap` (in snapshot mode a copy,
    `cfg-<10 hex>`: the revision of the config they run)."""
    return lambda pod: configmap in set(_configmap_names(pod.get("spec")))


def in_namespace(namespace: str) -> Rule:
    return lambda pod: (pod.get("metadata") or {}).get("namespace") == namespace


# --- the kubelet --------------------------------------------------------------------------


class Kubelet:
    """Marks the allowed pods of `namespaces` Ready through `pods/status`, every 0.3 s."""

    def __init__(
        self, kube: Kube, *namespaces: str, interval: float = 0.3, watch: bool = False
    ) -> None:
        """`watch`: list once, then follow a watch of each namespace's pods instead of
        listing them every `interval` (for thousands of pods; `after` is not looked at
        again on a pod nothing changes)."""
        self.kube = kube
        self.namespaces = namespaces
        self.interval = interval
        self.watch = watch
        self.allowed: set[str] = set()  # app labels whose pods are made Ready at once
        self._rules: list[tuple[Rule, float]] = []
        self._seen: dict[str, float] = {}  # pod uid -> when this kubelet first listed it
        self._stop = threading.Event()
        self._threads = (
            [
                threading.Thread(target=self._follow, args=(ns,), name=f"kubelet-{ns}", daemon=True)
                for ns in namespaces
            ]
            if watch
            else [threading.Thread(target=self._run, name="kubelet", daemon=True)]
        )

    def allow(self, *what: str | Rule, after: float = 0.0) -> None:
        """Make Ready the pods of these apps (a name: its `app` label) or those a predicate
        accepts; with `after`, only once the pod has existed that long (a container that takes
        its time to start), which spaces a StatefulSet's one-at-a-time rollout out."""
        for item in what:
            if isinstance(item, str) and not after:
                self.allowed.add(item)
            else:
                self._rules = [*self._rules, (apps(item) if isinstance(item, str) else item, after)]

    def clear(self) -> None:
        """No more pods made Ready (those Ready stay so)."""
        self.allowed.clear()
        self._rules = []

    def _admits(self, pod: Pod, age: float) -> bool:
        app = ((pod.get("metadata") or {}).get("labels") or {}).get("app")
        if app in self.allowed:
            return True
        return any(age >= after and rule(pod) for rule, after in self._rules)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            listed: set[str] = set()
            for ns in self.namespaces:
                with contextlib.suppress(KubeError):
                    for pod in self.kube.get(path("pods", ns)).get("items") or ():
                        listed.add(pod["metadata"]["uid"])
                        self._look_at(pod)
            self._seen = {uid: t for uid, t in self._seen.items() if uid in listed}

    def _follow(self, ns: str) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(KubeError):
                listed = self.kube.get(path("pods", ns))
                for pod in listed.get("items") or ():
                    self._look_at(pod)
                rv = listed["metadata"]["resourceVersion"]
                expired = False
                while not expired and not self._stop.is_set():
                    with self.kube.watch(path("pods", ns), rv, timeout_seconds=5) as stream:
                        for event in stream:
                            if event.get("type") == "ERROR":  # 410: list again
                                expired = True
                                break
                            pod = event.get("object") or {}
                            rv = pod.get("metadata", {}).get("resourceVersion", rv)
                            if event.get("type") in ("ADDED", "MODIFIED"):
                                self._look_at(pod)
                            if self._stop.is_set():
                                return
            self._stop.wait(self.interval)

    def _look_at(self, pod: dict[str, Any]) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            return
        first = self._seen.setdefault(meta["uid"], time.monotonic())
        if not self._admits(pod, time.monotonic() - first):
            return
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or ()
        ):
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {"status": "True", "lastTransitionTime": now}
        body = {
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": t, **ready}
                    for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "image": c["image"],
                        "imageID": "",
                        "state": {"running": {"startedAt": now}},
                    }
                    for c in pod["spec"]["containers"]
                ],
            }
        }
        with contextlib.suppress(KubeError):  # gone meanwhile: nothing to report
            self.kube.patch(
                path("pods", meta["namespace"], meta["name"]) + "/status",
                body,
                content_type=MERGE_PATCH,
            )

    def __enter__(self) -> Kubelet:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
