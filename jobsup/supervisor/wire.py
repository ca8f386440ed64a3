"""The old path of jobsup.worker.wire, for one release: importing it warns (DeprecationWarning).

It holds the pipes' framing alone (the messages are jobsup.worker.messages).
"""

import warnings

from jobsup.worker.wire import Reader as Reader
from jobsup.worker.wire import send as send

warnings.warn(
    f"{__name__} moved to jobsup.worker.wire; the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
