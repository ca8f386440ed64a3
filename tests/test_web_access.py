"""Who may see and do what in the web console, by plain HTTP: the token, the login, the roles, CSRF,
the Host header, escaping, bad ids, and `jobsup web` refusing a non-loopback address without users."""

from __future__ import annotations

import httpx
import pytest

from jobsup import client
from jobsup.errors import BadInput
from jobsup.web.app import create_app

from .helpers import jobsup
from .web_helpers import TOKEN, csrf_of, login_client, main_of, make_dead, sign_in, token_client, web_server

PAGES = ["/", "/dead", "/queues", "/limits", "/workflows", "/schedules", "/latency", "/audit", "/jobs/1"]


def test_without_the_token_nothing_is_served(dsn):
    web = token_client(dsn)
    for path in PAGES:
        answer = web.get(path)
        assert answer.status_code == 401, path
        assert "Token needed" in answer.text
    assert web.post("/actions/pause", data={"queue": "q"}).status_code == 401
    assert web.get("/live.json").status_code == 401
    assert web.get("/?token=wrong").status_code == 401
    # The right token sets a session cookie and leaves the address bar.
    answer = web.get(f"/dead?token={TOKEN}")
    assert answer.status_code == 303 and answer.headers["location"] == "/dead"
    assert (
        "httponly" in answer.headers["set-cookie"].lower() and "samesite=strict" in answer.headers["set-cookie"].lower()
    )
    assert web.get("/dead").status_code == 200


def test_host_header_is_checked(dsn):
    web = token_client(dsn)
    web.get(f"/?token={TOKEN}")
    assert web.get("/", headers={"host": "attacker.example"}).status_code == 400
    assert web.get("/", headers={"host": "localhost:8080"}).status_code == 200


def test_security_headers(dsn):
    answer = token_client(dsn).get("/")
    csp = answer.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert answer.headers["x-frame-options"] == "DENY" and answer.headers["referrer-policy"] == "no-referrer"


def test_login_needed_and_throttled(dsn):
    web = login_client(dsn)
    answer = web.get("/")
    assert answer.status_code == 303 and answer.headers["location"] == "/login"
    assert web.get("/dead", headers={"x-jobsup-fragment": "1"}).status_code == 401
    page = web.get("/login")
    csrf = csrf_of(page.text)
    wrong = web.post("/login", data={"user": "olga", "password": "nope", "csrf": csrf})
    assert wrong.status_code == 401 and "Wrong user name or password" in wrong.text
    for _ in range(4):
        web.post("/login", data={"user": "olga", "password": "nope", "csrf": csrf})
    throttled = web.post("/login", data={"user": "olga", "password": "operator-pw", "csrf": csrf})
    assert throttled.status_code == 429 and "Too many failed attempts" in throttled.text
    # Another client (another address would be another key; the name's key holds here too).
    assert web.get("/").status_code == 303


def test_login_without_csrf_is_refused(dsn):
    web = login_client(dsn)
    web.get("/login")
    answer = web.post("/login", data={"user": "olga", "password": "operator-pw"})
    assert answer.status_code == 403
    assert web.get("/").status_code == 303  # not signed in


def test_viewer_sees_no_buttons_and_a_forged_post_changes_nothing(dsn, conn):
    [dead] = make_dead(conn, "email", "smtp down")
    web = login_client(dsn)
    sign_in(web, "vic")
    page = web.get("/dead")
    assert page.status_code == 200 and "email" in page.text
    assert "<button" not in main_of(page.text) and "Requeue" not in page.text
    job = main_of(web.get(f"/jobs/{dead}").text)
    assert "<button" not in job and "Requeue" not in job and "Cancel" not in job
    csrf = csrf_of(page.text)  # the sign-out form's: a valid token, the wrong role
    for action, data in [
        ("/actions/requeue", {"ids": str(dead)}),
        ("/actions/pause", {"queue": "default"}),
        ("/actions/limit", {"kind": "email", "concurrency": "1"}),
        ("/actions/cancel", {"id": str(dead)}),
    ]:
        answer = web.post(action, data={**data, "csrf": csrf})
        assert answer.status_code == 403, action
    assert conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (dead,)).fetchone()[0] == "dead"
    assert conn.execute("SELECT count(*) FROM jobsup.queue_pauses").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM jobsup.limits").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM jobsup.audit").fetchone()[0] == 0


def test_post_without_csrf_is_refused(dsn, conn):
    [dead] = make_dead(conn, "email", "smtp down")
    web = login_client(dsn)
    sign_in(web, "olga")
    assert web.post("/actions/requeue", data={"ids": str(dead)}).status_code == 403
    assert web.post("/actions/requeue", data={"ids": str(dead), "csrf": "forged"}).status_code == 403
    assert conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (dead,)).fetchone()[0] == "dead"
    page = web.get("/dead")
    assert "Requeue" in page.text
    answer = web.post("/actions/requeue", data={"ids": str(dead), "csrf": csrf_of(page.text)})
    assert answer.status_code == 303
    assert conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (dead,)).fetchone()[0] == "queued"


