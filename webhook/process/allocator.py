"""glibc's allocator, tuned and asked to give free memory back (a no-op elsewhere); and the
interpreter's cyclic garbage collector, kept off what lives as long as the process.

Two moments call `release`: after a list (webhook/kube/informer.py: whole pages of full
objects, Secret values included, parsed to keep a few digests of each) and after a burst of
connections or a large review (webhook/server/memory.py, webhook/server/large.py). Without it
glibc keeps that memory mapped and RSS stays at the high-water mark.

`freeze` runs once the controller has indexed the cluster (webhook/serve.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from typing import Any, Final

_M_MMAP_THRESHOLD: Final = -3
# Above the buffer of each TLS read on uvloop (allocated and freed per read, between 128 and
# 512 KiB): at 128 KiB every read was a mapping of its own, mmap, page faults and munmap, some
# 10,000 page faults a second on a busy core (`perf stat -e page-faults -p PID`; none at 512
# KiB, none in a plain uvicorn, whose glibc raises its threshold itself). RSS per idle
# connection and after a burst are the same at both (bench/connections.py).
_MMAP_THRESHOLD: Final = 512 * 1024


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):  # not glibc
        return None
    return libc


_LIBC = _libc()


def tune_allocator() -> None:
    """Serve allocations of 512 KiB and more (a large review's body) from their own
    mappings, returned to the system when freed. glibc otherwise raises this threshold
    after the first such free, and later large buffers land in the heap, where they stay."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


def release() -> bool:
    """Give the free pages of the C heap back to the system; True when some were."""
    return _LIBC is not None and bool(_LIBC.malloc_trim(0))


def freeze() -> None:
    """Leave everything alive now out of every later run of the cyclic garbage collector
    (`gc.freeze`), after one last full run: the imports, the workload index, the caches.
    A full run walks every object it tracks, holding the GIL, so every thread waits: with
    1,000 workloads indexed it took 30-150 ms, once every few seconds while source writes
    were admitted, and it grows with the cluster (bench/README.md, `source_writes`). What is
    frozen is still freed when nothing refers to it any more; only a reference cycle among
    frozen objects would stay."""
    gc.collect()
    gc.freeze()
