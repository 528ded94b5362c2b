"""Running the app: ``gemmanet serve`` on Hypercorn, its workarounds, the process tuning.

serve.py              ``gemmanet serve``: the app on Hypercorn's trio worker, start-up refusals
listen.py             the listen address (--host, --port) checked in one line before a start
hypercorn_patches.py  workarounds for Hypercorn: Connection: close, JSON 400/431, reason phrases,
                      one write per response, 4 KiB reads
gc_tuning.py          the garbage collector tuned for thousands of connections (pauses, metric)
heap_trim.py          the C heap kept to what it holds: one malloc arena, trimmed every 30 s (glibc)
"""
