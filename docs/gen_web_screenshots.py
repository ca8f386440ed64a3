"""`make web-screenshots`: the web console's main views at 1280x800, into docs/images/web/.

A scratch embedded PostgreSQL, a supervisor running the demo's handlers (examples/demo_app.py) on a
mix of jobs (some end dead, a workflow, a limited kind), `jobsup web` on loopback, and Debian's chromium
driven by Playwright, as the browser tests drive it. Nothing is left running."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from jobsup import Workflow, client  # noqa: E402
from jobsup.db import embedded  # noqa: E402
from jobsup.db.migrate import migrate  # noqa: E402

OUT = ROOT / "docs" / "images" / "web"
SIZE = {"width": 1280, "height": 800}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]  # fmt: skip
TOKEN = "screenshots"


def jobsup(*args: str) -> list[str]:
    return [sys.executable, "-m", "jobsup", *args]


def feed(conn: psycopg.Connection) -> int:
    for i in range(40):
        client.enqueue(conn, "email", {"fate": "ok", "to": f"user{i}@example.com"})
    for i in range(6):
        client.enqueue(conn, "email", {"fate": "doomed", "to": f"gone{i}@example.com"}, max_attempts=1)
    for _ in range(3):
        client.enqueue(conn, "webhook", {"fate": "doomed", "url": "https://hooks.example/orders"}, max_attempts=1)
    for i in range(12):
        client.enqueue(conn, "webhook", {"fate": "ok", "customer": ["acme", "globex"][i % 2]})
    for _ in range(20):
        client.enqueue(conn, "report", {"fate": "ok"}, queue="reports", run_at=None)
    wf = Workflow("album")
    wf.group([{"kind": "resize", "payload": {"fate": "ok", "photo": n}} for n in range(4)], then="album")
    workflow = wf.enqueue(conn)
    assert workflow is not None
    return workflow


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="jobsup-shots-"))
    data_dir = base / "pgdata"
    dsn = embedded.ensure_running(data_dir)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JOBSUP_DSN": dsn}
    procs: list[subprocess.Popen] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            procs.append(
                subprocess.Popen(
                    jobsup("start", "--procs", "2", "--app", "examples.demo_app:app", "--queues", "default,reports"),
                    env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
            workflow = feed(conn)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            web = subprocess.Popen(
                jobsup("web", "--port", str(port), "--token", TOKEN),
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(web)
            assert web.stdout is not None
            url = web.stdout.readline().split("serving ", 1)[1].strip()
            base_url = url.split("?")[0]
            time.sleep(6)  # the supervisor works through the feed: dead jobs, a finished workflow
            dead = conn.execute("SELECT id FROM jobsup.jobs WHERE status = 'dead' ORDER BY id LIMIT 1").fetchone()[0]
            from playwright.sync_api import sync_playwright

            OUT.mkdir(parents=True, exist_ok=True)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = browser.new_context(viewport=SIZE).new_page()
                page.goto(url)
                for name, path in [
                    ("overview", ""),
                    ("dead", "dead"),
                    ("job", f"jobs/{dead}"),
                    ("workflow", f"workflows/{workflow}"),
                    ("limits", "limits"),
                    ("queues", "queues"),
                ]:
                    page.goto(base_url + path)
                    page.screenshot(path=str(OUT / f"{name}.png"))
                    print(f"docs/images/web/{name}.png")
                browser.close()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        embedded.stop(data_dir)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
