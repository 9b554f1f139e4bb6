"""Process-level set-up shared by every long-running command.

``tune_allocator``: servers keep freed large buffers for reuse (see its docstring).

``tune_gc`` and ``gc_pauses``: servers run Python's cyclic garbage collector rarely, and time
every collection (see their docstrings).

``die_with_parent_if_asked``: a process started by ``nyala.testing.MiniCluster`` (or
``nyala.LocalCluster``) gets its parent's pid in ``NYALA_PARENT_PID`` and exits as soon as that
parent is gone, so a crashed test run never leaves servers behind.

A daemon thread polls ``getppid()`` rather than arming Linux's ``PR_SET_PDEATHSIG``: the kernel
fires that signal when the *thread* that forked the child exits, so a server restarted from a
short-lived helper thread (a chaos nemesis, a test's background restart) was SIGKILLed as soon
as that thread returned. The parent *process* is what matters, and ``getppid`` tracks exactly
that: it changes (to init or a subreaper) only when the parent process dies.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import resource
import threading
import time
from typing import Any

PARENT_PID_ENV = "NYALA_PARENT_PID"
#: How often the watchdog looks at the parent; a server outlives its parent by at most this.
PARENT_POLL_INTERVAL_S = 0.5


def die_with_parent_if_asked() -> None:
    """Starts the parent watchdog if ``NYALA_PARENT_PID`` is set (see the module docstring)."""
    parent_text = os.environ.get(PARENT_PID_ENV)
    if not parent_text or not parent_text.isdigit():
        return
    parent = int(parent_text)
    if os.getppid() != parent:
        os._exit(1)  # the parent died before we got here: we were re-parented already

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


#: glibc ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
#: Allocations up to this come from the heap and are reused after free. glibc's largest
#: allowed value on 64-bit: a 16 MiB write request and its copies stay below it.
SERVER_MMAP_THRESHOLD_BYTES = 32 << 20
#: Free memory a server keeps at the top of a heap before giving it back to the kernel.
SERVER_TRIM_THRESHOLD_BYTES = 512 << 20


#: Heaps (glibc "arenas", the main one included) a server's threads allocate from. glibc's own
#: limit is eight per core, and a thread's first allocation gets it a heap of its own while
#: there are fewer; each heap keeps the free memory between its live blocks. A tablet
#: server's storage threads allocate and free buffers of every size all day, so with many
#: heaps its resident size grew with uptime: 1.4 times what two heaps held after 10 minutes
#: (docs/performance.md, "Resident memory that grows with uptime"). ``MALLOC_ARENA_MAX`` in
#: the environment wins over this.
SERVER_MALLOC_ARENAS = 2
ARENA_MAX_ENV = "MALLOC_ARENA_MAX"


#: ``gc.set_threshold`` of a server (CPython's defaults: 700, 10, 10). See ``tune_gc``.
SERVER_GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc() -> None:
    """Makes Python's cyclic garbage collector run rarely in a server, and never over what
    exists at start-up.

    A tablet server holds hundreds of thousands of long-lived objects (a few hundred per
    replica) and almost no cyclic garbage. With CPython's defaults the youngest generation
    is collected every 700 net allocations, so anything that lives a few hundred milliseconds
    (a timer handle, a pending answer, an entry in a log cache) reaches the oldest
    generation, and once those make a quarter of it a full collection walks every object
    with the event loop stopped. Measured at 2,000 replicas per server on a busy machine:
    250-350 full collections in 15 minutes, up to 2.4 s each, and none found any garbage; a
    stall that long makes the peer servers call this one silent and wake every quiesced
    follower of its leaders (issue "Thousands of tablet replicas per server"). So: objects
    created before serving (imported modules, settings) are frozen out of collection, and the
    thresholds (``SERVER_GC_THRESHOLDS``) let young objects die by reference counting before
    they are promoted. Cycles are still collected, later, so a server must not leave cycles
    that hold large buffers: an error kept as a write's answer drops its traceback
    (``errors.kept_as_answer``), which held the refused request. Servers only, like
    ``tune_allocator``."""
    gc.freeze()
    gc.set_threshold(*SERVER_GC_THRESHOLDS)


class GcPauses:
    """How many collections of each generation ran in this process and how long they held
    the interpreter (every thread, so the event loop too): totals and the longest.

    Timed by a ``gc.callbacks`` hook, which runs inside the collector: it only adds to plain
    lists (no lock; a collection can start while any lock is held); metrics read them."""

    GENERATIONS = 3

    def __init__(self) -> None:
        self.collections = [0] * self.GENERATIONS
        self.pause_s = [0.0] * self.GENERATIONS
        self.longest_s = [0.0] * self.GENERATIONS
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
            return
        generation = info["generation"]
        took = now - self._started
        self.collections[generation] += 1
        self.pause_s[generation] += took
        if took > self.longest_s[generation]:
            self.longest_s[generation] = took


_gc_pauses: GcPauses | None = None


def gc_pauses() -> GcPauses:
    """This process's collection timer, installed on first use."""
    global _gc_pauses
    if _gc_pauses is None:
        _gc_pauses = GcPauses()
        gc.callbacks.append(_gc_pauses)
    return _gc_pauses


