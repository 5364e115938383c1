"""A stand-in for Stakater Reloader in tests: a thread that watches the ConfigMaps and Secrets of
some namespaces and, on an update whose data changed, patches the pod templates of the
Deployments, DaemonSets and StatefulSets there as Reloader does (internal/pkg/handler/upgrade.go,
pkg/common.ShouldReload), with either strategy:

- `env-vars` (Reloader's default): a strategic merge patch that sets the env var
  `STAKATER_<NAME>_CONFIGMAP` (`_SECRET`) to the SHA1 Reloader takes of the source's data, in
  the container that uses the source (the first container for a `reload` list), and nothing
  when it already holds that value;
- `annotations`: a strategic merge patch of the template annotation
  `reloader.stakater.com/last-reloaded-from`.

It decides as Reloader does, written here on its own (not with webhook.core.reloader, which
the tests check against it): `reloader.stakater.com/ignore` on the source, the exclude lists,
the `reload` lists (each entry a regular expression of the whole name), `auto`, the typed
`auto`, `search` with `match`, the metadata before the template; `auto` and `search` only for
a source a container uses. `delay`: seconds it waits after a change before it acts (so that
configpin acts first), as a Reloader that is slow to see it.

    with Reloader(kube, ns, strategy="annotations", delay=3.0) as reloader:
        ...
        assert reloader.patched == [("Deployment", "web", "configmap/cfg")]
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

from webhook.kube.errors import KubeError
from webhook.kube.raw import Kube, path

STRATEGIC: Final = "application/strategic-merge-patch+json"
_KINDS: Final = (
    ("deployments", "Deployment"),
    ("daemonsets", "DaemonSet"),
    ("statefulsets", "StatefulSet"),
)
_TRUE: Final = ("1", "t", "T", "TRUE", "true", "True")


def sha(kind: str, obj: Mapping[str, Any]) -> str:
    """util.GetSHAfromConfigmap / GetSHAfromSecret: `k=v` sorted, joined by `;`, SHA1."""
    if kind == "ConfigMap":
        values = [f"{k}={v}" for k, v in (obj.get("data") or {}).items()]
        values += [f"{k}={v}" for k, v in (obj.get("binaryData") or {}).items()]  # (base64)
    else:
        values = [
            f"{k}={base64.b64decode(v).decode('utf-8', 'replace')}"
            for k, v in (obj.get("data") or {}).items()
        ]
    return hashlib.sha1(";".join(sorted(values)).encode()).hexdigest()


def env_name(name: str, kind: str) -> str:
    """util.ConvertToEnvVarName, then Reloader's prefix and postfix."""
    out, last_valid = [], False
    for ch in name.upper():
        if ch.isascii() and ch.isalnum():
            out.append(ch)
            last_valid = True
        else:
            if last_valid:
                out.append("_")
            last_valid = False
    return "STAKATER_" + "".join(out) + ("_CONFIGMAP" if kind == "ConfigMap" else "_SECRET")


