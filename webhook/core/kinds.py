"""The workload kinds: one table, read by admission, the controller, snapshots and status.

Each built-in kind is one entry: where it is served, where it keeps its pod template, and what
configpin may do with it. The custom kinds an operator configures (`--workload-kinds`, Argo
Rollouts) are entries of the same shape, made at start. Adding a built-in kind is one entry
here plus the chart (its RBAC, webhook rules and policy), which
tests/unit/project/test_chart.py holds to this table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

Path = tuple[str | int, ...]


class RolloutStyle(StrEnum):
    """How a kind's status says a rolling update of its pods went (webhook.core.progress)."""

    DEPLOYMENT = "deployment"
    STATEFULSET = "statefulset"
    DAEMONSET = "daemonset"


class CopyOwner(StrEnum):
    """How an object of a kind owns the snapshot copies its pod template points at."""

    NEVER = "never"  # its revisions own them (a Deployment's ReplicaSets), or nothing does
    FOR_LIFE = "for-life"  # its template never changes: it owns them while it exists
    WHILE_POINTING = "while-pointing"  # only while its template points at them (a CronJob)


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    """A kind of object with a pod template."""

    kind: str
    group: str  # "" for the core group
    versions: tuple[str, ...]  # the versions it is served at, the one to prefer first
    resource: str
    template: tuple[str, ...]  # where the pod template (its metadata and spec) is; () for a Pod
    admitted: bool = True  # the webhook pins it (a ControllerRevision is only ever read)
    rolls: bool = False  # its template can change after creation: the controller re-stamps it
    refreshable: bool = False  # configpin finds its running pods (on-change: refresh)
    revisions: str | None = None  # the kind that keeps each version of its template
    pods_via: str | None = None  # the kind its pods are owned through (a Deployment's ReplicaSets)
    copies: CopyOwner = CopyOwner.NEVER
    # how its status says a rolling update went (webhook.core.progress), where re-stamping its
    # template replaces its pods; None: nothing to follow (its pods are not replaced)
    rollout: RolloutStyle | None = None
    short_names: tuple[str, ...] = ()  # as kubectl knows them (`configpin status`)
    custom: bool = False  # configured by the operator, not built in

    @property
    def api_version(self) -> str:
        """Of the preferred version: `apps/v1`, `v1`."""
        return f"{self.group}/{self.versions[0]}" if self.group else self.versions[0]

    def prefix(self, version: str | None = None) -> str:
        """The API path prefix of `version` (default: the preferred one): `/apis/apps/v1`."""
        version = version or self.versions[0]
        return f"/apis/{self.group}/{version}" if self.group else f"/api/{version}"

    @property
    def meta_path(self) -> Path:
        return (*self.template, "metadata")

    @property
    def spec_path(self) -> Path:
        return (*self.template, "spec")

    def __str__(self) -> str:
        if not self.custom:
            return self.kind
        return (
            f"{self.group}/{self.versions[0]}/{self.resource}/{self.kind}={'.'.join(self.template)}"
        )

    def __reduce__(self) -> tuple[type[WorkloadKind], tuple[Any, ...]]:
        # (handed to the large-review worker: see SourceRecord.__reduce__)
        return WorkloadKind, (
            self.kind,
            self.group,
            self.versions,
            self.resource,
            self.template,
            self.admitted,
            self.rolls,
            self.refreshable,
            self.revisions,
            self.pods_via,
            self.copies,
            self.rollout,
            self.short_names,
            self.custom,
        )

    @classmethod
    def parse(cls, text: str) -> WorkloadKind:
        """A custom kind, `group/version/resource/Kind=path.to.template` (the template holds
        `metadata` and `spec`, as a Deployment's `spec.template` does). Raises ValueError
        saying what is wrong and what is expected."""
        example = "expected group/version/resource/Kind=path, e.g. "
        example += "apps.kruise.io/v1alpha1/clonesets/CloneSet=spec.template"
        gvrk, sep, template = text.strip().partition("=")
        parts = gvrk.split("/")
        if not sep or len(parts) != 4:
            raise ValueError(f"{text!r}: {example}")
        group, version, resource, kind = parts
        fields = tuple(template.split("."))
        problems = []
        if not _GROUP.match(group):
            problems.append(f"group {group!r} is not a DNS subdomain with a dot (as a CRD's)")
        elif _RESERVED_GROUP.search(group):
            problems.append(f"group {group!r} is one of Kubernetes' own")
        if not _VERSION.match(version):
            problems.append(f"version {version!r} is not like v1, v1beta1, v1alpha1")
        if not _RESOURCE.match(resource):
            problems.append(f"resource {resource!r} is not a lower-case plural name")
        if not _KIND.match(kind):
            problems.append(f"Kind {kind!r} is not a CamelCase kind name")
        elif kind in _BUILTIN:
            problems.append(f"Kind {kind!r} is a built-in workload kind")
        if not all(_FIELD.match(f) for f in fields):
            problems.append(f"template path {template!r} is not dot-separated field names")
        if problems:
            raise ValueError(f"{text!r}: {'; '.join(problems)} ({example})")
        return _custom_kind(group, version, resource, kind, fields)


