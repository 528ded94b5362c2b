"""The cost of a streamed chunk: ``python -m tools.bench.throughput --stream``, under its own
name. A non-streamed request, a streamed one of one chunk and one of ``--chunks`` N chunks
(the echo backend streams one chunk per word of the prompt), in alternating rounds; the
coordinator's CPU for one more chunk (node -> coordinator -> client, one SSE event) is
(streamed N - streamed 1) / (N - 1), set against its CPU per non-streamed request.

    python -m tools.bench.stream [--chunks N] [--redis] [--py-spy DIR] [--json FILE]
    python -m tools.bench.stream --quick     # ~15 s, for smoke use

Every option of ``tools.bench.throughput`` applies.
"""

from __future__ import annotations

import sys

from tools.bench.throughput import main as _throughput_main


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return _throughput_main(["--stream", *args], prog="python -m tools.bench.stream")


if __name__ == "__main__":
    sys.exit(main())
