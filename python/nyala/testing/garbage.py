"""For tests that an operation leaves no reference cycle holding what it served: servers run
Python's cyclic collector rarely (``nyala.common.process.tune_gc``), so a cycle that holds a
request keeps its rows until a full collection (docs/performance.md, "Refused writes kept
alive")."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def collector_off() -> Iterator[Callable[[type | tuple[type, ...]], list[object]]]:
    """Runs the block with the cyclic collector off (after one collection). Yields
    ``left(types)``: the objects of ``types`` that a collection would free now, that is, that
    only cycles keep alive."""

    def left(types: type | tuple[type, ...]) -> list[object]:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            return [o for o in gc.garbage if isinstance(o, types)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    gc.collect()
    gc.disable()
    try:
        yield left
    finally:
        gc.enable()
