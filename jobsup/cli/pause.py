"""`jobsup pause QUEUE`: stop claiming from a queue on every supervisor; announced on the jobsup channel."""

from __future__ import annotations

import argparse

from jobsup.cli.actions import configure_pausing, pause_or_resume

HELP = "stop claiming from a queue on every supervisor"


def configure(p: argparse.ArgumentParser) -> None:
    configure_pausing(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return pause_or_resume(args, pausing=True)
