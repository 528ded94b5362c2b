"""Keeping the C heap's resident size to what it holds (glibc: ``mallopt``, ``malloc_trim``).

Under steady load (``gemmanet loadtest``) a coordinator's Python objects stay flat: pymalloc's
arenas, its allocated blocks and SQLite's memory do not grow. glibc's heaps did, with memory
that is free but still resident: in the main heap the holes left by 64 KiB socket reads (now
read 4 KiB at a time, ``hypercorn_patches``), and in the arenas of the worker threads that run
the store's calls (glibc gives each thread its own arena): each keeps the high-water mark of
its busiest moment at the top of its heap, and a burst that needs one more thread adds an
arena. ``malloc_trim(0)`` releases every whole free page inside the heaps (``madvise``) and the
top of the main one, but not the top of a thread arena's heap: with the trim alone the worker
threads' arenas still grew from 1.6 to 4.5 MB resident in two minutes.

* ``one_arena`` (called by ``gemmanet serve`` before any thread starts) makes every thread
  allocate from the main arena; the threads are few and hold the GIL for most of their work.
* ``run`` trims every ``INTERVAL_S`` in a worker thread (ctypes releases the GIL; a trim with
  little to release takes about a millisecond).

Elsewhere than glibc (musl, macOS) neither exists and both do nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import trio

__all__ = ["INTERVAL_S", "available", "one_arena", "run", "trim"]

INTERVAL_S = 30.0
_M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)


def _load() -> tuple[Callable[[int], int], Callable[[int, int], int]] | None:
    try:
        libc = ctypes.CDLL(None)  # the symbols already in the process: its C library
        malloc_trim, mallopt = libc.malloc_trim, libc.mallopt
    except (OSError, AttributeError):
        return None
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return malloc_trim, mallopt


_glibc = _load()
_malloc_trim = _glibc[0] if _glibc is not None else None


def available() -> bool:
    """Whether this C library can trim (glibc)."""
    return _malloc_trim is not None


def one_arena() -> bool:
    """Let threads started from now on allocate from the main arena only; True if set."""
    return _glibc is not None and bool(_glibc[1](_M_ARENA_MAX, 1))


def trim() -> bool:
    """Release the free pages of every heap now; True if any memory was released."""
    return _malloc_trim is not None and bool(_malloc_trim(0))


async def run(interval_s: float = INTERVAL_S) -> None:
    """Trim every ``interval_s`` until cancelled (nothing to do without glibc)."""
    if not available():
        return
    while True:
        await trio.sleep(interval_s)
        await trio.to_thread.run_sync(trim)
