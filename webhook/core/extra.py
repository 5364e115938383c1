"""The sources a workload names on its own metadata, `configpin.io/extra-sources`, beside those
its pod spec references: ConfigMaps and Secrets its application reads itself (through the API,
or a file some other tool writes), which configpin pins and rolls the workload for as though
the pod spec referenced them whole (every key counts: nothing says which keys it reads). The
counterpart of Reloader's `configmap.reloader.stakater.com/reload` and wave's
`extra-configmaps`.

`configmap/NAME,secret/NAME` (commas, spaces around them ignored): in the workload's own
namespace only, as a pod spec's references are; a name is a ConfigMap's or Secret's legal name.
An entry that is neither is left out, with a warning that names it. A source named there has no
place in the pod spec: it is never rewritten to a snapshot copy, and a change of it cannot reach
a running process in place (`configpin.io/on-change: refresh` rolls for it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from webhook.core.constants import ANN_EXTRA_SOURCES
from webhook.core.model import SourceId, SourceKind
from webhook.core.names import is_dns1123_subdomain
from webhook.core.record import annotations_of
from webhook.core.refs import Consumption, source_key

# As many as a pod spec may name (webhook.core.plan's max_sources bounds the sum); past it the
# rest of the value is not read (a hostile value of a megabyte costs one split at most).
MAX_EXTRA: Final = 256
_KINDS: Final[dict[str, SourceKind]] = {k.value: k for k in SourceKind}
_NONE: Final[frozenset[str]] = frozenset()


def extra_sources(obj: Mapping[str, Any]) -> tuple[list[SourceId], list[str]]:
    """The sources `configpin.io/extra-sources` on `obj`'s own metadata names, in its order
    without repeats, and a warning for the entries that name none."""
    value = annotations_of(obj).get(ANN_EXTRA_SOURCES)
    if not isinstance(value, str) or not value.strip():
        return [], []
    found: list[SourceId] = []
    seen: set[SourceId] = set()
    bad: list[str] = []
    for part in value.split(",", MAX_EXTRA)[:MAX_EXTRA]:
        entry = part.strip()
        if not entry:
            continue
        kind_text, slash, name = entry.partition("/")
        kind = _KINDS.get(kind_text.lower())
        if not slash or kind is None or not is_dns1123_subdomain(name):
            bad.append(entry[:80])
            continue
        sid = SourceId(kind, name)
        if sid not in seen:
            seen.add(sid)
            found.append(sid)
    warnings = []
    if bad:
        shown = ", ".join(repr(b) for b in bad[:5]) + (" ..." if len(bad) > 5 else "")
        warnings.append(
            f"{ANN_EXTRA_SOURCES}: {shown} named no configmap/NAME or secret/NAME (a name of "
            "this namespace): left out"
        )
    return found, warnings


def with_extra(
    consumed: dict[SourceId, Consumption], extra: list[SourceId]
) -> dict[SourceId, Consumption]:
    """`consumed` (a pod spec's, webhook.core.refs.consumption) with the extra sources added,
    every key of each counted; in (kind, name) order, as `consumption` gives it. A source the
    pod spec references too keeps its sites and what it requires, and counts whole."""
    if not extra:
        return consumed
    out = dict(consumed)
    for sid in extra:
        had = out.get(sid)
        if had is None:
            out[sid] = Consumption(sid, None, False, _NONE, ())
        elif had.keys is not None:
            out[sid] = Consumption(sid, None, had.required, had.required_keys, had.sites)
    return {sid: out[sid] for sid in sorted(out, key=source_key)}
