"""The threads tablet copy's disk work runs on (seed 000: copy jobs run "on their own thread
pool"): chunk reads on a source, checksums and writes on a target.

Apart from asyncio's default pool, so a copy moving gigabytes never queues a server's other
blocking work (flushes, WAL GC, RPC handlers that touch the disk) behind its chunks, and
bounded, so copies never take more than ``threads_max`` threads however many run at once. The
work queued on it is bounded by its callers: each copy has ``chunks_in_flight_max`` chunks
out, and a source serves one chunk per FetchData call.

Owns: the pool's threads, nothing else.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")

THREADS_MAX_DEFAULT = 4


class CopyIoPool:
    """A bounded thread pool for tablet copy's blocking work."""

    def __init__(self, threads_max: int = THREADS_MAX_DEFAULT) -> None:
        assert threads_max > 0
        self.threads_max = threads_max
        self._executor = ThreadPoolExecutor(threads_max, thread_name_prefix="tablet-copy-io")

    async def run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(*args, **kwargs)`` on one of the pool's threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Stops the threads once their current work is done; queued work is dropped."""
        self._executor.shutdown(wait=False, cancel_futures=True)
