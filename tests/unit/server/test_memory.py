"""Memory is given back once a burst of connections is over, not during it."""

from __future__ import annotations

import asyncio
import ctypes
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from webhook.process import allocator
from webhook.server import memory


def test_trims_once_enough_connections_closed_and_the_burst_is_over() -> None:
    trims: list[int] = []
    trimmer = memory.Trimmer(after=64, quiet=0.02, trim=lambda: trims.append(trimmer.closed))

    async def scenario() -> None:
        task = asyncio.create_task(trimmer.run())
        for _ in range(63):
            trimmer.note_closed()
        await asyncio.sleep(0.1)
        assert trims == []  # too few to be worth a trim
        for _ in range(200):  # a burst: closes keep coming
            trimmer.note_closed()
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.15)
        task.cancel()

    asyncio.run(scenario())
    # After it was over (a machine too busy to keep the 1 ms pace may see a pause mid-way).
    assert trims and trims[-1] == 263


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _glibc() -> Any:
    libc = allocator._LIBC
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("not glibc 2.33 or newer: both are no-ops there")
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


_LARGE_BUFFERS = """
import ctypes, sys
from webhook.process import allocator
from tests.unit.server.test_memory import _glibc
libc = _glibc()
allocator.tune_allocator()
allocator.release()  # the heap's free top given back: nothing large left to serve from
for size in (600 * 1024, 600 * 1024, 300 * 1024):  # untuned, the 2nd comes from the heap
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(size)
    print(size, libc.mallinfo2().hblkhd - before >= size)
    libc.free(block)
"""


def test_tuning_serves_large_buffers_from_mappings_of_their_own() -> None:
    """Above the threshold a buffer is a mapping of its own (given back when freed); below
    it, from the heap (a TLS read buffer, allocated and freed per read).

    In a process of its own: glibc serves a request of any size from a free chunk of the heap
    big enough before it maps one, and what the tests before left free decides that here."""
    _glibc()
    out = subprocess.run(
        [sys.executable, "-c", _LARGE_BUFFERS],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    ).stdout.split()
    assert out == ["614400", "True", "614400", "True", "307200", "False"]


def test_release_gives_freed_heap_pages_back() -> None:
    libc = _glibc()
    blocks = [libc.malloc(64 * 1024) for _ in range(64)]  # 4 MiB of heap, under the threshold
    keep = libc.malloc(64 * 1024)  # above them: their freeing cannot shrink the heap's top
    try:
        for block in blocks:
            libc.free(block)
        assert libc.mallinfo2().fordblks >= 4 * 2**20  # free, but still the process's
        assert allocator.release() is True  # whole free pages inside the heap given back
    finally:
        libc.free(keep)


_FREEZE = """
import gc, weakref
from webhook.process import allocator

class Entry:  # in a reference cycle: only the cyclic collector can free one
    def __init__(self):
        self.me = self

index = [Entry() for _ in range(100_000)]  # what lives as long as the process
garbage = Entry()
gone = weakref.ref(garbage)
del garbage
walked = len(gc.get_objects())  # what a full collection walks
allocator.freeze()
print(gone() is None, walked - len(gc.get_objects()) >= 100_000)
"""


def test_freeze_leaves_what_is_alive_out_of_later_collections() -> None:
    """After the controller's first sync: what is alive then (here 100,000 index entries)
    is no longer walked by a full collection, which holds the GIL while it runs; the garbage
    made before is collected first, not kept. In a process of its own: freezing is for
    the rest of a process's life."""
    out = subprocess.run(
        [sys.executable, "-c", _FREEZE],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout.split()
    assert out == ["True", "True"]
