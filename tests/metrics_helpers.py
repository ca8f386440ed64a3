"""Reading what a jobsup process serves over HTTP: a free port, a GET, and /metrics parsed by
prometheus_client's own parser."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return 0, ""


def parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics text by (name, sorted labels), as Prometheus parses it."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def exported(dsn: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What `jobsup metrics`' collector serves at a scrape, read in process."""
    from prometheus_client import CollectorRegistry, generate_latest

    from jobsup.ops.metrics import QueueCollector

    registry = CollectorRegistry(auto_describe=False)
    collector = QueueCollector(dsn)
    registry.register(collector)
    try:
        text = generate_latest(registry).decode()
    finally:
        if collector.conn is not None:
            collector.conn.close()
    return parsed(text)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics by (name, sorted labels)."""
    status, text = get(port, "/metrics")
    assert status == 200, text
    return parsed(text)


def samples(metrics: dict, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in metrics.items() if n == name and set(labels.items()) <= set(ls))
