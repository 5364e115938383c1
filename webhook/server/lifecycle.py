"""Readiness of the serving process, shared by `/readyz` and the runner.

The runner marks the process started once it listens, and begins the shutdown on SIGTERM;
anything else (a test, an embedding program) may begin the shutdown too, and the runner
then drains and stops the same way. Plain attributes: each is a single bool written by one
side and read by the other, which is safe under the GIL.
"""

from __future__ import annotations


class Lifecycle:
    def __init__(self) -> None:
        self._started = False
        self._shutting_down = False

    @property
    def ready(self) -> bool:
        """True once the server listens, until the shutdown begins."""
        return self._started and not self._shutting_down

    @property
    def started(self) -> bool:
        return self._started

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def mark_started(self) -> None:
        self._started = True

    def begin_shutdown(self) -> None:
        """Stop reporting ready. Idempotent; there is no way back."""
        self._shutting_down = True
