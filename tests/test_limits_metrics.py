"""The figures of limited kinds outside the console: the `jobsup metrics` gauges, `jobsup stats` (JSON and
tables), and a throttled backlog counted up to its bound."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg

from jobsup import client
from jobsup.db import lifecycle
from jobsup.ops.limits import set_limits
from jobsup.ops.snapshot import THROTTLED_COUNTED, snapshot

from .helpers import cli_env, jobsup
from .metrics_helpers import exported, samples


def limited_backlog(conn: psycopg.Connection) -> None:
    """charge: at most 2 at once, 2 held, 4 throttled the oldest for 10 minutes; export: a rate, 1 held."""
    set_limits(conn, "charge", "alice@box", concurrency=2)
    set_limits(conn, "export", "alice@box", rate="100/h")
    long_ago = datetime.now(UTC) - timedelta(minutes=10)
    client.enqueue_many(conn, [{"kind": "charge", "key": "a", "run_at": long_ago}] * 2)
    client.enqueue_many(conn, [{"kind": "charge", "key": "b"}] * 4 + [{"kind": "export"}])
    client.enqueue(conn, "email", {})  # no limit: no series
    jobs, _ = lifecycle.claim_limited(conn, ["charge", "export"], ["default"], 10, "sup-a", 60)
    assert sorted(j.kind for j in jobs) == ["charge", "charge", "export"]


def test_the_exporter_serves_held_limit_throttled_and_throttled_age_per_limited_kind(conn, dsn):
    limited_backlog(conn)
    metrics = exported(dsn)
    assert samples(metrics, "jobsup_limit_held_jobs", kind="charge") == 2
    assert samples(metrics, "jobsup_limit_concurrency", kind="charge") == 2
    assert samples(metrics, "jobsup_limit_throttled_jobs", kind="charge") == 4
    assert 600 <= samples(metrics, "jobsup_limit_throttled_age_seconds", kind="charge") < 660
    assert samples(metrics, "jobsup_limit_held_jobs", kind="export") == 1
    assert samples(metrics, "jobsup_limit_rate_per_second", kind="export") == 100 / 3600
    assert samples(metrics, "jobsup_limit_throttled_jobs", kind="export") == 0
    # A limit a kind does not have, or nothing throttled: no sample rather than a made-up 0.
    assert not [k for k in metrics if k == ("jobsup_limit_concurrency", (("kind", "export"),))]
    assert not [k for k in metrics if k == ("jobsup_limit_throttled_age_seconds", (("kind", "export"),))]
    assert not [k for k in metrics if dict(k[1]).get("kind") == "email" and k[0].startswith("jobsup_limit_")]


def test_without_limits_the_exporter_has_no_limit_series(conn, dsn):
    client.enqueue(conn, "email", {})
    assert not [k for k in exported(dsn) if k[0].startswith("jobsup_limit_")]


def test_throttled_is_counted_up_to_its_bound(conn, dsn):
    set_limits(conn, "charge", "alice@box", concurrency=1)
    client.enqueue_many(conn, [{"kind": "charge", "key": f"k{i % 50}"} for i in range(THROTTLED_COUNTED + 5)])
    [charge] = snapshot(conn).limits
    assert charge.throttled == THROTTLED_COUNTED and charge.throttled_capped and charge.throttled_text == "10,000+"
    assert samples(exported(dsn), "jobsup_limit_throttled_jobs", kind="charge") == THROTTLED_COUNTED


def test_stats_has_a_limits_section(conn, dsn):
    assert json.loads(jobsup("stats", "--dsn", dsn, "--json").stdout)["limits"] == []
    assert "limits" not in jobsup("stats", "--dsn", dsn).stdout  # no table without a limit
    limited_backlog(conn)
    data = json.loads(jobsup("stats", "--dsn", dsn, "--json").stdout)
    charge, export = data["limits"]
    assert charge["kind"] == "charge" and charge["limits"] == {"concurrency": 2}
    assert (charge["held"], charge["throttled"], charge["throttled_capped"]) == (2, 4, False)
    assert 600 <= charge["throttled_age"] < 660 and charge["set_by"] == "alice@box"
    assert export["limits"] == {"rate": "100/h", "burst": 1} and export["throttled_age"] is None
    text = jobsup("stats", "--dsn", dsn, env=cli_env(COLUMNS="160")).stdout
    table = text[text.index("limits (held") : text.index("dead jobs (")]
    cells = [c.strip() for c in next(line for line in table.splitlines() if "charge" in line).split("│")[1:-1]]
    assert cells[:5] == ["charge", "concurrency 2", "2 of 2", "4", "0"] and cells[6] == "alice@box", table
    assert cells[5].startswith("10m"), table  # oldest: how long the oldest throttled job has waited