def _container(spec: Mapping[str, Any], kind: str, name: str, auto: bool) -> str | None:
    """getContainerUsingResource: the name of the container to patch, None: none found."""
    containers = list(spec.get("containers") or ())
    inits = list(spec.get("initContainers") or ())
    volume_name = None
    for v in spec.get("volumes") or ():
        direct = (
            v.get("configMap", {}).get("name")
            if kind == "ConfigMap"
            else (v.get("secret", {}).get("secretName"))
        )
        projected = [
            s.get("configMap" if kind == "ConfigMap" else "secret", {}).get("name")
            for s in (v.get("projected") or {}).get("sources") or ()
        ]
        if direct == name or name in projected:
            volume_name = v.get("name")
            break

    def mounting(group: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next(
            (
                c
                for c in group
                if any(m.get("name") == volume_name for m in c.get("volumeMounts") or ())
            ),
            None,
        )

    def reading(group: list[dict[str, Any]]) -> dict[str, Any] | None:
        key, ref = (
            ("configMapKeyRef", "configMapRef")
            if kind == "ConfigMap"
            else ("secretKeyRef", "secretRef")
        )
        for c in group:
            if any(
                ((e.get("valueFrom") or {}).get(key) or {}).get("name") == name
                for e in c.get("env") or ()
            ):
                return c
            if any((e.get(ref) or {}).get("name") == name for e in c.get("envFrom") or ()):
                return c
        return None

    if volume_name is not None:
        if (found := mounting(containers)) is not None:
            return str(found["name"])
        if mounting(inits) is not None:
            return str(containers[0]["name"]) if containers else None
    if (found := reading(containers)) is not None:
        return str(found["name"])
    if reading(inits) is not None:
        return str(containers[0]["name"]) if containers else None
    if not auto and containers:
        return str(containers[0]["name"])
    return None


def should_reload(
    kind: str, name: str, source_annotations: Mapping[str, str], obj: Mapping[str, Any]
) -> bool | None:
    """ShouldReload: None not at all, else whether it is an `auto` (True) or a named one."""
    prefix = "configmap" if kind == "ConfigMap" else "secret"
    reload_key, typed = (
        f"{prefix}.reloader.stakater.com/reload",
        f"{prefix}.reloader.stakater.com/auto",
    )
    if source_annotations.get("reloader.stakater.com/ignore") == "true":
        return None
    own = obj["metadata"].get("annotations") or {}
    theirs = (obj["spec"]["template"].get("metadata") or {}).get("annotations") or {}
    keys = (reload_key, "reloader.stakater.com/auto", typed, "reloader.stakater.com/search")
    read = own if any(k in own for k in keys) else theirs
    excluded = own.get(f"{prefix}s.exclude.reloader.stakater.com/reload", "")
    if name in [e.strip() for e in excluded.split(",") if excluded]:
        return None
    for entry in read.get(reload_key, "").split(","):
        with contextlib.suppress(re.error):
            if re.fullmatch(entry.strip(), name):
                return False
    if read.get("reloader.stakater.com/search") == "true" and (
        source_annotations.get("reloader.stakater.com/match") == "true"
    ):
        return True
    if read.get("reloader.stakater.com/auto", "") in _TRUE or read.get(typed, "") in _TRUE:
        return True
    return None


class Reloader:
    def __init__(
        self, kube: Kube, *namespaces: str, strategy: str = "env-vars", delay: float = 0.0
    ) -> None:
        assert strategy in ("env-vars", "annotations")
        self.kube, self.namespaces = kube, namespaces
        self.strategy, self.delay = strategy, delay
        self.patched: list[tuple[str, str, str]] = []  # (kind, name, kind/source) it patched
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._follow, args=(ns, resource, kind), daemon=True)
            for ns in namespaces
            for resource, kind in (("configmaps", "ConfigMap"), ("secrets", "Secret"))
        ]
        self._ready = threading.Barrier(len(self._threads) + 1)

    def __enter__(self) -> Reloader:
        for t in self._threads:
            t.start()
        self._ready.wait(timeout=30)  # every watch listed: a change from now on is seen
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)

    def _list(self, ns: str, resource: str, kind: str) -> tuple[dict[str, str], str]:
        listed = self.kube.get(path(resource, ns))
        shas = {o["metadata"]["name"]: sha(kind, o) for o in listed.get("items") or ()}
        return shas, listed["metadata"]["resourceVersion"]

    def _follow(self, ns: str, resource: str, kind: str) -> None:
        shas, rv = self._list(ns, resource, kind)
        with contextlib.suppress(threading.BrokenBarrierError):
            self._ready.wait(timeout=30)
        while not self._stop.is_set():
            with (
                contextlib.suppress(KubeError),
                self.kube.watch(path(resource, ns), rv, timeout_seconds=5) as stream,
            ):
                for event in stream:
                    if event.get("type") == "ERROR":  # (410: its version expired; list again)
                        shas, rv = self._list(ns, resource, kind)
                        break
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    name = (obj.get("metadata") or {}).get("name")
                    if event.get("type") == "ADDED":
                        shas[name] = sha(kind, obj)  # (no reload on create: Reloader's default)
                    elif event.get("type") == "MODIFIED":
                        new = sha(kind, obj)
                        if shas.get(name) != new:
                            shas[name] = new
                            self._changed(ns, kind, obj, new)
                    elif event.get("type") == "DELETED":
                        shas.pop(name, None)
                    if self._stop.is_set():
                        return

    def _changed(self, ns: str, kind: str, source: Mapping[str, Any], digest: str) -> None:
        if self._stop.wait(self.delay):
            return
        name = source["metadata"]["name"]
        annotations = source["metadata"].get("annotations") or {}
        for resource, workload_kind in _KINDS:
            for obj in self.kube.get(path(resource, ns)).get("items") or ():
                auto = should_reload(kind, name, annotations, obj)
                if auto is None:
                    continue
                spec = obj["spec"]["template"]["spec"]
                container = _container(spec, kind, name, auto)
                if container is None:
                    continue  # NoContainerFound
                if self.strategy == "env-vars":
                    var = env_name(name, kind)
                    env = next(c for c in spec["containers"] if c["name"] == container).get("env")
                    if any(e.get("name") == var and e.get("value") == digest for e in env or ()):
                        continue  # NotUpdated
                    body: dict[str, Any] = {
                        "spec": {"template": {"spec": {"containers": [
                            {"name": container, "env": [{"name": var, "value": digest}]}
                        ]}}}
                    }  # fmt: skip
                else:
                    record = {
                        "type": "CONFIGMAP" if kind == "ConfigMap" else "SECRET",
                        "name": name,
                        "namespace": ns,
                        "hash": digest,
                        "containerRefs": [container],
                        "observedAt": int(time.time()),
                    }
                    body = {
                        "spec": {"template": {"metadata": {"annotations": {
                            "reloader.stakater.com/last-reloaded-from": json.dumps(record)
                        }}}}
                    }  # fmt: skip
                try:
                    self.kube.patch(
                        path(resource, ns, obj["metadata"]["name"]),
                        body,
                        content_type=STRATEGIC,
                        fieldManager="Reloader",
                    )
                except KubeError as e:
                    self.errors.append(str(e))
                    continue
                with self._lock:
                    self.patched.append(
                        (workload_kind, obj["metadata"]["name"], f"{kind.lower()}/{name}")
                    )