def raise_open_files_limit() -> int:
    """Raises this process's soft limit of open files to its hard limit (as Kudu's servers
    do): a tablet server keeps a few descriptors per replica (WAL segments, its durability
    eventfd), and thousands of replicas pass the common soft limit of 1,024. Returns the new
    soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


@functools.cache
def _libc_function(name: str) -> Any:
    """``name`` from the C library (a ctypes function), or None if it has none. Looked up once
    per name: ``find_library`` runs ``ldconfig`` in a subprocess, and each ``CDLL`` is a cycle
    of objects for the collector, while ``trim_heap`` runs every memory check under pressure."""
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    try:
        return getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None


def tune_allocator() -> bool:
    """Makes glibc malloc reuse freed large buffers instead of unmapping them.

    By default glibc serves each allocation above its mmap threshold (128 KiB, raised only as
    far as the largest block freed so far) with a fresh ``mmap`` and returns it with ``munmap``
    on free. A tserver copies every write request several times (gRPC, protobuf, the WAL,
    Arrow), so each copy then page-faults and zero-fills fresh pages: profiled at 15% of
    tserver CPU during a bulk load. Kudu avoids this by linking tcmalloc; nyala sets glibc's
    thresholds instead (no second allocator to ship). Servers only: a library must not change
    its host process's allocator. Returns False where ``mallopt`` is not glibc's.

    It also caps the number of heaps at ``SERVER_MALLOC_ARENAS`` unless the environment sets
    ``MALLOC_ARENA_MAX`` (glibc reads that itself). Call it before the server starts threads:
    a heap that exists stays.
    """
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    trimmed = mallopt(_M_TRIM_THRESHOLD, SERVER_TRIM_THRESHOLD_BYTES)
    mapped = mallopt(_M_MMAP_THRESHOLD, SERVER_MMAP_THRESHOLD_BYTES)
    capped = ARENA_MAX_ENV in os.environ or mallopt(_M_ARENA_MAX, SERVER_MALLOC_ARENAS)
    return bool(trimmed and mapped and capped)


def resident_bytes() -> int:
    """This process's resident set size in bytes (0 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def trim_heap() -> bool:
    """Gives the heap's free pages back to the kernel (glibc ``malloc_trim(0)``: the free top
    of every arena, and whole free pages inside them). With the trim threshold above, glibc
    itself keeps up to 512 MiB of freed memory; a server calls this after a flush freed a
    MemRowSet so that its resident size falls back (Kudu's tcmalloc releases to the OS at a
    set rate for the same reason). Returns False where ``malloc_trim`` is not glibc's."""
    malloc_trim = _libc_function("malloc_trim")
    if malloc_trim is None:
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    malloc_trim(0)
    return True


def machine_memory_bytes() -> int:
    """Physical memory of the machine in bytes (0 if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


#: Share of the machine's memory that a tablet server's ``memory_limit_bytes = 0`` means
#: (Kudu: 80 %; ``nyala.tserver.memory``).
MEMORY_LIMIT_FRACTION_DEFAULT = 0.8
#: Used when the machine's memory cannot be read.
MEMORY_LIMIT_BYTES_FALLBACK = 4 << 30


def default_memory_limit_bytes() -> int:
    """The memory limit of a tablet server not told otherwise: a fraction of the machine."""
    machine = machine_memory_bytes()
    if machine <= 0:
        return MEMORY_LIMIT_BYTES_FALLBACK
    return int(machine * MEMORY_LIMIT_FRACTION_DEFAULT)
