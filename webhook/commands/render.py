"""`configpin render`: what admission would make of a set of manifests, offline.

Every input document comes out, in order and as it was written, except the pod templates
admission would change (and, in snapshot mode, the copies, each just before the first
document that points at it; inside a List, as an item of that List). ConfigMaps and Secrets
are read as the API server stores them, so the digests equal the server's for the same key
and namespace.

Outcome: 0 when everything is pinned; 1 on findings (a required source missing from the input,
a source the API server would refuse), the output still printed; 2 on input that cannot be
used (not YAML/JSON, not a Kubernetes object), nothing printed unless `skip_invalid`.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

import jsonpatch

from webhook.core.digest import BadSource, copy_signature, record_from_object
from webhook.core.kinds import is_workload_kind
from webhook.core.model import (
    SOURCE_API_KINDS,
    JSONObject,
    PatchOp,
    SourceId,
    SourceKind,
    SourceRecord,
    SourceUnavailable,
    source_kind,
    typed_source_kind,
)
from webhook.core.plan import plan_object
from webhook.core.snapshot import snapshot_object
from webhook.inputs.manifests import STDIN, Document, InputError, decode, dump, read_text

EXIT_OK: Final = 0
EXIT_FINDINGS: Final = 1
EXIT_UNUSABLE: Final = 2

_SUFFIXES: Final = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Options:
    mode: str = "checksum"
    namespace: str = "default"
    allow_missing: tuple[str, ...] = ()
    skip_invalid: bool = False


@dataclass
class Outcome:
    output: str
    messages: list[str] = field(default_factory=list)
    status: int = EXIT_OK


# ---- reading ------------------------------------------------------------------------------


def _files(path: str) -> Iterator[str]:
    if path == STDIN:
        yield path
        return
    p = Path(path)
    if p.is_dir():
        found = sorted(f for f in p.rglob("*") if f.suffix in _SUFFIXES and f.is_file())
        yield from (str(f) for f in found)
    else:
        yield path


def read_inputs(
    paths: Sequence[str], stdin: BinaryIO | None = None
) -> tuple[list[Document], list[InputError]]:
    """Every document of every file, in order; a file that fails keeps what came before."""
    docs: list[Document] = []
    errors: list[InputError] = []
    for path in paths:
        for file in _files(path):
            name = "<stdin>" if file == STDIN else file
            try:
                if file == STDIN:
                    if stdin is None:
                        raise InputError("<stdin>", 1, "no standard input")
                    data = stdin.read()
                else:
                    with open(name, "rb") as fh:
                        data = fh.read()
            except OSError as e:
                errors.append(InputError(name, 0, e.strerror or "cannot be read"))
                continue
            try:
                docs.extend(read_text(decode(data, name), name))
            except InputError as e:
                errors.append(e)
    return docs, errors


def _is_list(obj: JSONObject) -> bool:
    kind = obj.get("kind")
    return isinstance(kind, str) and kind.endswith("List") and "items" in obj


def _check_metadata(obj: JSONObject) -> str | None:
    meta = obj.get("metadata")
    if meta is None:
        return None
    if not isinstance(meta, dict):
        return f"metadata is a {type(meta).__name__}, not a mapping"
    for key in ("name", "namespace", "generateName"):
        if key in meta and meta[key] is not None and not isinstance(meta[key], str):
            return f"metadata.{key} is not a string"
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            return f"metadata.{key} is not a mapping"
        for k, v in value.items():
            if not isinstance(k, str) or not (v is None or isinstance(v, str)):
                return f"metadata.{key}[{k!r}] is not a string (quote it)"
    return None


def check_object(obj: Any) -> str | None:
    """Why the API server could not take this as an object (None: it could)."""
    if not isinstance(obj, dict):
        return f"not a Kubernetes object (a {type(obj).__name__}, not a mapping)"
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        return "not a Kubernetes object: no kind"
    if not isinstance(obj.get("apiVersion"), str) or not obj["apiVersion"]:
        return f"{kind}: no apiVersion"
    if _is_list(obj) and not isinstance(obj["items"], list):
        return f"{kind}: items is not a list"
    return _check_metadata(obj)


def _label(obj: JSONObject) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "?"
    ns = meta.get("namespace")
    return f"{obj.get('kind')}/{ns}/{name}" if ns else f"{obj.get('kind')}/{name}"


# ---- sources ------------------------------------------------------------------------------


def _go_key(key: Any) -> Any:
    """A non-string mapping key as sigs.k8s.io/yaml writes it into JSON."""
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if key is None:
        return "null"
    return key


def _as_stored(kind: SourceKind, obj: JSONObject) -> JSONObject:
    """Keys of data maps as the API server receives them (`1:` is the key "1")."""
    out = obj
    for name, _, _ in kind.facts.content:
        value = obj.get(name)
        if isinstance(value, dict) and not all(isinstance(k, str) for k in value):
            if out is obj:
                out = dict(obj)
            out[name] = {_go_key(k): v for k, v in value.items()}
    return out


@dataclass
class _Source:
    record: SourceRecord | BadSource
    obj: JSONObject
    where: str


class Sources:
    """The ConfigMaps and Secrets of the input, by namespace; the last of a name wins, as it
    would after `kubectl apply` of the whole input."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, SourceId], _Source] = {}

    def add(self, hkey: bytes, namespace: str, obj: JSONObject, where: str) -> BadSource | None:
        kind = source_kind(obj["kind"])
        name = (obj.get("metadata") or {}).get("name")
        if kind is None:
            return None
        if not name:
            return None
        record: SourceRecord | BadSource
        try:
            record = record_from_object(hkey, kind, _as_stored(kind, obj))
        except BadSource as e:
            record = e
        self._by_key[(namespace, SourceId(kind, name))] = _Source(record, obj, where)
        return record if isinstance(record, BadSource) else None

    def get(self, namespace: str, sid: SourceId) -> SourceRecord | None:
        found = self._by_key.get((namespace, sid))
        if found is None:
            return None
        if isinstance(found.record, BadSource):
            raise SourceUnavailable(str(found.record))
        return found.record

    def get_object(self, namespace: str, sid: SourceId) -> JSONObject | None:
        found = self._by_key.get((namespace, sid))
        return None if found is None else found.obj


