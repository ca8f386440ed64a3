"""A handler that says which database it reaches, for the test that a supervisor's workers reach its own."""

import os

import psycopg

import jobsup
from jobsup import App, Job

app = App()


@app.handler("whose-database")
def whose_database(job: Job) -> dict:
    with psycopg.connect(jobsup.dsn()) as conn:
        [(name,)] = conn.execute("SELECT current_database()").fetchall()
    return {"env": os.environ.get("JOBSUP_DSN"), "dsn": jobsup.dsn(), "database": name}