def _custom_kind(
    group: str, version: str, resource: str, kind: str, template: tuple[str, ...]
) -> WorkloadKind:
    """A custom kind: pinned and re-stamped as a Deployment is; its pods are its own
    controller's business (it rolls instead of refreshing); it owns the copies its template
    points at while it does (its own revisions, an Argo ReplicaSet or an OpenKruise
    ControllerRevision, own what they use for as long as they exist)."""
    return WorkloadKind(
        kind,
        group,
        (version,),
        resource,
        template,
        rolls=True,
        copies=CopyOwner.WHILE_POINTING,
        custom=True,
    )


_SPEC_TEMPLATE: Final = ("spec", "template")
POD: Final = "Pod"  # the one kind whose template is the object itself

BUILTIN_KINDS: Final[tuple[WorkloadKind, ...]] = (
    WorkloadKind(POD, "", ("v1",), "pods", (), copies=CopyOwner.FOR_LIFE, short_names=("po",)),
    WorkloadKind(
        "Deployment",
        "apps",
        ("v1",),
        "deployments",
        _SPEC_TEMPLATE,
        rolls=True,
        refreshable=True,
        revisions="ReplicaSet",
        pods_via="ReplicaSet",
        rollout=RolloutStyle.DEPLOYMENT,
        short_names=("deploy",),
    ),
    WorkloadKind(
        "StatefulSet",
        "apps",
        ("v1",),
        "statefulsets",
        _SPEC_TEMPLATE,
        rolls=True,
        refreshable=True,
        revisions="ControllerRevision",
        rollout=RolloutStyle.STATEFULSET,
        short_names=("sts",),
    ),
    WorkloadKind(
        "DaemonSet",
        "apps",
        ("v1",),
        "daemonsets",
        _SPEC_TEMPLATE,
        rolls=True,
        refreshable=True,
        revisions="ControllerRevision",
        rollout=RolloutStyle.DAEMONSET,
        short_names=("ds",),
    ),
    WorkloadKind(
        "ReplicaSet",
        "apps",
        ("v1",),
        "replicasets",
        _SPEC_TEMPLATE,
        rolls=True,
        refreshable=True,
        copies=CopyOwner.FOR_LIFE,
        short_names=("rs",),
    ),
    WorkloadKind(
        "ReplicationController",
        "",
        ("v1",),
        "replicationcontrollers",
        _SPEC_TEMPLATE,
        rolls=True,
        refreshable=True,
        short_names=("rc",),
    ),
    WorkloadKind("Job", "batch", ("v1",), "jobs", _SPEC_TEMPLATE, copies=CopyOwner.FOR_LIFE),
    # batch/v1 serves CronJobs from Kubernetes 1.21; batch/v1beta1 before (and until 1.25).
    WorkloadKind(
        "CronJob",
        "batch",
        ("v1", "v1beta1"),
        "cronjobs",
        ("spec", "jobTemplate", "spec", "template"),
        rolls=True,
        refreshable=True,
        revisions="Job",
        pods_via="Job",
        copies=CopyOwner.WHILE_POINTING,
        short_names=("cj",),
    ),
    # A StatefulSet's or DaemonSet's revision: a copy of its template, never admitted.
    WorkloadKind(
        "ControllerRevision",
        "apps",
        ("v1",),
        "controllerrevisions",
        ("data", "spec", "template"),
        admitted=False,
        copies=CopyOwner.FOR_LIFE,
    ),
)
_BUILTIN: Final[Mapping[str, WorkloadKind]] = {k.kind: k for k in BUILTIN_KINDS}
# (group, Kind) of every built-in kind: an owner of one of these is configpin's own business.
BUILTIN_GROUP_KINDS: Final = frozenset((k.group, k.kind) for k in BUILTIN_KINDS)
# kind -> (path of the pod template's metadata, path of the pod spec), for admitted kinds
_PATHS: Final[Mapping[str, tuple[Path, Path]]] = {
    k.kind: (k.meta_path, k.spec_path) for k in BUILTIN_KINDS if k.admitted
}

# Admitted kinds whose pod template cannot change after creation (a Pod, a Job): only their
# CREATE is mutated, and nothing ever rolls or refreshes them.
_FIXED_TEMPLATE: Final = frozenset(k.kind for k in BUILTIN_KINDS if k.admitted and not k.rolls)

