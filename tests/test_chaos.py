"""The chaos run in its short form (`make chaos` runs it for two minutes): see tests/chaos.py."""

from __future__ import annotations

import pytest

from . import chaos

pytestmark = pytest.mark.slow  # supervisors SIGKILLed and the server restarted for half a minute

SHORT = 25.0  # seconds of chaos; draining and checking take a few more


@pytest.mark.timeout(300)
def test_chaos_short(capsys):
    counts = chaos.run(SHORT, say=lambda line: None)
    with capsys.disabled():
        print("\n" + chaos.report(counts))
    assert counts.ok, chaos.report(counts)
    assert counts.supervisor_kills >= 2 and counts.server_restarts == 1
