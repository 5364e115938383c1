"""Who made what a rollout rolls to (webhook/controller/editors.py): the signed record admission
left on the source, read once per change however many workers roll it at once."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.unit.conftest import HKEY
from webhook.controller.editors import UNKNOWN, Editors, Rolled
from webhook.core import digest
from webhook.core.constants import ANN_CHANGED_BY
from webhook.core.model import SourceId, SourceKind
from webhook.core.preview import ChangedBy
from webhook.core.record import Change

NS = "shop"
CFG = SourceId(SourceKind.CONFIGMAP, "web-config")
NOW = 1_800_000_000.0


def _source(
    data: dict[str, str], *, by: str | None = "alice", keys: frozenset[str] = frozenset({"a"})
) -> tuple[dict[str, Any], Rolled]:
    """ConfigMap `web-config` holding `data`, changed by `by` (None: no record), and what a
    reader of its `keys` rolls to."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CFG.name, "namespace": NS, "annotations": {}},
        "data": data,
    }
    record = digest.record_from_object(HKEY, CFG.kind, obj)
    content = digest.source_digest(HKEY, record)
    if by is not None:
        text = ChangedBy(by, NOW, digest.content_id(content)).encode(HKEY, NS, CFG)
        obj["metadata"]["annotations"][ANN_CHANGED_BY] = text
    to = digest.source_digest(digest.namespace_key(HKEY, NS), record, keys)
    return obj, Rolled(Change.of(NS, CFG, content, shared=False), keys, to)


class SlowKube:
    """The API server: each GET takes a while, and is counted."""

    def __init__(self, obj: dict[str, Any], delay: float = 0.05) -> None:
        self.obj, self.delay, self.gets = obj, delay, 0
        self._lock = threading.Lock()

    def get(self, _path: str, **_params: Any) -> dict[str, Any]:
        with self._lock:
            self.gets += 1
        time.sleep(self.delay)
        return self.obj


def test_the_editor_is_read_once_per_change_however_many_workers_ask_at_once() -> None:
    obj, rolled = _source({"a": "2"})
    kube = SlowKube(obj)
    editors = Editors(kube, HKEY)  # type: ignore[arg-type]
    said: list[str] = []
    workers = [
        threading.Thread(target=lambda: said.append(editors.of(NS, (rolled,)))) for _ in range(8)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert kube.gets == 1
    assert len(said) == 8 and all(s.startswith("alice at ") for s in said)
    assert editors.of(NS, (rolled,)) == said[0] and kube.gets == 1  # remembered


def test_a_change_without_configpins_record_is_unknown() -> None:
    obj, rolled = _source({"a": "2"}, by=None)  # written while configpin was down, say
    kube = SlowKube(obj, delay=0)
    editors = Editors(kube, HKEY)  # type: ignore[arg-type]
    assert editors.of(NS, (rolled,)) == UNKNOWN
    assert editors.of(NS, (rolled,)) == UNKNOWN and kube.gets == 1  # remembered as such


def test_a_change_the_source_moved_on_from_is_unknown_and_asked_again() -> None:
    _, rolled = _source({"a": "2"})
    moved, _ = _source({"a": "3"})  # its record is gone with that content
    kube = SlowKube(moved, delay=0)
    editors = Editors(kube, HKEY)  # type: ignore[arg-type]
    assert editors.of(NS, (rolled,)) == UNKNOWN
    assert editors.of(NS, (rolled,)) == UNKNOWN and kube.gets == 2  # not remembered


def test_a_source_that_moved_on_only_in_other_keys_keeps_who_made_what_it_reads() -> None:
    """alice changed `a`; bob then changed `b` (his record carries hers on, for `a`): a
    reader of `a` rolling to alice's content is credited to her, a reader of `b` to bob."""
    obj, rolled = _source({"a": "2", "b": "2"})
    content = rolled.change.content
    alice = ChangedBy.first("alice", NOW, "0" * 20, frozenset({"a"}))
    bob = alice.after("bob", NOW + 60, content, frozenset({"b"}))
    obj["metadata"]["annotations"][ANN_CHANGED_BY] = bob.encode(HKEY, NS, CFG)
    editors = Editors(SlowKube(obj, delay=0), HKEY)  # type: ignore[arg-type]
    assert editors.of(NS, (rolled,)).startswith("alice at ")
    _, of_b = _source({"a": "2", "b": "2"}, keys=frozenset({"b"}))
    assert editors.of(NS, (of_b,)).startswith("bob at ")
    _, of_all = _source({"a": "2", "b": "2"}, keys=None)  # type: ignore[arg-type]
    assert editors.of(NS, (of_all,)).startswith("bob at ")