_GROUP: Final = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$"
)
_VERSION: Final = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$")
_RESOURCE: Final = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
_KIND: Final = re.compile(r"^[A-Z][A-Za-z0-9]{0,62}$")
_FIELD: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# Groups of Kubernetes' own APIs: their kinds are known, never configured.
_RESERVED_GROUP: Final = re.compile(r"(^|\.)(k8s\.io|kubernetes\.io)$")


ARGO_ROLLOUT: Final = _custom_kind("argoproj.io", "v1alpha1", "rollouts", "Rollout", _SPEC_TEMPLATE)
"""Argo Rollouts' Rollout: pinned as a Deployment is, when its CRD is served (a Rollout with
`spec.workloadRef` has no template of its own: see `workload_ref`)."""


def parse_custom_kinds(text: str) -> tuple[WorkloadKind, ...]:
    """A comma-separated list of `WorkloadKind.parse` entries; a Kind may appear once."""
    kinds: list[WorkloadKind] = []
    for item in text.split(","):
        if not item.strip():
            continue
        kind = WorkloadKind.parse(item)
        if any(k.kind == kind.kind for k in kinds):
            raise ValueError(f"{item.strip()!r}: Kind {kind.kind!r} is configured twice")
        kinds.append(kind)
    return tuple(kinds)


# Custom kinds this process handles: set once at start (`use_custom_kinds`) by `serve`,
# `render` and `status`, and in the worker process for large reviews.
_custom: dict[str, WorkloadKind] = {}


def use_custom_kinds(kinds: Iterable[WorkloadKind]) -> None:
    """Handle exactly these custom kinds from now on (their Kinds must be distinct, and none
    a built-in one: `parse_custom_kinds` makes sure)."""
    chosen = {k.kind: k for k in kinds if k.kind not in _BUILTIN}
    _custom.clear()
    _custom.update(chosen)


def custom_kinds() -> tuple[WorkloadKind, ...]:
    return tuple(_custom.values())


def custom_kind(kind: str) -> WorkloadKind | None:
    return _custom.get(kind)


def builtin(kind: str) -> WorkloadKind | None:
    return _BUILTIN.get(kind)


def workload_kind(kind: str) -> WorkloadKind | None:
    """The entry of a built-in or configured kind (None: not one configpin knows)."""
    return _BUILTIN.get(kind) or _custom.get(kind)


def admitted_kinds() -> tuple[WorkloadKind, ...]:
    """What the webhook pins: the built-in kinds it admits, then the configured ones."""
    return (*(k for k in BUILTIN_KINDS if k.admitted), *_custom.values())


def rolled_kinds() -> tuple[WorkloadKind, ...]:
    """What the controller watches and re-stamps on a change (built-in, then configured)."""
    return (*(k for k in BUILTIN_KINDS if k.rolls), *_custom.values())


def is_workload_kind(kind: str) -> bool:
    return kind in _PATHS or kind in _custom


def template_paths(kind: str) -> tuple[Path, Path] | None:
    """(metadata path, pod spec path) for a workload kind, None for kinds we do not handle."""
    found = _PATHS.get(kind)
    if found is not None:
        return found
    custom = _custom.get(kind)
    if custom is None:
        return None
    return custom.meta_path, custom.spec_path


def fixed_template(kind: str) -> bool:
    """Whether objects of `kind` keep the pod template they were created with."""
    return kind in _FIXED_TEMPLATE


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def kind_matches(obj: Mapping[str, Any]) -> bool:
    """Whether the object is of the API group its kind is handled in. An object read from a
    list carries no apiVersion (the caller knows what it listed): that passes. A custom
    resource of another group that happens to share a handled Kind's name does not."""
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str) or not api_version:
        return True
    known = workload_kind(str(obj.get("kind", "")))
    return known is not None and known.admitted and group_of(api_version) == known.group


def workload_ref(obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """An Argo Rollout's `spec.workloadRef`: (apiVersion, kind, name) of the workload whose
    template the Rollout runs, always in the Rollout's own namespace (Argo resolves it there;
    the field has no namespace, and one written there anyway is not read). None when the
    object is not a Rollout with a well-formed workloadRef."""
    if obj.get("kind") != ARGO_ROLLOUT.kind:
        return None
    spec = obj.get("spec")
    ref = spec.get("workloadRef") if isinstance(spec, dict) else None
    if not isinstance(ref, dict):
        return None
    values = (ref.get("apiVersion"), ref.get("kind"), ref.get("name"))
    if not all(isinstance(v, str) for v in values):
        return None
    return str(values[0]), str(values[1]), str(values[2])
