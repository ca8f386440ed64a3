"""The operator logic behind the commands and the console, testable without either: control (cancel,
pause, resume, retry, requeue-dead), cron (schedules' state), doctor, health and check (alerts), prune
(retention), snapshot (what `stats` and the console read), latency, metrics (the queue-wide exporter)
and bench (`jobsup bench`'s measurements and the app its workers load).

May import: jobsup.db and the public modules. Never the CLI, the supervisor's internals, the console,
argparse, rich or textual.
"""
