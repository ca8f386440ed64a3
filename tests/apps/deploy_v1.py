"""Release 1 of an app, for the rolling-deploy tests: it handles kinds a and b."""

from jobsup import App, Job

app = App()


@app.handler("a")
def a(job: Job) -> None:
    pass


@app.handler("b")
def b(job: Job) -> None:
    pass
