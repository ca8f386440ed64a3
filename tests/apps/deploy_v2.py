"""Release 2 of the app of deploy_v1: it handles a and b, and kind c, new in this release."""

from jobsup import App, Job
from tests.apps.deploy_v1 import a, b

app = App()
app.handler("a")(a)
app.handler("b")(b)


@app.handler("c")
def c(job: Job) -> None:
    pass
