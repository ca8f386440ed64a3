"""The old path of jobsup.supervisor.declaration, for one release: importing it warns (DeprecationWarning).

It holds the app's declaration of its limits alone (the limits are jobsup.limits).
"""

import warnings

from jobsup.supervisor.declaration import RETRY as RETRY
from jobsup.supervisor.declaration import Declaration as Declaration

warnings.warn(
    f"{__name__} moved to jobsup.supervisor.declaration; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