def allowed_missing(patterns: Iterable[str], sid: SourceId) -> bool:
    """`KIND/NAME` patterns (kind case-insensitive, `configmap`/`cm`/`secret`; glob names)."""
    for pattern in patterns:
        kind, _, name = pattern.partition("/")
        typed = typed_source_kind(kind)  # (else a glob of kinds)
        kind = typed.value if typed is not None else kind.lower()
        if fnmatch.fnmatchcase(sid.kind.value, kind) and fnmatch.fnmatchcase(sid.name, name):
            return True
    return False


def check_allow_missing(pattern: str) -> str | None:
    kind, sep, name = pattern.partition("/")
    if not sep or not kind or not name:
        example = "secret/db-password or 'secret/*'"
        return f"--allow-missing {pattern!r}: expected KIND/NAME, e.g. {example}"
    return None


# ---- rendering ----------------------------------------------------------------------------


@dataclass
class _Renderer:
    hkey: bytes
    options: Options
    sources: Sources = field(default_factory=Sources)
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    emitted: set[tuple[str, str]] = field(default_factory=set)

    def namespace_of(self, obj: JSONObject) -> str:
        return str((obj.get("metadata") or {}).get("namespace") or self.options.namespace)

    def workload(self, obj: JSONObject, where: str) -> tuple[JSONObject, list[JSONObject], bool]:
        """The object as admission would make it, the copies it needs first, and whether it
        changed."""
        namespace = self.namespace_of(obj)
        missing: set[SourceId] = set()

        def lookup(sid: SourceId) -> SourceRecord | None:
            record = self.sources.get(namespace, sid)
            if record is None:
                missing.add(sid)
            return record

        plan = plan_object(
            obj, hkey=self.hkey, lookup=lookup, default_mode=self.options.mode, namespace=namespace
        )
        allowed = {
            f"{sid} not found:"
            for sid in missing
            if allowed_missing(self.options.allow_missing, sid)
        }
        label = _label(obj)
        for warning in plan.warnings:
            if any(warning.startswith(prefix) for prefix in allowed):
                continue
            if warning in plan.problems:
                self.findings.append(f"{where}: {label}: {warning}")
            else:
                self.notes.append(f"{where}: warning: {label}: {warning}")
        # In place: the object was read for this render alone and nothing else holds it.
        out = apply_patch(obj, plan.patch) if plan.patch else obj
        copies: list[JSONObject] = []
        for req in plan.snapshots:
            if (namespace, req.snapshot_name) in self.emitted:
                continue
            if self.sources.get_object(namespace, SourceId(req.source.kind, req.snapshot_name)):
                continue  # the input has it already (render of render's own output)
            source = self.sources.get_object(namespace, req.source)
            if source is None:
                continue
            self.emitted.add((namespace, req.snapshot_name))
            signature = copy_signature(self.hkey, namespace, req.snapshot_name, req.content_digest)
            copies.append(
                snapshot_object(
                    req.source.kind,
                    source,
                    req.snapshot_name,
                    signature=signature,
                    namespace=namespace,
                )
            )
        return out, copies, bool(plan.patch)


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~") if "~" in token else token


