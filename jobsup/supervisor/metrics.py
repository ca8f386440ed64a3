"""The old path of jobsup.supervisor.exporter, for one release: importing it warns (DeprecationWarning).

It holds the exporter alone (what it exports is counted in tally.py).
"""

import warnings

from jobsup.supervisor.exporter import BUCKETS as BUCKETS
from jobsup.supervisor.exporter import HEALTHY_BEATS as HEALTHY_BEATS
from jobsup.supervisor.exporter import HEALTHY_MIN as HEALTHY_MIN
from jobsup.supervisor.exporter import REQUEST_TIMEOUT as REQUEST_TIMEOUT
from jobsup.supervisor.exporter import Exporter as Exporter
from jobsup.supervisor.exporter import bind as bind
from jobsup.supervisor.exporter import health as health
from jobsup.supervisor.exporter import registry as registry
from jobsup.supervisor.exporter import serve as serve

warnings.warn(
    f"{__name__} moved to jobsup.supervisor.exporter; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
