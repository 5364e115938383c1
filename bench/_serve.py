"""`configpin serve` as installed, optionally on another HTTP parser or event loop.

    python -m bench._serve [--http h11|httptools] [--loop asyncio|uvloop] -- serve [flags]

The benchmarks start the server through this, so that one script can compare stacks; the
defaults are what `configpin serve` itself runs.
"""

from __future__ import annotations

import argparse
import sys

from webhook.commands import cli
from webhook.server import runner


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http")
    parser.add_argument("--loop")
    args, rest = parser.parse_known_args()
    if rest and rest[0] == "--":
        rest = rest[1:]
    if args.http:
        runner.DEFAULT_HTTP = args.http
    if args.loop:
        runner.DEFAULT_LOOP = args.loop
    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main())
