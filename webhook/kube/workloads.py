"""Workload access for the controller: where each kind is served, and a guarded update.

Every write of a workload is a JSON patch that begins by setting `metadata.resourceVersion`
to the version the patch was planned from. The API server treats a resourceVersion in a
patch as a precondition: if anyone wrote the object since it was read, the patch fails with
409 and nothing is written. The update is then planned again from a fresh read and retried
a bounded number of times (client-go `retry.RetryOnConflict`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from webhook.core.model import JSONObject, PatchOp
from webhook.core.refs import custom_kinds
from webhook.kube.errors import Conflict, KubeError, NotFound
from webhook.kube.ratelimit import LimitedKube
from webhook.kube.raw import Kube, path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    kind: str
    resource: str
    prefix: str

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        return path(self.resource, namespace, name, prefix=self.prefix)


_STATIC: Final = (
    WorkloadKind("Deployment", "deployments", "/apis/apps/v1"),
    WorkloadKind("StatefulSet", "statefulsets", "/apis/apps/v1"),
    WorkloadKind("DaemonSet", "daemonsets", "/apis/apps/v1"),
    WorkloadKind("ReplicaSet", "replicasets", "/apis/apps/v1"),
    WorkloadKind("ReplicationController", "replicationcontrollers", "/api/v1"),
)
_CRONJOB_VERSIONS: Final = ("/apis/batch/v1", "/apis/batch/v1beta1")


def _serves(kube: Kube, prefix: str, resource: str) -> bool:
    try:
        doc = kube.get(prefix)
    except NotFound:
        return False
    return any(r.get("name") == resource for r in doc.get("resources") or ())


def cronjob_prefix(kube: Kube) -> str | None:
    """Where CronJobs are served: batch/v1 from Kubernetes 1.21, batch/v1beta1 before.
    None when neither serves them."""
    for prefix in _CRONJOB_VERSIONS:
        if _serves(kube, prefix, "cronjobs"):
            return prefix
    return None


def served_custom_kinds(kube: Kube) -> list[WorkloadKind]:
    """The configured custom kinds (`webhook.core.refs.custom_kinds`) this cluster serves:
    a kind whose CRD is not installed is left out, quietly (raises KubeError if discovery
    fails for another reason)."""
    kinds = []
    for custom in custom_kinds():
        if _serves(kube, custom.prefix, custom.resource):
            kinds.append(WorkloadKind(custom.kind, custom.resource, custom.prefix))
        else:
            log.info("%s is not served here: not watching it", custom)
    return kinds


def discover_kinds(kube: Kube) -> list[WorkloadKind]:
    """The workload kinds to watch on this cluster (raises KubeError if discovery fails)."""
    kinds = list(_STATIC)
    prefix = cronjob_prefix(kube)
    if prefix is None:
        log.warning("this cluster serves no CronJobs (batch/v1 or v1beta1): not watching them")
    else:
        kinds.append(WorkloadKind("CronJob", "cronjobs", prefix))
    return kinds + served_custom_kinds(kube)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a freshly read workload: patch it with `ops`, or leave it (`skip`)."""

    ops: list[PatchOp]
    skip: str | None = None

    @classmethod
    def leave(cls, reason: str) -> Decision:
        return cls([], reason)


@dataclass(frozen=True, slots=True)
class UpdateResult:
    patched: bool
    skip: str | None  # why nothing was written (None when patched)
    conflicts: int
    obj: JSONObject | None  # the object as written (patched) or as last read
    ops: list[PatchOp] = field(default_factory=list)  # the operations written


class TooManyConflicts(KubeError):
    pass


def update_workload(
    kube: Kube | LimitedKube,
    api_path: str,
    decide: Callable[[JSONObject], Decision],
    *,
    attempts: int = 5,
    backoff: float = 0.01,
    on_conflict: Callable[[], None] = lambda: None,
    before_write: Callable[[JSONObject], None] | None = None,
) -> UpdateResult:
    """Read the workload, decide, write the decision guarded by the read's resourceVersion;
    on 409 read again and decide again, at most `attempts` times.

    `before_write` runs between the read and the write (tests use it to provoke a conflict).
    A workload that is gone is skipped; other API errors propagate.
    """
    conflicts = 0
    for attempt in range(attempts):
        try:
            obj = kube.get(api_path)
        except NotFound:
            return UpdateResult(False, "gone", conflicts, None)
        decision = decide(obj)
        if decision.skip is not None or not decision.ops:
            return UpdateResult(False, decision.skip or "unchanged", conflicts, obj)
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        guard: PatchOp = {"op": "replace", "path": "/metadata/resourceVersion", "value": rv}
        if before_write is not None:
            before_write(obj)
        try:
            written = kube.patch(api_path, [guard, *decision.ops])
        except NotFound:
            return UpdateResult(False, "gone", conflicts, None)
        except Conflict:
            conflicts += 1
            on_conflict()
            # client-go's DefaultRetry: 10 ms steps with a little jitter.
            time.sleep(backoff * (1 + random.random() * 0.1) * (attempt + 1))  # noqa: S311
            continue
        return UpdateResult(True, None, conflicts, written, decision.ops)
    raise TooManyConflicts(f"PATCH {api_path}", 409, f"still conflicting after {attempts} tries")
