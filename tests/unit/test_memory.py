"""Memory is given back once a burst of connections is over, not during it."""

from __future__ import annotations

import asyncio

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


def test_release_and_tuning_are_safe_to_call() -> None:
    memory.tune_allocator()
    memory.release()
