"""The web console in a real browser: Debian's chromium driven by Playwright, against a real `jobsup
web` on loopback. `.ci/run` and `make test` install chromium when it is missing; Playwright's own
browser download is never used."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from jobsup import Workflow, client
from jobsup.ops.explain import explain_text

from .web_helpers import make_dead, web_server

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
LIVE_WITHIN = 2.0  # seconds: a change made elsewhere is on an open page within this


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.on("dialog", lambda dialog: dialog.accept())
    yield page
    context.close()


def _count(conn, where: str) -> int:
    return conn.execute(f"SELECT count(*) FROM jobsup.jobs WHERE {where}").fetchone()[0]


def test_overview_numbers_equal_the_database(dsn, conn, page):
    for i in range(7):
        client.enqueue(conn, "email", {"n": i})
    client.enqueue(conn, "report", {}, run_at=None)
    make_dead(conn, "sms", "no credit", 3, queue="texts")
    with web_server(dsn) as url:
        page.goto(url)
        counts = {
            name: int(page.locator(f'[data-count="{name}"]').inner_text().replace(",", ""))
            for name in ("ready", "running", "dead", "waiting")
        }
        assert counts == {
            "ready": _count(conn, "status = 'queued' AND run_at <= now()"),
            "running": _count(conn, "status = 'running'"),
            "dead": _count(conn, "status = 'dead'"),
            "waiting": _count(conn, "status = 'waiting'"),
        }
        assert counts["ready"] == 8 and counts["dead"] == 3


def test_a_change_made_elsewhere_appears_within_two_seconds(dsn, conn, page):
    client.enqueue(conn, "email", {})
    with web_server(dsn) as url:
        page.goto(url)
        ready = page.locator('[data-count="ready"]')
        assert ready.inner_text() == "1"
        client.enqueue(conn, "email", {})
        started = time.monotonic()
        # expect polls the element, no script of its own: the page's CSP forbids eval.
        expect(ready).to_have_text("2", timeout=LIVE_WITHIN * 1000)
        assert time.monotonic() - started < LIVE_WITHIN


def test_requeue_one_dead_job_and_all_of_a_kind(dsn, conn, page):
    [email] = make_dead(conn, "email", "smtp down")
    sms = make_dead(conn, "sms", "no credit", 4, queue="texts")
    with web_server(dsn) as url:
        page.goto(url)
        page.click("text=Dead jobs")
        page.locator("#dead-jobs tr", has_text="smtp down").get_by_role("button", name="Requeue").click()
        page.wait_for_selector("#notice")
        assert "requeued 1 of 1 dead job" in page.inner_text("#notice")
        assert _count(conn, f"id = {email} AND status = 'queued'") == 1
        page.click("text=Requeue every dead job of sms…")
        assert page.inner_text("#confirm-text") == "Requeue 4 dead jobs of kind sms?"
        page.click("button:has-text('Requeue 4 jobs')")
        page.wait_for_selector("#notice")
        assert _count(conn, f"id = ANY(ARRAY{sms}) AND status = 'queued'") == 4
        page.click("text=Audit")
        assert page.locator("#audit tr", has_text="kind sms").locator("td").nth(1).inner_text() == "token"


def test_pause_and_resume_a_queue(dsn, conn, page):
    client.enqueue(conn, "email", {}, queue="mail")
    with web_server(dsn) as url:
        page.goto(url)
        page.click("text=Queues")
        row = page.locator("#queues tr", has_text="mail")
        row.get_by_role("button", name="Pause").click()
        page.wait_for_selector("#notice")
        assert conn.execute("SELECT queue FROM jobsup.queue_pauses").fetchall() == [("mail",)]
        assert "paused by token" in page.locator("#queues tr", has_text="mail").inner_text()
        page.locator("#queues tr", has_text="mail").get_by_role("button", name="Resume").click()
        page.wait_for_selector("#notice")
        assert conn.execute("SELECT count(*) FROM jobsup.queue_pauses").fetchone()[0] == 0


def test_change_a_limit(dsn, conn, page):
    with web_server(dsn) as url:
        page.goto(url)
        page.click("text=Limits")
        form = page.locator("#limit-form")
        form.locator("input[name=kind]").fill("report")
        form.locator("input[name=concurrency]").fill("4")
        form.get_by_role("button", name="Change").click()
        page.wait_for_selector("#notice")
        assert conn.execute("SELECT concurrency FROM jobsup.limits WHERE kind = 'report'").fetchone()[0] == 4
        assert "concurrency 4" in page.locator("#limits tr", has_text="report").inner_text()


def test_a_workflow_tree_and_a_job_page_with_its_explanation(dsn, conn, page):
    wf = Workflow("receipt")
    charge, receipt, ledger = wf.chain("charge", "receipt", "ledger")
    workflow_id = wf.enqueue(conn)
    with web_server(dsn) as url:
        page.goto(url)
        page.click("text=Workflows")
        page.click(f"#workflows a:text-is('{workflow_id}')")
        tree = page.locator("#tree")
        # Each job is nested under the one it waits for.
        nested = (
            tree.locator("li", has_text="charge").locator("li", has_text="receipt").locator("li", has_text="ledger")
        )
        assert nested.count() == 1
        tree.locator(f"a:text-is('{ledger.id}')").click()
        page.wait_for_selector("#explain")
        assert page.inner_text("#explain") == explain_text(conn, ledger.id)
        assert "waiting" in page.inner_text("#status")
        assert page.locator("#family tr", has_text="parent").count() == 1


def test_a_payload_holding_html_is_shown_as_text_and_no_script_runs(dsn, conn, page):
    evil = "<img src=x onerror=window.__pwned=1><script>window.__pwned=2</script>"
    [dead] = make_dead(conn, "email", evil, payload={"html": evil})
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    with web_server(dsn) as url:
        page.goto(url)
        page.goto(url.split("?")[0] + f"jobs/{dead}")
        assert evil in page.inner_text("#payload")
        page.click("text=Dead jobs")
        assert evil in page.inner_text("#dead-jobs")
        time.sleep(0)  # nothing to wait for: the page is loaded and the script would have run
        assert page.evaluate("window.__pwned") is None and not dialogs
        assert page.locator("img").count() == 0


def test_without_the_token_no_page(dsn, page):
    with web_server(dsn) as url:
        answer = page.goto(url.split("?")[0])
        assert answer.status == 401 and "Token needed" in page.content()


def test_login_and_a_viewer_in_the_browser(dsn, conn, page):
    from .web_helpers import PASSWORDS, users

    [dead] = make_dead(conn, "email", "smtp down")
    env = {
        "JOBSUP_WEB_USERS": ";".join(f"{u.name}:{u.role}:{u.hash}" for u in users().values()),
        "JOBSUP_WEB_SECRET": "a-secret-of-the-test-of-32-chars",
    }
    with web_server(dsn, env=env) as url:
        page.goto(url + "dead")
        assert page.url.endswith("/login")  # no page without a session
        page.fill("input[name=user]", "vic")
        page.fill("input[name=password]", "wrong")
        page.click("button:has-text('Sign in')")
        assert "Wrong user name or password" in page.inner_text("#login-error")
        page.fill("input[name=user]", "vic")
        page.fill("input[name=password]", PASSWORDS["vic"])
        page.click("button:has-text('Sign in')")
        page.click("text=Dead jobs")
        assert "smtp down" in page.inner_text("#dead-jobs")
        assert page.locator("main button").count() == 0 and page.locator("main form").count() == 0
        page.click("text=Queues")
        assert page.locator("main button").count() == 0
        # A forged POST with the viewer's own session and a valid CSRF token (the sign-out form's).
        csrf = page.locator("nav input[name=csrf]").get_attribute("value")
        answer = page.request.post(url + "actions/requeue", form={"ids": str(dead), "csrf": csrf})
        assert answer.status == 403
        assert _count(conn, f"id = {dead} AND status = 'dead'") == 1
