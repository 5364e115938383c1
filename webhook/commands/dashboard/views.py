"""The dashboard's other pages as data, worked out from what the feeds hold (a `Snapshot`):
`sources`, `source`, who uses which key of each ConfigMap and Secret, how, and what a change
does there; `workloads`, what `configpin status` reports, with the last rollouts. The changes
pages are changes.py's, how a workload is read workload.py's.

Pure: no cluster call and no clock; a workload's status is handed in by `status_of`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from webhook.commands.dashboard.feeds import Note, Snapshot
from webhook.commands.dashboard.workload import (
    PAGE,
    UNSIGNED,
    StatusOf,
    Use,
    WorkloadRef,
    mode_of,
    on_change,
    on_failure,
    record_of,
    ref_of,
    replicas_of,
    uses,
)
from webhook.core.constants import (
    ANN_CHANGED_BY,
)
from webhook.core.model import JSONObject
from webhook.core.record import annotations_of, digest_mapping_any

# --- used by -----------------------------------------------------------------------------------


def _source_key(kind: str, name: str) -> str:
    return f"{kind}/{name}"


def _all_consumers(
    snapshot: Snapshot,
) -> dict[tuple[str, str, str], list[tuple[JSONObject, list[Use]]]]:
    """(kind, namespace, name) of a source -> the workloads that read it, with how."""
    out: dict[tuple[str, str, str], list[tuple[JSONObject, list[Use]]]] = {}
    for obj in snapshot.workloads:
        ns = ref_of(obj)[1]
        for key, its_uses in uses(obj).items():
            kind, _, name = key.partition("/")
            out.setdefault((kind, ns, name), []).append((obj, its_uses))
    return out


def _page(items: Sequence[Any], page: int, size: int = PAGE) -> tuple[list[Any], int, int]:
    pages = max(1, math.ceil(len(items) / size))
    page = min(max(1, page), pages)
    return list(items[(page - 1) * size : page * size]), page, pages


def sources(snapshot: Snapshot, query: str = "", page: int = 1) -> dict[str, Any]:
    """Every ConfigMap and Secret of the scope (and those workloads read that are missing),
    with how many workloads read each."""
    consumers = _all_consumers(snapshot)
    known = {(s.kind, s.namespace, s.name): s for s in snapshot.sources if not s.copy}
    keys = sorted(set(known) | set(consumers), key=lambda k: (k[1], k[0], k[2]))
    if query:
        q = query.lower()
        keys = [k for k in keys if q in f"{k[0]}/{k[1]}/{k[2]}".lower()]
    shown, page, pages = _page(keys, page)
    rows = []
    for kind, ns, name in shown:
        source = known.get((kind, ns, name))
        record = digest_mapping_any(source.annotations.get(ANN_CHANGED_BY)) if source else {}
        rows.append(
            {
                "kind": kind,
                "namespace": ns,
                "name": name,
                "consumers": len(consumers.get((kind, ns, name), ())),
                "keys": len(source.keys) if source and source.keys is not None else None,
                "missing": source is None,
                "changed_by": record.get("user"),
                "changed_at": record.get("at"),
            }
        )
    return {"sources": rows, "total": len(keys), "page": page, "pages": pages}


def source(
    snapshot: Snapshot,
    kind: str,
    namespace: str,
    name: str,
    secret_keys: Callable[[str, str], tuple[tuple[str, ...] | None, str]],
) -> dict[str, Any]:
    """Who uses which key of one source: for each key, the workloads that read it, how, and
    what a change of it does there."""
    found = next(
        (s for s in snapshot.sources if (s.kind, s.namespace, s.name) == (kind, namespace, name)),
        None,
    )
    keys: tuple[str, ...] | None
    keys_note = ""
    if found is None:
        keys, keys_note = None, "not found (or not readable): what its consumers name is listed"
    elif found.keys is not None:
        keys = found.keys
    else:
        keys, keys_note = secret_keys(namespace, name)
    readers = _all_consumers(snapshot).get((kind, namespace, name), [])
    by_key: dict[str, list[dict[str, Any]]] = {k: [] for k in keys or ()}
    every: list[dict[str, Any]] = []
    for obj, its_uses in readers:
        wkind, _, wname = ref_of(obj)
        change_does = on_change(obj, _source_key(kind, name), its_uses)
        for use in its_uses:
            entry = {
                "kind": wkind,
                "name": wname,
                "how": use.how,
                "where": use.where,
                "optional": use.optional,
                "on_change": change_does,
                "on_failure": on_failure(obj),
            }
            if use.keys is None:
                if keys is None:
                    every.append(entry)
                for k in keys or ():
                    by_key[k].append(entry)
            else:
                for k in sorted(use.keys):
                    by_key.setdefault(k, []).append(entry)
    present = set(keys or ())
    out_keys = [
        {
            "key": k,
            "missing": keys is not None and k not in present,
            "consumers": sorted(by_key[k], key=lambda e: (e["kind"], e["name"], e["where"])),
        }
        for k in sorted(by_key)
    ]
    record = digest_mapping_any(found.annotations.get(ANN_CHANGED_BY)) if found else {}
    return {
        "kind": kind,
        "namespace": namespace,
        "name": name,
        "found": found is not None,
        "keys_known": keys is not None,
        "keys_note": keys_note,
        "keys": out_keys,
        "every_key": sorted(every, key=lambda e: (e["kind"], e["name"], e["where"])),
        "workloads": len(readers),
        "changed_by": record.get("user"),
        "changed_at": record.get("at"),
        "changed_keys": record.get("keys"),
    }


# --- workloads ---------------------------------------------------------------------------------


def last_rollouts(notes: Iterable[Note], ref: WorkloadRef, most: int = 4) -> list[dict[str, Any]]:
    """The latest rollout Events about a workload, newest first."""
    mine = [n for n in notes if (n.kind, n.namespace, n.name) == ref]
    mine.sort(key=lambda n: -n.at)
    return [{"reason": n.reason, "type": n.type, "at": n.at, "note": n.note} for n in mine[:most]]


def workload_refs(snapshot: Snapshot, query: str = "") -> list[JSONObject]:
    objs = sorted(snapshot.workloads, key=lambda o: (ref_of(o)[1], ref_of(o)[0], ref_of(o)[2]))
    if query:
        q = query.lower()
        objs = [o for o in objs if q in "/".join(ref_of(o)).lower()]
    return objs


def workloads(
    snapshot: Snapshot, status_of: StatusOf, query: str = "", page: int = 1
) -> dict[str, Any]:
    """What `configpin status` reports on each workload (a page of them), with its sources,
    the copies it uses and its last rollouts."""
    objs = workload_refs(snapshot, query)
    shown, page, pages = _page(objs, page)
    rows = []
    for obj in shown:
        kind, ns, name = ref_of(obj)
        status = status_of(obj)
        record = record_of(obj)
        row: dict[str, Any] = {
            "namespace": ns,
            "kind": kind,
            "name": name,
            "checking": status is None,
            "state": str(status.get("state")) if status else "checking",
            "reason": str(status.get("reason") or "") if status else "",
            "mode": str(status.get("mode")) if status else (mode_of(obj) or "default"),
            "sources": [
                {"source": s.get("source"), "state": s.get("state")}
                for s in (status.get("sources") or [] if status else [])
            ],
            "copies": list(status.get("copies") or []) if status else [],
            "rolled_at": str(annotations_of(obj).get("configpin.io/rolled-at") or ""),
            "replicas": replicas_of(obj),
            "rollout": {
                k: record.get(k) for k in ("state", "since", "by", "signal", "action", "changes")
            }
            if record
            else None,
            "last": last_rollouts(snapshot.notes, (kind, ns, name)),
        }
        rows.append(row)
    return {"workloads": rows, "total": len(objs), "page": page, "pages": pages, "said": UNSIGNED}
