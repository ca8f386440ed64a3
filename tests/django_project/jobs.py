"""Plain jobsup handlers, run beside the Django tasks (`--app` with `--django`)."""

from jobsup import App, Job

app = App()


@app.handler("answer")
def answer(job: Job):
    return {"answer": 42, "for": job.payload.get("who")}


@app.handler("returns_set", max_attempts=1)
def returns_set(job: Job):
    return {1, 2}
