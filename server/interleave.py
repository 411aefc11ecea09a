"""Several async streams as one: each runs in its own task, items come out as they arrive.

Used for the choices of one request (n > 1) and for the prompts of one legacy completion.
The first error of any stream is raised to the consumer. Leaving early (client gone) or an
error cancels every task, which closes its stream (and so aborts its engine requests); the
tasks are not awaited, since this may run inside a cancelled scope and they end on their own.
"""

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import TypeVar

T = TypeVar("T")


async def interleave(streams: Sequence[Callable[[], AsyncIterator[T]]], name: str) -> AsyncIterator[T]:
    """Items of every `streams[i]()` as they come; a single stream runs without a task."""
    if len(streams) == 1:
        async with aclosing(streams[0]()) as items:
            async for item in items:
                yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(open_stream: Callable[[], AsyncIterator[T]]) -> None:
        try:
            async with aclosing(open_stream()) as items:
                async for item in items:
                    queue.put_nowait(item)
        except Exception as error:  # handed to the consumer, which raises it
            queue.put_nowait(error)
        finally:
            queue.put_nowait(done)

    tasks = [asyncio.create_task(pump(stream), name=f"{name}-{i}") for i, stream in enumerate(streams)]
    try:
        num_running = len(tasks)
        while num_running:
            item = await queue.get()
            if item is done:
                num_running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
