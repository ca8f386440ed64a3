"""Flags of `jobsup start` (the run itself is imported only when the command runs)."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app", required=True, help="module:attribute of the jobsup App")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError
