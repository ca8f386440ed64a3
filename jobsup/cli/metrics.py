"""`jobsup metrics --port PORT`: the queue-wide gauges for Prometheus (jobsup/ops/metrics.py)."""

from __future__ import annotations

import argparse
import os

from jobsup.errors import EXIT_OK, BadInput

HELP = "serve the queue-wide gauges for Prometheus"


def configure(parser: argparse.ArgumentParser) -> None:
    from jobsup.cli.options import positive_int

    parser.description = (
        "Serve the queue-wide gauges on /metrics: jobs ready, scheduled, running and dead "
        "by queue and kind, and the age of each queue's oldest ready job. Run one per "
        "queue, beside the supervisors (which export their own figures with "
        "`jobsup start --metrics-port`)."
    )
    parser.add_argument(
        "--port",
        type=positive_int,
        required="JOBSUP_EXPORTER_PORT" not in os.environ,
        default=os.environ.get("JOBSUP_EXPORTER_PORT"),
        help="TCP port (env JOBSUP_EXPORTER_PORT)",
    )
    parser.add_argument(
        "--host",
        default=os.environ.get("JOBSUP_EXPORTER_HOST", "localhost"),
        help="address to listen on; 0.0.0.0 for every interface (env JOBSUP_EXPORTER_HOST; default localhost)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.cli.options import connect
    from jobsup.db.dsn import resolve
    from jobsup.ops.metrics import serve

    if args.port > 65535:
        raise BadInput(f"--port must be a TCP port from 1 to 65535, not {args.port}")
    with connect(args):  # the schema check, with its message, before serving anything
        pass
    serve(resolve(args.dsn, args.data_dir), args.host, args.port)
    return EXIT_OK
