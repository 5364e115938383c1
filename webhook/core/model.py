"""Plain values the core works with. Wire formats stay dicts; internal values are frozen."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, TypeAlias

JSONObject: TypeAlias = dict[str, Any]
PatchOp: TypeAlias = dict[str, Any]


class SourceKind(StrEnum):
    CONFIGMAP = "configmap"
    SECRET = "secret"

    @property
    def api_kind(self) -> str:
        return "ConfigMap" if self is SourceKind.CONFIGMAP else "Secret"


class SourceId(NamedTuple):
    """A ConfigMap or Secret by kind and name (in the namespace at hand).

    A named tuple, not a dataclass: it is a dict key on the admission hot path, and a
    tuple hashes and compares in C."""

    kind: SourceKind
    name: str

    def __str__(self) -> str:
        """The key used in the `configpin.io/sources` annotation: `configmap/<name>`."""
        return self.kind + "/" + self.name  # a StrEnum is its value: no `.value` lookup

    @classmethod
    def parse(cls, text: str) -> SourceId:
        kind, _, name = text.partition("/")
        return cls(SourceKind(kind), name)


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """What configpin knows of one ConfigMap or Secret: digests of its keys, never its values.

    `key_digests` maps each key (of `data`, `binaryData` or, for Secrets, `stringData`) to a
    short keyed digest of that key's field, name and value. Everything else is computed from
    these, so a cache can hold records without holding a single value.
    """

    kind: SourceKind
    name: str
    key_digests: Mapping[str, bytes]
    secret_type: str | None = None
    ignored: bool = False
    snapshot_of: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    # Source digests already computed for this record, by (digest key, consumed keys). The
    # record is immutable, so they stay true; admission asks the same question every time.
    memo: dict[tuple[bytes, frozenset[str] | None], str] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def id(self) -> SourceId:
        return SourceId(self.kind, self.name)

    def __reduce__(self) -> tuple[type[SourceRecord], tuple[Any, ...]]:
        # Pickled (to the large-review worker) by its fields, never by setting them one by one
        # on a frozen instance, which a compiled class refuses; the memo is left behind.
        return SourceRecord, (
            self.kind,
            self.name,
            self.key_digests,
            self.secret_type,
            self.ignored,
            self.snapshot_of,
            self.uid,
            self.resource_version,
        )


class SourceUnavailable(Exception):
    """The source could not be read (API error, unreadable file). Admission goes on without it."""


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """A snapshot the plan points at: it must exist (with this content) before the object does."""

    source: SourceId
    snapshot_name: str
    content_digest: str

    def __reduce__(self) -> tuple[type[SnapshotRequest], tuple[Any, ...]]:
        return SnapshotRequest, (self.source, self.snapshot_name, self.content_digest)


@dataclass(frozen=True)
class Plan:
    """The outcome of planning one object: what to patch, what to say, what must exist."""

    patch: list[PatchOp] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    snapshots: list[SnapshotRequest] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    observed: dict[str, str] = field(default_factory=dict)
    mode: str = "off"
    skipped: str | None = None
    # An UPDATE that left the pod template as it was: its record is kept as it is, unplanned.
    kept: bool = False
    on_change: str = "roll"  # the workload's policy for changes, as it is honoured

    @property
    def changed(self) -> bool:
        return bool(self.patch)

    def __reduce__(self) -> tuple[type[Plan], tuple[Any, ...]]:
        # (the large-review worker's answer)
        return Plan, (
            self.patch,
            self.warnings,
            self.problems,
            self.snapshots,
            self.sources,
            self.observed,
            self.mode,
            self.skipped,
            self.kept,
            self.on_change,
        )
