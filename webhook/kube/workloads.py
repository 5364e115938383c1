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
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from webhook.core.kinds import WorkloadKind, custom_kinds, rolled_kinds
from webhook.core.model import JSONObject, PatchOp
from webhook.kube.errors import Conflict, KubeError, NotFound
from webhook.kube.ratelimit import LimitedKube
from webhook.kube.raw import Kube, path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Served:
    """A workload kind (webhook.core.kinds) at the version this cluster serves it at."""

    entry: WorkloadKind
    prefix: str  # /apis/apps/v1

    @property
    def kind(self) -> str:
        return self.entry.kind

    @property
    def resource(self) -> str:
        return self.entry.resource

    @property
    def api_version(self) -> str:
        return self.prefix.removeprefix("/apis/").removeprefix("/api/")

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        return path(self.entry.resource, namespace, name, prefix=self.prefix)


def _serves(kube: Kube, prefix: str, resource: str) -> bool:
    try:
        doc = kube.get(prefix)
    except NotFound:
        return False
    return any(r.get("name") == resource for r in doc.get("resources") or ())


def served_prefix(kube: Kube, kind: WorkloadKind) -> str | None:
    """Where the cluster serves `kind`: the first of its versions it serves (CronJobs: batch/v1
    from Kubernetes 1.21, batch/v1beta1 before). A built-in kind with one version is taken as
    served there without asking; a custom one is asked about (its CRD may not be installed).
    None when none is served."""
    if len(kind.versions) == 1 and not kind.custom:
        return kind.prefix()
    for version in kind.versions:
        if _serves(kube, kind.prefix(version), kind.resource):
            return kind.prefix(version)
    return None


def served_custom_kinds(kube: Kube) -> list[Served]:
    """The configured custom kinds (`webhook.core.kinds.custom_kinds`) this cluster serves:
    a kind whose CRD is not installed is left out, quietly (raises KubeError if discovery
    fails for another reason)."""
    kinds = []
    for custom in custom_kinds():
        prefix = served_prefix(kube, custom)
        if prefix is not None:
            kinds.append(Served(custom, prefix))
        else:
            log.info("%s is not served here: not watching it", custom)
    return kinds


def discover_kinds(kube: Kube) -> list[Served]:
    """The workload kinds to watch on this cluster (raises KubeError if discovery fails)."""
    kinds = []
    for kind in rolled_kinds():
        if kind.custom:
            continue
        prefix = served_prefix(kube, kind)
        if prefix is None:
            log.warning(
                "this cluster serves no %ss (%s): not watching them",
                kind.kind,
                " or ".join(kind.prefix(v).removeprefix("/apis/") for v in kind.versions),
            )
        else:
            kinds.append(Served(kind, prefix))
    return kinds + served_custom_kinds(kube)


class Decides(Protocol):
    """A decision on a freshly read workload: patch it with `ops` (none: leave it)."""

    @property
    def ops(self) -> list[PatchOp]: ...


D = TypeVar("D", bound=Decides)


@dataclass(frozen=True, slots=True)
class UpdateResult(Generic[D]):
    decision: D | None  # the last decision made (None: the workload was gone before one)
    read: JSONObject | None  # the object that decision was made from
    written: JSONObject | None = None  # as the API server stored it (None: nothing written)
    gone: bool = False  # deleted before it could be written
    conflicts: int = 0

    @property
    def patched(self) -> bool:
        return self.written is not None


class TooManyConflicts(KubeError):
    pass


def update_workload(
    kube: Kube | LimitedKube,
    api_path: str,
    decide: Callable[[JSONObject], D],
    *,
    attempts: int = 5,
    backoff: float = 0.01,
    on_conflict: Callable[[], None] = lambda: None,
    prepare: Callable[[JSONObject, D], D] | None = None,
    before_write: Callable[[JSONObject], None] | None = None,
) -> UpdateResult[D]:
    """Read the workload, decide, write the decision guarded by the read's resourceVersion;
    on 409 read again and decide again, at most `attempts` times.

    `decide` makes no request of its own: what it needs besides the workload is read once,
    before it (webhook.controller.reconcile.Prelude), so that a conflict reads the workload
    again and nothing else. `prepare(obj, decision)` does what must be done before the write
    (other objects made to exist; it may answer another decision): once per distinct need,
    by its own account, since a conflict decides again. `before_write` runs between the read
    and the write (tests use it to provoke a conflict).
    A workload that is gone is skipped; other API errors propagate.
    """
    conflicts = 0
    decision: D | None = None
    obj: JSONObject | None = None
    for attempt in range(attempts):
        try:
            obj = kube.get(api_path)
        except NotFound:
            return UpdateResult(decision, obj, gone=True, conflicts=conflicts)
        decision = decide(obj)
        if prepare is not None:
            decision = prepare(obj, decision)
        if not decision.ops:
            return UpdateResult(decision, obj, conflicts=conflicts)
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        guard: PatchOp = {"op": "replace", "path": "/metadata/resourceVersion", "value": rv}
        if before_write is not None:
            before_write(obj)
        try:
            written = kube.patch(api_path, [guard, *decision.ops])
        except NotFound:
            return UpdateResult(decision, obj, gone=True, conflicts=conflicts)
        except Conflict:
            conflicts += 1
            on_conflict()
            # client-go's DefaultRetry: 10 ms steps with a little jitter.
            time.sleep(backoff * (1 + random.random() * 0.1) * (attempt + 1))  # noqa: S311
            continue
        return UpdateResult(decision, obj, written, conflicts=conflicts)
    raise TooManyConflicts(f"PATCH {api_path}", 409, f"still conflicting after {attempts} tries")