def test_payload_and_error_are_shown_as_text(dsn, conn):
    evil = "<img src=x onerror=alert(1)><script>alert(2)</script>"
    [dead] = make_dead(conn, "x<b>kind</b>", evil, payload={"html": evil})
    web = token_client(dsn)
    web.get(f"/?token={TOKEN}")
    for path in ("/", "/dead", f"/jobs/{dead}"):
        text = web.get(path).text
        assert "<img src=x" not in text and "<script>alert" not in text and "<b>kind" not in text, path
    job = web.get(f"/jobs/{dead}").text
    assert "&lt;img src=x onerror=alert(1)&gt;" in job


def test_unknown_and_malformed_ids(dsn):
    web = token_client(dsn)
    web.get(f"/?token={TOKEN}")
    assert web.get("/jobs/999999").status_code == 404
    assert web.get("/workflows/999999").status_code == 404
    for bad in ("abc", "0", "-1", "1.5", "99999999999999999999"):
        assert web.get(f"/jobs/{bad}").status_code == 400, bad
        assert web.get(f"/workflows/{bad}").status_code == 400, bad
    assert web.get("/no/such/page").status_code == 404
    assert web.get("/dead/confirm").status_code == 400


def test_mounting_without_identify_is_refused(dsn):
    with pytest.raises(BadInput, match="identify"):
        create_app(dsn)


def test_mounted_under_a_prefix(dsn, conn):
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    client.enqueue(conn, "email", {})
    roles = {"ann": "operator", "ben": "viewer"}

    def identify(request):
        name = request.headers.get("x-user")
        return (name, roles[name]) if name in roles else None

    host = Starlette(routes=[Mount("/admin/jobs", app=create_app(dsn, identify, secret="x" * 32))])
    web = TestClient(host, base_url="http://testserver")
    assert web.get("/admin/jobs/").status_code == 401
    page = web.get("/admin/jobs/queues", headers={"x-user": "ann"})
    assert page.status_code == 200
    assert 'href="/admin/jobs/static/jobsup.css"' in page.text and 'action="/admin/jobs/actions/pause"' in page.text
    assert web.get("/admin/jobs/static/jobsup.js").status_code == 200
    answer = web.post(
        "/admin/jobs/actions/pause",
        data={"queue": "default", "csrf": csrf_of(page.text)},
        headers={"x-user": "ann"},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    assert conn.execute("SELECT paused_by FROM jobsup.queue_pauses").fetchone()[0] == "ann"
    viewer = web.get("/admin/jobs/queues", headers={"x-user": "ben"})
    assert "<button" not in main_of(viewer.text)


@pytest.mark.slow
def test_jobsup_web_on_loopback_by_plain_http(dsn):
    with web_server(dsn) as url:
        base = url.split("?")[0].rstrip("/")
        assert httpx.get(base + "/").status_code == 401
        assert httpx.get(base + "/healthz").text == "ok\n"
        with httpx.Client(follow_redirects=True) as web:
            assert web.get(url).status_code == 200
            assert web.get(base + "/live.json").json()["version"]


def test_non_loopback_without_auth_is_refused():
    done = jobsup("web", "--host", "0.0.0.0", "--dsn", "postgresql://nobody@127.0.0.1:1/none")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "refusing to listen on 0.0.0.0 without authentication" in done.stderr


def test_hash_password_and_add_user(tmp_path):
    done = jobsup("web", "--hash-password", input="pw\n")
    assert done.returncode == 0 and done.stdout.startswith("scrypt$")
    users = tmp_path / "users"
    assert (
        jobsup("web", "--add-user", "ann", "--role", "operator", "--users-file", str(users), input="pw\n").returncode
        == 0
    )
    assert users.read_text().startswith("ann:operator:scrypt$")
    assert oct(users.stat().st_mode & 0o777) == "0o600"
    bad = jobsup("web", "--users-file", str(tmp_path / "missing"), "--dsn", "postgresql://x@127.0.0.1:1/x")
    assert bad.returncode == 2 and "cannot read the users file" in bad.stderr


def test_cookies_are_secure_behind_https(dsn):
    from starlette.testclient import TestClient

    web = token_client(dsn)
    https = TestClient(web.app, base_url="https://127.0.0.1", follow_redirects=False)
    answer = https.get(f"/?token={TOKEN}")
    cookies = answer.headers.get_list("set-cookie")
    assert cookies and all("secure" in c.lower() for c in cookies)
    plain = web.get(f"/?token={TOKEN}").headers.get_list("set-cookie")
    assert plain and not any("secure" in c.lower() for c in plain)


@pytest.mark.slow
def test_x_forwarded_proto_is_believed_from_a_trusted_proxy_only(dsn):
    forwarded = {"X-Forwarded-Proto": "https"}
    with web_server(dsn, "--trusted-proxy", "127.0.0.1") as url:
        assert "secure" in httpx.get(url, headers=forwarded).headers["set-cookie"].lower()
    with web_server(dsn) as url:
        assert "secure" not in httpx.get(url, headers=forwarded).headers["set-cookie"].lower()
