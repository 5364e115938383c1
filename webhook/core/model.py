"""Plain values the core works with. Wire formats stay dicts; internal values are frozen.

The source kinds (ConfigMap, Secret) are one table here (`SourceKind` and its `SourceFacts`),
as the workload kinds are one in webhook.core.kinds: every module reads it, none keeps a
table of its own (tests/unit/project/test_one_place.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, NamedTuple, Protocol, TypeAlias

from webhook.core.constants import HELM_RELEASE_TYPE
from webhook.core.reasons import SkipReason

JSONObject: TypeAlias = dict[str, Any]
PatchOp: TypeAlias = dict[str, Any]


class SourceKind(StrEnum):
    """A kind of object whose content pods consume. Its value names it in configpin's
    annotations and digests (`configmap/<name>`: never changed); its other facts are its
    `facts` (`SOURCE_FACTS`)."""

    CONFIGMAP = "configmap"
    SECRET = "secret"

    @property
    def facts(self) -> SourceFacts:
        return SOURCE_FACTS[self]

    @property
    def api_kind(self) -> str:
        """As the API names it: `ConfigMap`."""
        return SOURCE_FACTS[self].api_kind

    @property
    def resource(self) -> str:
        """Its resource, as API paths name it: `configmaps`."""
        return SOURCE_FACTS[self].resource


class ContentField(NamedTuple):
    """A field of a source's content: how its values are written, and the field its keys are
    digested under (a Secret's `stringData` is merged into `data` by the API server)."""

    name: str
    base64: bool
    digested_as: str


@dataclass(frozen=True, slots=True)
class SourceFacts:
    """What configpin knows of a source kind: one entry of `SOURCE_FACTS`."""

    api_kind: str  # ConfigMap
    resource: str  # configmaps
    names: tuple[str, ...]  # what a person types for it (lower case; kubectl's names)
    volume: str  # its field in a pod's volume and in a projected volume's sources: configMap
    volume_name: str  # the field of the name in that volume's (a Secret's: secretName)
    key_ref: str  # an env var's valueFrom field: configMapKeyRef
    env_from: str  # an envFrom entry's field: configMapRef
    content: tuple[ContentField, ...]  # the fields of its content, in the order they apply
    default_type: str | None = None  # the type the API server gives one that names none
    unwatched_types: tuple[str, ...] = ()  # types no pod consumes: left out of the watch
    api_version: str = "v1"  # (the core group)

    @property
    def prefix(self) -> str:
        """The API path prefix of its resource: `/api/v1`."""
        return f"/api/{self.api_version}"


SOURCE_FACTS: Final[Mapping[SourceKind, SourceFacts]] = {
    SourceKind.CONFIGMAP: SourceFacts(
        "ConfigMap",
        "configmaps",
        ("configmap", "configmaps", "cm"),
        volume="configMap",
        volume_name="name",
        key_ref="configMapKeyRef",
        env_from="configMapRef",
        content=(
            ContentField("data", False, "data"),
            ContentField("binaryData", True, "binaryData"),
        ),
    ),
    SourceKind.SECRET: SourceFacts(
        "Secret",
        "secrets",
        ("secret", "secrets"),
        volume="secret",
        volume_name="secretName",
        key_ref="secretKeyRef",
        env_from="secretRef",
        content=(ContentField("data", True, "data"), ContentField("stringData", False, "data")),
        default_type="Opaque",
        unwatched_types=(HELM_RELEASE_TYPE,),
    ),
}
_BY_API_KIND: Final[Mapping[str, SourceKind]] = {f.api_kind: k for k, f in SOURCE_FACTS.items()}
_BY_NAME: Final[Mapping[str, SourceKind]] = {n: k for k, f in SOURCE_FACTS.items() for n in f.names}
SOURCE_API_KINDS: Final = frozenset(_BY_API_KIND)  # ConfigMap, Secret


def source_kind(api_kind: str) -> SourceKind | None:
    """The source kind an object's `kind` names (`ConfigMap`); None: not a source."""
    return _BY_API_KIND.get(api_kind)


def typed_source_kind(text: str) -> SourceKind | None:
    """The source kind a person names (`cm`, `configmap`, `Secrets`: any case); None: none."""
    return _BY_NAME.get(text.lower())


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
    shared: bool = False  # configpin.io/shared: its changes are one across namespaces
    approved: str | None = None  # the content (`digest.content_id`) a valid approval names
    # the content a valid `approve --now` names (it rolls now, whatever its windows and budget)
    approved_now: str | None = None
    # What it says to Stakater Reloader (webhook.core.reloader.source_mark): "ignore", "match"
    reloader: str | None = None
    # Who paused the content it holds now, and when ("USER at TIME": a valid `configpin pause`
    # of this very content, webhook.core.verbs); None: not paused
    paused_by: str | None = None
    # Who aborted the content it holds now, and when (`configpin abort` of this very content)
    aborted_by: str | None = None
    # When `configpin retry` of the content it holds now was said (seconds since the epoch),
    # and by whom: failures of it that ended before then are rolled again
    retried: tuple[float, str] | None = None
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
            self.shared,
            self.approved,
            self.approved_now,
            self.reloader,
            self.paused_by,
            self.aborted_by,
            self.retried,
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


_PLAN_FIELDS: Final = (
    "patch",
    "warnings",
    "problems",
    "snapshots",
    "sources",
    "observed",
    "mode",
    "skipped",
    "kept",
    "on_change",
)


class Plan:
    """The outcome of planning one object: what to patch, what to say, what must exist.

    Read-only (its fields are Final). A plain class rather than a frozen dataclass: one is
    made per admission, and a frozen dataclass's `__init__` (a `__setattr__` per field) costs
    the compiled core several times as much."""

    __slots__ = _PLAN_FIELDS

    def __init__(
        self,
        patch: list[PatchOp] | None = None,
        warnings: list[str] | None = None,
        problems: list[str] | None = None,
        snapshots: list[SnapshotRequest] | None = None,
        sources: dict[str, str] | None = None,
        observed: dict[str, str] | None = None,
        mode: str = "off",
        skipped: SkipReason | None = None,
        kept: bool = False,
        on_change: str = "roll",
    ) -> None:
        self.patch: Final[list[PatchOp]] = [] if patch is None else patch
        self.warnings: Final[list[str]] = [] if warnings is None else warnings
        self.problems: Final[list[str]] = [] if problems is None else problems
        self.snapshots: Final[list[SnapshotRequest]] = [] if snapshots is None else snapshots
        self.sources: Final[dict[str, str]] = {} if sources is None else sources
        self.observed: Final[dict[str, str]] = {} if observed is None else observed
        self.mode: Final = mode
        self.skipped: Final = skipped
        # An UPDATE that left the pod template as it was: its record is kept, unplanned.
        self.kept: Final = kept
        self.on_change: Final = on_change  # the workload's policy for changes, as honoured

    @property
    def changed(self) -> bool:
        return bool(self.patch)

    def said(self, warnings: list[str], on_change: str) -> Plan:
        """The same plan, with these warnings and this on-change policy."""
        fields = list(self._fields())
        fields[1], fields[-1] = warnings, on_change  # (in the order of __init__)
        return Plan(*fields)

    def _fields(self) -> tuple[Any, ...]:
        return (
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

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # (lists inside: as a dataclass's would be)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(_PLAN_FIELDS, self._fields(), strict=True))
        return f"Plan({inner})"

    def __reduce__(self) -> tuple[type[Plan], tuple[Any, ...]]:
        # (the large-review worker's answer; positional, in the order of __init__)
        return Plan, self._fields()


class SnapshotEnsurer(Protocol):
    """What may point a template at snapshot copies: makes them exist first (the snapshot
    writer, webhook.kube.copies.SnapshotWriter; tests give fakes)."""

    def ensure(
        self,
        namespace: str,
        requests: Sequence[SnapshotRequest],
        *,
        dry_run: bool,
        on_created: Callable[[JSONObject], None] | None = None,
    ) -> list[str]:
        """Make every requested copy exist with its content; return warnings. Blocks.
        `on_created` is called with each copy it created (as the API server stored it).

        Raises on failure: the object must then not point at a copy that does not exist."""
        ...

    def settled(self, namespace: str, requests: Sequence[SnapshotRequest]) -> bool:
        """True when, from memory alone, every copy already exists as requested: `ensure`
        would do nothing. Never blocks."""
        ...
