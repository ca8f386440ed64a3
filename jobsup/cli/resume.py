"""`jobsup resume QUEUE`: claim from a paused queue again; announced on the jobsup channel."""

from __future__ import annotations

import argparse

from jobsup.cli.actions import configure_pausing, pause_or_resume

HELP = "claim from a paused queue again"


def configure(p: argparse.ArgumentParser) -> None:
    configure_pausing(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return pause_or_resume(args, pausing=False)
