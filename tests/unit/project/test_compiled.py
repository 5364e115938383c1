"""Which build of the decision core the tests run against, and that the checkout never holds a
compiled module.

`make test` runs the unit tests twice: against the editable install (pure Python) and against
the wheel with `webhook/core` compiled by mypyc (hack/compiled-tree.py, which sets
CONFIGPIN_EXPECT_COMPILED=1). A test run that meant to exercise the compiled modules but
imported the sources, or the reverse, fails here instead of passing for the wrong build.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import webhook
from webhook.core.kinds import ARGO_ROLLOUT
from webhook.core.model import Plan, SnapshotRequest, SourceId, SourceKind, SourceRecord
from webhook.core.preview import SourceWrite

CORE = Path(webhook.__file__).parent / "core"
MODULES = sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")
EXPECT_COMPILED = os.environ.get("CONFIGPIN_EXPECT_COMPILED") == "1"


def _is_extension(module: object) -> bool:
    origin = str(getattr(module, "__file__", ""))
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


@pytest.mark.parametrize("name", MODULES)
def test_the_core_module_is_the_build_under_test(name: str) -> None:
    module = importlib.import_module(f"webhook.core.{name}")
    assert _is_extension(module) is EXPECT_COMPILED, module.__file__


def test_no_compiled_module_shadows_a_source_in_the_checkout() -> None:
    # Python imports an extension module before the .py beside it: one left in the source
    # tree would keep running after its source is edited.
    if EXPECT_COMPILED:
        pytest.skip("this run is the unpacked wheel, compiled on purpose")
    stale = [
        p
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        for p in Path(webhook.__file__).parent.rglob(f"*{suffix}")
    ]
    assert stale == []


def test_the_values_handed_to_the_large_review_worker_pickle() -> None:
    sid = SourceId(SourceKind.CONFIGMAP, "app")
    record = SourceRecord(
        SourceKind.SECRET, "s", {"k": b"\x00\x01"}, "Opaque", False, None, "u", "7"
    )
    record.memo[(b"key", None)] = "memoized"
    plan = Plan(
        patch=[{"op": "add", "path": "/x", "value": 1}],
        warnings=["w"],
        snapshots=[SnapshotRequest(sid, "app-0123456789", "digest")],
        sources={"configmap/app": "d"},
        mode="snapshot",
        kept=True,
        on_change="refresh",
    )
    write = SourceWrite(
        SourceKind.CONFIGMAP, "app", False, None, frozenset({"k"}), record, "a", "b", True, True
    )
    values = [sid, record, plan, ARGO_ROLLOUT, write]
    assert [pickle.loads(pickle.dumps(v)) for v in values] == values
    assert pickle.loads(pickle.dumps(record)).memo == {}  # a cache, not carried
    # In a fresh process, as the worker gets them (a compiled frozen class that unpickled in
    # the process that made it failed there).
    done = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; print(repr(pickle.load(sys.stdin.buffer)))"],
        input=pickle.dumps(values),
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(Path(webhook.__file__).parents[1])},
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == repr(values)