def apply_patch(obj: JSONObject, ops: list[PatchOp]) -> JSONObject:
    """Apply, in place, the add/replace/remove operations a plan is made of (the general
    library costs more than the rest of planning; anything else is handed to it)."""
    if any(op["op"] not in ("add", "replace", "remove") for op in ops):
        result: JSONObject = jsonpatch.apply_patch(obj, ops, in_place=True)
        return result
    for op in ops:
        *parents, last = [_unescape(t) for t in op["path"].split("/")[1:]]
        target: Any = obj
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        if isinstance(target, list):
            if op["op"] == "remove":
                del target[int(last)]
            elif op["op"] == "add":
                target.insert(len(target) if last == "-" else int(last), op["value"])
            else:
                target[int(last)] = op["value"]
        elif op["op"] == "remove":
            del target[last]
        else:
            target[last] = op["value"]
    return obj


def _is_workload(obj: JSONObject) -> bool:
    return is_workload_kind(str(obj.get("kind", "")))


def render(
    hkey: bytes, docs: list[Document], errors: list[InputError], options: Options
) -> Outcome:
    """Render documents already read (`read_inputs`); `errors` are the reading failures."""
    unusable = [str(e) for e in errors]
    r = _Renderer(hkey, options)

    # Pass 1: check every object, index the sources.
    kept: list[tuple[Document, list[bool]]] = []  # per List: which items are usable
    for doc in docs:
        problem = check_object(doc.obj)
        if problem is not None:
            unusable.append(f"{doc.where()}: {problem}")
            continue
        usable: list[bool] = []
        objs: list[tuple[Any, str]] = []
        if _is_list(doc.obj):
            for i, item in enumerate(doc.obj["items"]):
                item_problem = check_object(item)
                if item_problem is not None:
                    unusable.append(f"{doc.where(i)}: items[{i}]: {item_problem}")
                usable.append(item_problem is None)
                objs.append((item, doc.where(i)))
        else:
            objs.append((doc.obj, doc.where()))
        for i, (obj, where) in enumerate(objs):
            if usable and not usable[i]:
                continue
            if obj["kind"] in SOURCE_API_KINDS:
                bad = r.sources.add(hkey, r.namespace_of(obj), obj, where)
                if bad is not None:
                    r.findings.append(
                        f"{where}: {_label(obj)}: {bad} (the API server would refuse it)"
                    )
        kept.append((doc, usable))

    if unusable and not options.skip_invalid:
        return Outcome("", unusable, EXIT_UNUSABLE)
    messages = [f"{m} (skipped)" for m in unusable]

    # Pass 2: plan the workloads, write every document out.
    parts: list[str] = []
    for doc, usable in kept:
        try:
            parts.extend(_render_document(r, doc, usable))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as e:
            problem = f"{doc.where()}: cannot be rendered: {type(e).__name__}: {e}"
            if not options.skip_invalid:
                return Outcome("", [problem], EXIT_UNUSABLE)
            messages.append(f"{problem} (skipped)")
        except jsonpatch.JsonPatchException as e:
            problem = f"{doc.where()}: cannot be rendered: {e}"
            if not options.skip_invalid:
                return Outcome("", [problem], EXIT_UNUSABLE)
            messages.append(f"{problem} (skipped)")
    messages.extend(r.notes)
    messages.extend(r.findings)
    status = EXIT_FINDINGS if r.findings else EXIT_OK
    return Outcome("".join(parts), messages, status)


def _render_document(r: _Renderer, doc: Document, usable: list[bool]) -> list[str]:
    obj: JSONObject = doc.obj
    if _is_list(obj):
        items: list[Any] = []
        changed = not all(usable)
        for i, item in enumerate(obj["items"]):
            if not usable[i]:
                continue
            if _is_workload(item):
                new, copies, patched = r.workload(item, doc.where(i))
                changed = changed or patched or bool(copies)
                items.extend(copies)
                items.append(new)
            else:
                items.append(item)
        if not changed and doc.text is not None:
            return [doc.text]
        return [dump({**obj, "items": items})]
    if _is_workload(obj):
        new, copies, patched = r.workload(obj, doc.where())
        out = [dump(c) for c in copies]
        out.append(doc.text if not patched and doc.text is not None else dump(new))
        return out
    return [doc.text if doc.text is not None else dump(obj)]


def stdin_is_terminal() -> bool:
    try:
        return os.isatty(0)
    except OSError:  # pragma: no cover
        return False
