"""The old path of jobsup.ops.schedules, for one release: importing it warns (DeprecationWarning).

It is named for what it operates, the schedules (Schedule), as `jobsup cron` keeps its name.
"""

import warnings

from jobsup.ops.schedules import ORPHAN_AFTER as ORPHAN_AFTER
from jobsup.ops.schedules import ScheduleState as ScheduleState
from jobsup.ops.schedules import UnknownSchedule as UnknownSchedule
from jobsup.ops.schedules import alist_schedules as alist_schedules
from jobsup.ops.schedules import arun_now as arun_now
from jobsup.ops.schedules import aset_paused as aset_paused
from jobsup.ops.schedules import list_schedules as list_schedules
from jobsup.ops.schedules import run_now as run_now
from jobsup.ops.schedules import set_paused as set_paused

warnings.warn(
    f"{__name__} moved to jobsup.ops.schedules; the old path goes in the next release", DeprecationWarning, stacklevel=2
)
