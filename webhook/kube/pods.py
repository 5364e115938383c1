"""The running pods of a workload, and the one write configpin makes on a pod.

A workload's pods are found the way its own controller finds them: by its label selector,
then by the ownership chain (Deployment -> ReplicaSet -> Pod, CronJob -> Job -> Pod, every
other kind -> Pod), so that a pod of another workload whose labels happen to match is never
touched. The only write is one annotation, by a merge patch that carries the resourceVersion
it was planned from (a precondition: 409 if the pod changed since, then read again).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from webhook.core.kinds import builtin, workload_kind
from webhook.core.model import JSONObject
from webhook.kube.errors import Conflict, NotFound
from webhook.kube.ratelimit import LimitedKube
from webhook.kube.raw import MERGE_PATCH, Kube, path

log = logging.getLogger(__name__)

_ATTEMPTS: Final = 5
_DONE: Final = frozenset({"Succeeded", "Failed"})


def selector_text(selector: Any) -> str | None:
    """A label selector as the `labelSelector` query parameter: a LabelSelector
    (matchLabels, matchExpressions) or a ReplicationController's plain map. None for an
    empty or unreadable one: it would select every pod of the namespace."""
    if not isinstance(selector, dict):
        return None
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        labels: Any = selector  # a ReplicationController's selector
        expressions: Any = ()
    else:
        labels = selector.get("matchLabels") or {}
        expressions = selector.get("matchExpressions") or ()
    if not isinstance(labels, dict) or not isinstance(expressions, list | tuple):
        return None
    parts = [f"{k}={v}" for k, v in sorted(labels.items()) if isinstance(v, str)]
    for e in expressions:
        if not isinstance(e, dict) or not isinstance(key := e.get("key"), str):
            return None
        op, values = e.get("operator"), e.get("values") or []
        if op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        elif op in ("In", "NotIn") and all(isinstance(v, str) for v in values):
            parts.append(f"{key} {'in' if op == 'In' else 'notin'} ({','.join(values)})")
        else:
            return None
    return ",".join(parts) or None


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") is True:
            return str(ref.get("uid") or "") or None
    return None


def _items(kube: Kube, api_path: str, selector: str | None) -> Iterator[JSONObject]:
    for page in kube.list_pages(api_path, labelSelector=selector):
        yield from page.get("items") or ()


def _owned(items: Iterable[JSONObject], owners: set[str]) -> list[JSONObject]:
    return [i for i in items if controller_uid(i) in owners]


def workload_pods(kube: Kube, kind: str, obj: JSONObject) -> list[JSONObject]:
    """The live pods (not finished, not being deleted) the workload `obj` of `kind` owns,
    directly or through the kind its pods are owned through (webhook.core.kinds: a
    Deployment's ReplicaSets, a CronJob's unfinished Jobs)."""
    meta = obj.get("metadata") or {}
    namespace, uid = str(meta.get("namespace") or ""), str(meta.get("uid") or "")
    if not namespace or not uid:
        return []
    entry = workload_kind(kind)
    via = builtin(entry.pods_via) if entry is not None and entry.pods_via else None
    spec = obj.get("spec") or {}
    # A workload with a selector (a Deployment) selects its pods with it, through whichever
    # of its owned objects; one without (a CronJob) leaves that to each object it owns.
    selector = selector_text(spec.get("selector")) if "selector" in spec else None
    if selector is None and ("selector" in spec or via is None):
        return []  # an empty or unreadable selector would select every pod of the namespace
    pods_path = path("pods", namespace)
    owners = {uid}
    pods: list[JSONObject] = []
    if via is not None:
        owned = _owned(
            _items(kube, path(via.resource, namespace, prefix=via.prefix()), selector), {uid}
        )
        owned = [o for o in owned if not (o.get("status") or {}).get("completionTime")]
        owners = {str((o.get("metadata") or {}).get("uid") or "") for o in owned}
        if selector is None:
            for o in owned:
                own_selector = selector_text((o.get("spec") or {}).get("selector"))
                if own_selector is not None:
                    pods += _owned(_items(kube, pods_path, own_selector), owners)
    if selector is not None:
        pods = _owned(_items(kube, pods_path, selector), owners)
    return [
        p
        for p in pods
        if not (p.get("metadata") or {}).get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in _DONE
    ]


def annotate_pod(kube: Kube | LimitedKube, pod: JSONObject, key: str, value: str) -> bool:
    """Set one annotation of `pod` to `value`, guarded by the resourceVersion it was read
    at; on a conflict read it again (same uid only) and retry. False when it already held
    the value, or is gone. Other API errors (Forbidden...) propagate."""
    meta = pod.get("metadata") or {}
    namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    api_path = path("pods", str(namespace), str(name))
    for _ in range(_ATTEMPTS):
        meta = pod.get("metadata") or {}
        if (meta.get("annotations") or {}).get(key) == value:
            return False
        rv = meta.get("resourceVersion")
        body = {"metadata": {"resourceVersion": rv, "annotations": {key: value}}}
        try:
            kube.patch(api_path, body, content_type=MERGE_PATCH)
            return True
        except NotFound:
            return False
        except Conflict:
            try:
                pod = kube.get(api_path)
            except NotFound:
                return False
            if (pod.get("metadata") or {}).get("uid") != uid:
                return False  # another pod of the same name now
    raise Conflict(f"PATCH {api_path}", 409, f"still conflicting after {_ATTEMPTS} tries")
