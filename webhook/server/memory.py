"""Give memory back to the system after a burst of connections (glibc only; a no-op elsewhere).

Each connection's buffers are small allocations from the C heap. When a thousand
connections close, glibc keeps their memory for reuse and RSS stays at the peak, so a burst
once survived is paid for until the process restarts. After connections close in numbers,
`malloc_trim` returns the free pages; it runs in a thread (ctypes releases the GIL) once the
burst is over.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from typing import Any, Final

logger = logging.getLogger(__name__)

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


class Trimmer:
    """Counts closed connections; `run` trims once enough have closed and the burst is over."""

    def __init__(
        self, *, after: int = 64, quiet: float = 2.0, trim: Callable[[], object] = release
    ):
        self.closed = 0
        self._after = after
        self._quiet = quiet
        self._trim = trim

    def note_closed(self) -> None:
        self.closed += 1

    async def run(self) -> None:
        trimmed_at = 0
        last_seen = 0
        while True:
            await asyncio.sleep(self._quiet)
            closed = self.closed
            if closed - trimmed_at >= self._after and closed == last_seen:
                trimmed_at = closed
                await asyncio.to_thread(self._trim)
                logger.debug("returned free memory after %d closed connections", closed)
            last_seen = closed
