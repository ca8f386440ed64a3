"""The old path of jobsup.worker.sharing, for one release: importing it warns (DeprecationWarning).

Jobs that share a worker process are run on the worker's side, which is jobsup.worker.
"""

import warnings

from jobsup.worker.sharing import BLOCK_REPORT as BLOCK_REPORT
from jobsup.worker.sharing import JOB_FRAME as JOB_FRAME
from jobsup.worker.sharing import LAG_EVERY as LAG_EVERY
from jobsup.worker.sharing import TICK as TICK
from jobsup.worker.sharing import WATCH as WATCH
from jobsup.worker.sharing import Shared as Shared
from jobsup.worker.sharing import culprit_of_fault as culprit_of_fault
from jobsup.worker.sharing import job_ids_in as job_ids_in

warnings.warn(
    f"{__name__} moved to jobsup.worker.sharing; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
