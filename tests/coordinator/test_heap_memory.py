"""The C heap of a coordinator process stays as large as what it holds (README "Load test": RSS
over the steady phase): 4 KiB socket reads (coordinator/server/hypercorn_patches.py) and the periodic
``malloc_trim`` (coordinator/server/heap_trim.py). Each case runs in a fresh interpreter, so the heap
it measures is its own; glibc only (``mallinfo2``, ``malloc_trim``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from coordinator.server import heap_trim

pytestmark = pytest.mark.skipif(not heap_trim.available(), reason="glibc's malloc_trim needed")

_PRELUDE = """
import ctypes, json, os

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2

def rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
"""


def _run(body: str) -> dict[str, float]:
    code = _PRELUDE + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_reads_of_the_patched_size_keep_the_heap_to_what_it_holds() -> None:
    # Messages of 100-900 bytes from 20 connections, read the way Hypercorn's TCP server reads
    # (its MAX_RECV, as patched), 30 of them in flight, alongside a sliding population of
    # buffers from the C heap (600 B - 5 kB, each freed 3000 messages later). CPython's recv
    # allocates the full read size and shrinks it; with 64 KiB reads the freed tails are taken
    # by the buffers and the holes left are just too small for the next read: the heap grows
    # on (measured: ~270 B a message, 7 MB free of 15 MB, with 8 MB in use), as the
    # coordinator's did under the load test. With 4 KiB reads: ~15 B a message, ~1.3 MB free.
    result = _run(
        """
        import collections, random, socket
        from coordinator.server import hypercorn_patches
        from hypercorn.trio import tcp_server
        hypercorn_patches.apply()
        size = tcp_server.MAX_RECV
        rng = random.Random(1)
        pairs = [socket.socketpair() for _ in range(20)]
        in_flight, buffers = collections.deque(), collections.deque()

        def message(i):
            a, b = pairs[i % len(pairs)]
            a.send(b"x" * rng.randint(100, 900))
            in_flight.append(b.recv(size))
            if len(in_flight) > 30:
                in_flight.popleft()
            buffers.append(bytearray(rng.choice([600, 1200, 2500, 5000])))
            if len(buffers) > 3000:
                buffers.popleft()

        for i in range(5000):  # the populations fill up
            message(i)
        before = libc.mallinfo2()
        for i in range(20000):
            message(i)
        after = libc.mallinfo2()
        print(json.dumps({
            "size": size,
            "growth_per_message": (after.arena - before.arena) / 20000,
            "free_mb": after.fordblks / 2**20,
            "used_mb": after.uordblks / 2**20,
        }))
        """
    )
    assert result["growth_per_message"] < 100, result
    assert result["free_mb"] < 3, result
    assert result["size"] <= 4096


def test_trim_hands_free_pages_inside_the_heap_back() -> None:
    # Freed blocks pinned by live neighbours stay resident after free(): only a trim releases
    # them. The trimmer loop of ``gemmanet serve`` (heap_trim.run) does so on its own.
    result = _run(
        """
        import trio
        from coordinator.server import heap_trim
        big, pins = [], []
        for _ in range(1500):
            big.append(bytes(60_000))  # C heap: above pymalloc's 512 B, below mmap's 128 KiB
            pins.append(bytearray(600))
        del big
        freed = rss_bytes()

        async def main():
            with trio.move_on_after(1.0):
                await heap_trim.run(interval_s=0.1)

        trio.run(main)
        print(json.dumps({"freed_mb": freed / 2**20, "trimmed_mb": rss_bytes() / 2**20}))
        """
    )
    # 1500 holes of ~60 KB: ~85 MB resident until the trim, nearly all of it released by it.
    assert result["freed_mb"] - result["trimmed_mb"] > 60, result


def test_one_arena_keeps_the_threads_heaps_in_the_main_one() -> None:
    # A thread's allocations come from an arena of its own unless ``one_arena`` ran first; the
    # top of such an arena's heap is what neither ``free`` nor ``malloc_trim`` gives back.
    def threads_heaps(setup: str) -> int:
        result = _run(
            setup
            + """
import re, tempfile, threading
barrier = threading.Barrier(4)

def work():
    barrier.wait()  # all four at once: each would get an arena of its own
    blocks = [bytearray(3000) for _ in range(300)]
    barrier.wait()
    del blocks

threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    fp = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    heaps = len(re.findall(r'<heap nr="', open(out.name).read()))
print(json.dumps({"heaps": heaps}))
"""
        )
        return int(result["heaps"])

    assert (
        threads_heaps("from coordinator.server import heap_trim\nassert heap_trim.one_arena()\n")
        == 1
    )
    assert threads_heaps("") > 1  # what glibc does by default
