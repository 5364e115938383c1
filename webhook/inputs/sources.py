"""Where admission reads ConfigMaps and Secrets from, behind one small interface.

`FileSources` reads manifests from files: the embedded default of `configpin serve` with no
cluster, and what `configpin render` uses. The cluster-backed reader lives in `webhook.kube`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Final, Protocol

from webhook.core.digest import BadSource, record_from_object
from webhook.core.model import JSONObject, SourceId, SourceRecord, SourceUnavailable, source_kind

# The embedded default ships as package data (pyproject.toml), found where the package is
# (the source tree, an installed wheel, a zip), never beside a module that may move.
EMBEDDED_PACKAGE: Final = "webhook"
EMBEDDED_FOLDER: Final = "embedded"
MANIFEST_SUFFIXES: Final = (".yaml", ".yml", ".json")


class Miss:
    """Returned by `peek` when the answer is not in memory and a read would be needed."""


MISS: Final = Miss()


class SourceReader(Protocol):
    def peek(self, namespace: str, sid: SourceId) -> SourceRecord | Miss | None:
        """The answer from memory, or MISS. Never blocks."""
        ...

    def get(
        self, namespace: str, sid: SourceId, *, timeout: float | None = None
    ) -> SourceRecord | None:
        """The answer, reading through on a miss (may block, at most `timeout` seconds when
        given). Raises SourceUnavailable."""
        ...

    def get_object(self, namespace: str, sid: SourceId) -> JSONObject | None:
        """The whole object (values included), for copying into a snapshot. May block."""
        ...


def iter_manifests(paths: Iterable[Path]) -> Iterator[JSONObject]:
    """Every object in the YAML/JSON files named (folders: their *.yaml, *.yml, *.json), read
    as kubectl reads them (`webhook.inputs.manifests`, as `configpin render` does). Raises
    InputError (`file:line: what`) on a file that cannot be read as manifests."""
    # YAML only when files are read: a server reading its sources from the cluster never does.
    from webhook.inputs.manifests import decode, read_text  # noqa: PLC0415

    for path in paths:
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES)
        else:
            files = [path]
        for file in files:
            for doc in read_text(decode(file.read_bytes(), str(file)), str(file)):
                yield from _flatten(doc.obj)


def iter_embedded() -> Iterator[JSONObject]:
    """Every object of the embedded default (`webhook/embedded/*.yaml`), read through
    importlib.resources as package data. Raises FileNotFoundError naming the folder where the
    install lacks it."""
    from webhook.inputs.manifests import decode, read_text  # noqa: PLC0415

    folder = resources.files(EMBEDDED_PACKAGE).joinpath(EMBEDDED_FOLDER)
    files = sorted(
        (f for f in folder.iterdir() if f.is_file() and f.name.endswith(MANIFEST_SUFFIXES)),
        key=lambda f: f.name,
    )
    if not files:
        raise FileNotFoundError(f"no manifests in {EMBEDDED_PACKAGE}/{EMBEDDED_FOLDER}/")
    for file in files:
        where = f"{EMBEDDED_PACKAGE}/{EMBEDDED_FOLDER}/{file.name}"
        for doc in read_text(decode(file.read_bytes(), where), where):
            yield from _flatten(doc.obj)


def _flatten(doc: Any) -> Iterator[JSONObject]:
    if not isinstance(doc, dict):
        return
    if doc.get("kind") == "List" or (str(doc.get("kind", "")).endswith("List") and "items" in doc):
        for item in doc.get("items") or ():
            yield from _flatten(item)
    else:
        yield doc


class FileSources:
    """ConfigMaps and Secrets read from manifests once, digested, values kept for snapshots.

    An object without a namespace matches a lookup in any namespace.
    """

    def __init__(self, hkey: bytes, objects: Iterable[JSONObject]) -> None:
        self._records: dict[tuple[str | None, SourceId], SourceRecord | BadSource] = {}
        self._objects: dict[tuple[str | None, SourceId], JSONObject] = {}
        for obj in objects:
            kind = source_kind(str(obj.get("kind", "")))
            meta = obj.get("metadata") or {}
            if kind is None or not meta.get("name"):
                continue
            key = (meta.get("namespace"), SourceId(kind, meta["name"]))
            self._objects[key] = obj
            try:
                self._records[key] = record_from_object(hkey, kind, obj)
            except BadSource as e:
                self._records[key] = e

    @classmethod
    def from_paths(cls, hkey: bytes, paths: Iterable[Path]) -> FileSources:
        return cls(hkey, iter_manifests(paths))

    @classmethod
    def embedded(cls, hkey: bytes) -> FileSources:
        """The embedded default: what `configpin serve` serves with no cluster and no
        --manifests."""
        return cls(hkey, iter_embedded())

    def __len__(self) -> int:
        return len(self._records)

    def _find(self, namespace: str, sid: SourceId) -> tuple[str | None, SourceId] | None:
        for key in ((namespace, sid), (None, sid)):
            if key in self._records:
                return key
        return None

    def peek(self, namespace: str, sid: SourceId) -> SourceRecord | None:
        # Once per reference of every admission: one frame, as the cluster cache's.
        records = self._records
        record = records.get((namespace, sid)) or records.get((None, sid))
        if record is None:
            return None
        if isinstance(record, BadSource):
            raise SourceUnavailable(str(record))
        return record

    def get(
        self, namespace: str, sid: SourceId, *, timeout: float | None = None
    ) -> SourceRecord | None:
        return self.peek(namespace, sid)

    def get_object(self, namespace: str, sid: SourceId) -> JSONObject | None:
        key = self._find(namespace, sid)
        return None if key is None else self._objects[key]
