"""What a supervisor counts for `--metrics-port` (jobsup/supervisor/exporter.py exports it).

Plain integers and histograms, kept only when the metrics are served: without --metrics-port the
supervisor holds no Tally, and every place that counts is one `is None` test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jobsup.ops.latency import Histogram


@dataclass
class Tally:
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, outcome) -> jobs written
    claims: int = 0  # claim statements that returned
    claimed: int = 0  # jobs they took
    claim_seconds: Histogram = field(default_factory=Histogram)
    writes: int = 0  # outcome statements (done, failed, released) that returned
    write_seconds: Histogram = field(default_factory=Histogram)
    wakeups: int = 0  # NOTIFYs that woke the claim loop
    reaped: int = 0  # jobs this supervisor's reaper returned or buried

    def outcome(self, kind: str, outcome: str, count: int = 1) -> None:
        key = (kind, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + count


def restart_cause(cause: str) -> str:
    """The label of a worker restart, from the cause the keeper recorded: few values, as Prometheus
    labels must have.

    >>> [restart_cause(c) for c in ("timed out after 1s", "worker killed: rss 900 MB over twice --max-memory 300 MB",
    ...                             "worker exited with signal SIGSEGV", "worker killed (SIGKILL; out of memory?)",
    ...                             "cancelled by ops@web-1",
    ...                             "interrupted: its worker was being stopped (timed out after 1s)")]
    ['timeout', 'memory', 'crash', 'killed', 'cancel', 'timeout']
    """
    wrapped = "interrupted: its worker was being stopped ("  # the keeper's, for a job that ended in the grace
    if cause.startswith(wrapped) and cause.endswith(")"):
        cause = cause[len(wrapped) : -1]
    if cause.startswith("cancelled"):
        return "cancel"
    if cause.startswith("timed out"):
        return "timeout"
    if "rss" in cause or "--max-memory" in cause:
        return "memory"
    if "SIGKILL" in cause:
        return "killed"
    return "crash"
