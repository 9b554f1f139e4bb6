"""Server processes die with their parent process, not with the thread that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nyala.common.process import PARENT_PID_ENV, SERVER_MALLOC_ARENAS

# The parent starts the child from a thread that ends at once, prints the child's pid, and waits
# for a line on stdin before exiting.
_PARENT = """
import os, subprocess, sys, threading
child = []
def spawn():
    env = dict(os.environ, {env}=str(os.getpid()))
    code = "from nyala.common.process import die_with_parent_if_asked as d; import time; "
    code += "d(); time.sleep(60)"
    child.append(subprocess.Popen([sys.executable, "-c", code], env=env))
t = threading.Thread(target=spawn)
t.start(); t.join()
print(child[0].pid, flush=True)
sys.stdin.readline()
os._exit(0)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by init) counts as gone.
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_child_outlives_the_spawning_thread_and_dies_with_the_parent_process() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT.format(env=PARENT_PID_ENV)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    assert parent.stdin is not None
    child = int(parent.stdout.readline())
    try:
        time.sleep(1.5)  # the spawning thread is long gone
        assert _alive(child)
        parent.stdin.write("bye\n")
        parent.stdin.flush()
        parent.wait(timeout=10)
        assert _wait_gone(child, timeout_s=10)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


_FAULTS_SCRIPT = """
import resource, sys
from nyala.common.process import tune_allocator
if sys.argv[1] == "tuned":
    assert tune_allocator()
def churn():
    for _ in range(10):
        # Several live at once, as a server's request copies are; zero-filled, so every
        # page is touched.
        buffers = [bytearray(8 << 20) for _ in range(6)]
        del buffers
churn()  # the first round may fault the heap in
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_tuned_allocator_reuses_freed_large_buffers() -> None:
    # Untuned glibc gives the freed buffers back to the kernel (unmapped, or trimmed off the
    # heap's top) and faults fresh zero pages in for the next round: 2048 faults per buffer.
    # Tuned, the freed memory stays in the heap and the next round reuses its pages.
    def faults(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", _FAULTS_SCRIPT, mode], capture_output=True, text=True, check=True
        )
        return int(done.stdout.strip())

    untuned, tuned = faults("plain"), faults("tuned")
    assert untuned > 10 * 6 * 1000
    assert tuned < untuned // 10


_HEAPS_SCRIPT = """
import ctypes, os, re, sys, tempfile, threading
from nyala.common.process import tune_allocator
if sys.argv[1] == "tuned":
    assert tune_allocator()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
started = threading.Barrier(9)
done = threading.Event()
def allocate():
    blocks = [libc.malloc(4096) for _ in range(64)]  # the thread's first mallocs pick its heap
    started.wait()
    done.wait()
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
started.wait()
path = os.path.join(tempfile.mkdtemp(), "info.xml")
info = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, info)
libc.fclose(info)
done.set()
print(len(re.findall(r'<heap nr="', open(path).read())))
"""


def _heaps_of_eight_threads(mode: str, env: dict[str, str] | None = None) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _HEAPS_SCRIPT, mode],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | (env or {}),
    )
    return int(done.stdout.strip())


def test_tuned_allocator_caps_the_heaps_its_threads_allocate_from() -> None:
    # Eight threads that allocate at once get a heap each from plain glibc (its limit is eight
    # per core); a tuned server's share SERVER_MALLOC_ARENAS, the main heap included.
    assert _heaps_of_eight_threads("plain") >= 8
    assert _heaps_of_eight_threads("tuned") == SERVER_MALLOC_ARENAS


def test_an_operators_malloc_arena_max_wins_over_the_servers_cap() -> None:
    assert _heaps_of_eight_threads("tuned", {"MALLOC_ARENA_MAX": "5"}) == 5


def test_open_files_limit_is_raised_to_the_hard_limit() -> None:
    script = (
        "import resource; from nyala.common.process import raise_open_files_limit;"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE);"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard));"
        "new = raise_open_files_limit();"
        "print(new == hard, resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["True", "True"]


# Keeps 30,000 objects alive (a server's long-lived state), then makes and drops a cycle;
# prints the collections of each generation the allocations started, whether the cycle was
# collected, and whether the start-up objects were frozen out of collection.
_GC_SCRIPT = """
import gc, sys, weakref
from nyala.common.process import SERVER_GC_THRESHOLDS, gc_pauses, tune_gc
if sys.argv[1] == "tuned":
    tune_gc()
    assert gc.get_threshold() == SERVER_GC_THRESHOLDS
pauses = gc_pauses()
kept = [[i] for i in range(30_000)]
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a
dead = weakref.ref(a)
del a, b
young = list(pauses.collections)
gc.collect()
print(young[0], young[2], dead() is None, gc.get_freeze_count() > 0, pauses.collections[2] > 0)
"""


def test_tuned_gc_spares_long_lived_objects_but_still_collects_cycles() -> None:
    def run(mode: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", _GC_SCRIPT, mode], capture_output=True, text=True, check=True
        )
        return done.stdout.split()

    # CPython's defaults: 30,000 new objects start dozens of young collections.
    young, _, collected, frozen, timed = run("plain")
    assert int(young) >= 30
    assert (collected, frozen, timed) == ("True", "False", "True")
    # Tuned: none of them; the cycle is still collected, and start-up objects are frozen.
    young, old, collected, frozen, timed = run("tuned")
    assert (int(young), int(old)) == (0, 0)
    assert (collected, frozen, timed) == ("True", "True", "True")
