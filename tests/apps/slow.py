"""An app that takes its time to import (JOBSUP_TEST_IMPORT_SECONDS, default 1.5 s), for the tests
that stop a supervisor while its workers are still starting."""

import os
import time

from jobsup import App

time.sleep(float(os.environ.get("JOBSUP_TEST_IMPORT_SECONDS", "1.5")))

app = App()


@app.handler("ok")
def ok(job) -> None:
    pass
