"""Give memory back to the system after a burst of connections (glibc only; a no-op elsewhere).

Each connection's buffers are small allocations from the C heap. When a thousand
connections close, glibc keeps their memory for reuse and RSS stays at the peak, so a burst
once survived is paid for until the process restarts. After connections close in numbers,
`malloc_trim` returns the free pages; it runs in a thread (ctypes releases the GIL) once the
burst is over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from webhook.process.allocator import release

logger = logging.getLogger(__name__)


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
