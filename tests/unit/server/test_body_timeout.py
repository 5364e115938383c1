"""The body timeout of /mutate (a bare timer in place of asyncio.timeout): a body that does not
come in time raises TimeoutError, one that comes is returned, and a cancellation from outside
(a client gone, a shutdown) stays a cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop
from starlette.requests import Request

from webhook.server.app import _read_body_within


def _request(messages: list[dict[str, Any]], hang: bool) -> Request:
    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        if hang:
            await asyncio.sleep(3600)
        raise AssertionError("read past the body")

    scope = {"type": "http", "method": "POST", "path": "/mutate", "headers": []}
    return Request(scope, receive)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_body_in_time_is_returned_and_a_late_one_times_out(loop: str) -> None:
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop

    async def main() -> None:
        parts = [
            {"type": "http.request", "body": b"ab", "more_body": True},
            {"type": "http.request", "body": b"c", "more_body": False},
        ]
        assert await _read_body_within(_request(parts, hang=False), 10, 1.0) == b"abc"
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await _read_body_within(
                _request([{"type": "http.request", "body": b"a", "more_body": True}], True), 10, 0.1
            )
        # (uvloop's clock counts whole milliseconds)
        assert 0.095 <= asyncio.get_running_loop().time() - started < 2
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # nothing left pending
        await asyncio.sleep(0.2)  # no stray timer cancels this task later

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    async def main() -> None:
        reading = asyncio.ensure_future(_read_body_within(_request([], hang=True), 10, 0.2))
        await asyncio.sleep(0.05)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading

        # cancelled from outside and expired at once: still a cancellation
        async def both() -> bytes:
            task = asyncio.current_task()
            assert task is not None
            asyncio.get_running_loop().call_later(0.1, task.cancel)
            return await _read_body_within(_request([], hang=True), 10, 0.1)

        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(both())

    asyncio.run(main())
