"""``python -m tools.loadtest``: the same as ``gemmanet loadtest``."""

from __future__ import annotations

import argparse
import sys

from tools.loadtest import add_loadtest_arguments, run_loadtest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.loadtest",
        description="Run the load profile of seed 000 §4.1 against real coordinator processes.",
    )
    add_loadtest_arguments(parser)
    return run_loadtest(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
