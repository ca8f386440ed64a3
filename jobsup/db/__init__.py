"""The database: where it is (DSN resolution, the embedded server), its schema (numbered migrations) and
its statements (`queries/*.sql`, one file a domain, loaded once by `sql`). `lifecycle` holds the
supervisor's own statements: claim, complete, fail, snooze, cancel, release, renew, reap. `notify`
holds the messages of the `jobsup` NOTIFY channel (the one place their payloads are read), `json_text`
the fast read of JSON text PostgreSQL wrote.

May import: jobsup.errors, jobsup.job, jobsup.outcomes. Never the CLI, the supervisor, the console,
argparse, rich or textual.
"""
