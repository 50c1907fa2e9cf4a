"""The operator console, end to end: a real nats-server (fixture `nats_url` from
conftest), a real in-process Muster, the Starlette app driven through httpx."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.api.app import build_app
from server.api.auth import SESSION_PREFIX, session_hash
from server.api.tokens import create_token
from server.replica import Muster, ServerConfig
from tests.conftest import eventually
from tests.factories import heartbeat
from web.console import COOKIE, console_routes, csrf_token
from web.console.session import LOGIN_FAILURES, LoginThrottle
from wire import subjects
from wire.messages import JobState, encode

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'"
)


@dataclass
class Console:
    muster: Muster
    app: object
    client: httpx.AsyncClient
    token: str

    @property
    def session(self) -> str:
        """The session id the client holds in its cookie (once signed in)."""
        return self.client.cookies.get(COOKIE) or ""

    @property
    def token_hash(self) -> str:
        return hashlib.sha256(self.token.encode()).hexdigest()

    @property
    def csrf(self) -> str:
        return csrf_token(session_hash(self.session))

    async def login(self) -> None:
        r = await self.client.post("/login", data={"token": self.token})
        assert r.status_code == 303, r.text


@pytest.fixture
async def console(nats_url: str, tmp_path: Path) -> AsyncIterator[Console]:
    muster = Muster(ServerConfig(nats_url=nats_url, data_dir=tmp_path, http_port=0))
    await muster.start()
    try:
        assert muster.new_token, "a fresh cluster must create the operator token"
        app = build_app(muster, routes=console_routes(), manage_lifecycle=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            yield Console(muster, app, client, muster.new_token)
    finally:
        await muster.shutdown()


async def put_heartbeat(m: Muster, host_id: str, *, simulated: bool = True, gpus: int = 2) -> None:
    hb = heartbeat(host_id, seq=0, ts=time.time(), labels={"rack": "r1"}, gpus=gpus, gpu_memory_mb=81920, util=40.0,
                   cpus=32, memory_mb=256 * 1024, cpu_pct=12.5, mem_used_mb=4096, simulated=simulated)
    assert m.store is not None
    await m.store.put(host_id, encode(hb), bucket=subjects.HOSTS_BUCKET)


async def submitted(m: Muster, data: dict[str, Any], user: str = "operator") -> Any:
    """A job submitted through the replica, once its view has it."""
    job = await m.submit(data, user)
    await eventually(lambda: job.id in m.state.jobs, what=f"job {data['name']} in the view")
    return job


def assert_security_headers(r: httpx.Response) -> None:
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "same-origin"
    assert r.headers["x-frame-options"] == "DENY"


# ---------------------------------------------------------------- sign-in


async def test_login_wrong_token_fails_right_token_sets_cookie(console: Console) -> None:
    c = console.client
    r = await c.get("/login")
    assert r.status_code == 200
    assert 'name="token"' in r.text

    assert (await c.get("/favicon.ico")).status_code == 204  # no icon, and no 404 in the browser's console
    r = await c.post("/login", data={"token": "mst_wrong"})
    assert r.status_code == 401
    assert "not valid" in r.text
    assert "set-cookie" not in r.headers
    r = await c.post("/login", data={})
    assert r.status_code == 401

    r = await c.post("/login", data={"token": console.token})
    assert r.status_code == 303
    assert r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={console.session};")
    # The cookie is a random session id: not the token, nor its hash (which `muster token
    # list` shows), and a new one at each sign-in.
    assert console.token not in cookie and console.token_hash not in cookie and len(console.session) >= 40
    first = console.session
    low = cookie.lower()
    # Lax (found by exploring: under Strict a link from a chat or a ticket landed on the
    # sign-in form); every change is a POST with the CSRF token.
    assert "httponly" in low and "samesite=lax" in low and "path=/" in low
    assert "secure" not in low  # plain http here
    assert "max-age=28800" in low  # MUSTER_SESSION_TTL
    assert (await c.get("/")).status_code == 200
    assert (await c.post("/login", data={"token": console.token})).status_code == 303
    assert console.session != first
    # Every replica knows the session: it is in the state bucket, under its hash.
    m = console.muster
    assert m.store is not None
    rec = await m.store.get(SESSION_PREFIX + session_hash(console.session))
    assert rec.value is not None and console.token_hash.encode() in rec.value

    # Over https the cookie is Secure, and responses carry HSTS.
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app), base_url="https://test") as tls:
        r = await tls.post("/login", data={"token": console.token})
        assert r.status_code == 303
        assert "secure" in r.headers["set-cookie"].lower()
        assert r.headers["strict-transport-security"] == "max-age=31536000"
    assert "strict-transport-security" not in (await c.get("/login")).headers


async def test_a_sign_in_posted_from_another_site_is_refused(console: Console) -> None:
    """Login CSRF (found by exploring): a form on another site could sign a browser in under
    a token of its own. A browser says where a form was posted from (Sec-Fetch-Site, and
    Origin): from another site it is refused; from the console's own page, or unsaid, it is
    not."""
    c = console.client
    for site in ("cross-site", "same-site"):
        r = await c.post("/login", data={"token": console.token}, headers={"Sec-Fetch-Site": site})
        assert r.status_code == 403 and "set-cookie" not in r.headers and "own page" in r.text, (site, r.text)
    for site in ("same-origin", "none"):
        r = await c.post("/login", data={"token": console.token}, headers={"Sec-Fetch-Site": site})
        assert r.status_code == 303 and "set-cookie" in r.headers, site
    # A browser that does not send Sec-Fetch-Site sends Origin: another host's, or "null"
    # (a sandboxed frame), is refused; the console's own is not (the test client's host is
    # "test").
    for origin in ("https://evil.example", "http://test.evil.example", "null", "http://evil.test", "http://[test"):
        r = await c.post("/login", data={"token": console.token}, headers={"Origin": origin})
        assert r.status_code == 403 and "set-cookie" not in r.headers, origin
    # Its own host, on any port (a proxy's `Host $host` drops the port it listens on).
    for origin in ("http://test", "https://test:8443"):
        r = await c.post("/login", data={"token": console.token}, headers={"Origin": origin})
        assert r.status_code == 303 and "set-cookie" in r.headers, origin
    # Where the browser says Sec-Fetch-Site, that is what counts (behind a proxy that
    # rewrites Host, the console's own origin differs from the Host header).
    r = await c.post("/login", data={"token": console.token},
                     headers={"Origin": "https://muster.example", "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 303 and "set-cookie" in r.headers


async def test_behind_a_trusted_tls_proxy_the_cookie_is_secure(console: Console) -> None:
    """A TLS-terminating proxy at a trusted address (127.0.0.1 by default) says
    X-Forwarded-Proto: https; from an untrusted address the header is ignored."""
    https = {"X-Forwarded-Proto": "https"}
    r = await console.client.post("/login", data={"token": console.token}, headers=https)
    assert r.status_code == 303 and "secure" in r.headers["set-cookie"].lower()
    assert r.headers["strict-transport-security"] == "max-age=31536000"
    untrusted = httpx.ASGITransport(app=console.app, client=("203.0.113.9", 4000))
    async with httpx.AsyncClient(transport=untrusted, base_url="http://test") as far:
        r = await far.post("/login", data={"token": console.token}, headers=https)
        assert r.status_code == 303 and "secure" not in r.headers["set-cookie"].lower()
        assert "strict-transport-security" not in r.headers


async def test_failed_sign_ins_are_limited_per_address(console: Console) -> None:
    c = console.client
    for _ in range(LOGIN_FAILURES):
        assert (await c.post("/login", data={"token": "mst_guess"})).status_code == 401
    r = await c.post("/login", data={"token": "mst_guess"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    assert (await c.post("/login", data={"token": console.token})).status_code == 429  # even the right one
    other = httpx.ASGITransport(app=console.app, client=("192.0.2.7", 4000))
    async with httpx.AsyncClient(transport=other, base_url="http://test") as elsewhere:
        assert (await elsewhere.post("/login", data={"token": console.token})).status_code == 303


def test_login_throttle_forgets_old_failures_and_old_addresses() -> None:
    t = LoginThrottle(failures=3, window_s=60, max_clients=2)
    for now in (0.0, 1.0, 2.0):
        assert t.wait_s("a", now) == 0
        t.failed("a", now)
    assert t.wait_s("a", 30.0) == 30.0  # the first failure leaves the window at 60
    assert t.wait_s("a", 60.0) == 0
    t.failed("b", 61.0)
    t.failed("c", 62.0)  # past max_clients: "a" (seen longest ago) is forgotten
    assert "a" not in t._seen and {"b", "c"} == set(t._seen)


async def test_logged_out_user_is_redirected(console: Console) -> None:
    c = console.client
    assert (await c.get("/")).headers["location"] == "/login"
    for path in ("/hosts", "/jobs", "/submit", "/jobs/j123", "/hosts/h1"):
        r = await c.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"] == "/login?next=" + path.replace("/", "%2F")
        assert_security_headers(r)
    r = await c.get("/hosts", headers={"HX-Request": "true"})
    assert r.status_code == 401
    assert r.headers["hx-redirect"] == "/login?next=%2Fhosts"
    r = await c.post("/submit", data={"name": "x", "command": "true"})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert console.muster.state.jobs == {}

    # A forged cookie is not a session.
    c.cookies.set(COOKIE, "0" * 64)
    assert (await c.get("/")).status_code == 303
    c.cookies.clear()

    # Signed in, then the token is revoked: logged out at the next request.
    await console.login()
    assert (await c.get("/")).status_code == 200
    console.muster.state.tokens.pop(console.token_hash)
    r = await c.get("/")
    assert r.status_code == 303 and r.headers["location"] == "/login"


async def test_sign_in_returns_to_the_page_asked_for(console: Console) -> None:
    """Found by exploring: a link into the console (from a chat, a ticket) landed on the
    sign-in form, and sign-in then went to the overview, the page asked for forgotten. The
    redirect to sign-in carries it (`next`), the form keeps it, sign-in goes there: a path
    on this console only, never another site."""
    c = console.client
    r = await c.get("/jobs?state=RUNNING&queue=default")
    assert r.status_code == 303
    assert r.headers["location"] == "/login?next=%2Fjobs%3Fstate%3DRUNNING%26queue%3Ddefault"
    r = await c.get(r.headers["location"])
    assert r.status_code == 200
    assert '<input type="hidden" name="next" value="/jobs?state=RUNNING&amp;queue=default">' in r.text
    # A wrong token: the form again, still keeping it.
    r = await c.post("/login", data={"token": "mst_wrong", "next": "/hosts/h1"})
    assert r.status_code == 401 and '<input type="hidden" name="next" value="/hosts/h1">' in r.text
    r = await c.post("/login", data={"token": console.token, "next": "/jobs?state=RUNNING&queue=default"})
    assert r.status_code == 303 and r.headers["location"] == "/jobs?state=RUNNING&queue=default"
    # Signed in already: the sign-in form's link goes straight there.
    r = await c.get("/login?next=%2Fqueues")
    assert r.status_code == 303 and r.headers["location"] == "/queues"
    # Anything but a local path is the overview: another site (an open redirect), a
    # scheme, a backslash or a control character a browser would read as "//".
    for bad in ("https://evil.example/", "//evil.example", "/\\evil.example", "\\evil.example", "/\\/evil.example",
                "javascript:alert(1)", "/\t/evil.example", "/\n/evil.example", " /jobs", "evil.example", "",
                "/" + "x" * 3000):
        c.cookies.clear()
        r = await c.post("/login", data={"token": console.token, "next": bad})
        assert r.status_code == 303 and r.headers["location"] == "/", bad
        r = await c.get("/login", params={"next": bad})
        assert 'name="next"' not in r.text, bad
    # A form posted elsewhere is not a page to come back to.
    c.cookies.clear()
    r = await c.post("/jobs/j1/cancel", data={"reason": "x"})
    assert r.status_code == 303 and r.headers["location"] == "/login"


async def test_a_session_expires(console: Console) -> None:
    c = console.client
    await console.login()
    assert (await c.get("/")).status_code == 200
    info = console.muster.state.sessions[session_hash(console.session)]
    info.expires_at = time.time() - 1
    assert (await c.get("/")).status_code == 303


async def test_logout(console: Console) -> None:
    c = console.client
    await console.login()
    r = await c.post("/logout", data={})
    assert r.status_code == 403
    session = console.session
    r = await c.post("/logout", data={"csrf": console.csrf})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert COOKIE in r.headers["set-cookie"]
    assert (await c.get("/")).status_code == 303
    # The session ended on the server: the old cookie, kept by whoever copied it, is dead.
    c.cookies.set(COOKIE, session)
    assert (await c.get("/")).status_code == 303
    m = console.muster
    assert m.store is not None
    assert (await m.store.get(SESSION_PREFIX + session_hash(session))).value is None


# ---------------------------------------------------------------- pages


async def test_pages_render_with_security_headers(console: Console) -> None:
    c = console.client
    assert_security_headers(await c.get("/login"))
    await console.login()
    # The replica's role is shown as it is when the page is made: wait for the election
    # (slow on a loaded machine), so the page and the assertion see the same role.
    await eventually(lambda: console.muster.role == "leader", 60, "leadership")

    r = await c.get("/")
    assert r.status_code == 200
    assert_security_headers(r)
    assert "Leader term" in r.text and "<strong>leader</strong>" in r.text
    assert "No hosts have reported yet" in r.text
    assert "No jobs yet" in r.text
    for label in ("Overview", "Hosts", "Jobs", "Submit", "Logout"):
        assert label in r.text
    # No inline script or style anywhere (the CSP would block them).
    assert "<style" not in r.text and "style=" not in r.text
    assert re.search(r"<script(?![^>]*\bsrc=)", r.text) is None
    assert '<script src="/static/htmx/htmx.min.js"' in r.text
    assert """<meta name="htmx-config" content='{"includeIndicatorStyles":false}'>""" in r.text
    assert 'hx-trigger="every 2s"' in r.text

    # The htmx poll gets only the live fragment.
    r = await c.get("/", headers={"HX-Request": "true"})
    assert r.status_code == 200
    assert r.text.lstrip().startswith('<div id="live"') and "<html" not in r.text
    assert_security_headers(r)

    r = await c.get("/hosts")
    assert r.status_code == 200 and "No hosts have reported yet" in r.text
    r = await c.get("/jobs")
    assert r.status_code == 200 and "No jobs yet" in r.text
    r = await c.get("/jobs?state=RUNNING")
    assert r.status_code == 200 and "No RUNNING jobs" in r.text
    r = await c.get("/submit")
    assert r.status_code == 200
    assert f'name="csrf" value="{console.csrf}"' in r.text
    for name in ("name", "command", "gpus", "gpu_model", "cpus", "memory_mb"):
        assert f'name="{name}"' in r.text

    r = await c.get("/jobs/jnope")
    assert r.status_code == 404
    assert_security_headers(r)
    assert (await c.get("/hosts/nope")).status_code == 404

    # The static files the pages use are served.
    assert (await c.get("/static/muster.css")).status_code == 200
    assert (await c.get("/static/htmx/htmx.min.js")).status_code == 200


# ---------------------------------------------------------------- submit


async def test_invalid_submission_shows_field_errors_and_stores_nothing(console: Console) -> None:
    c = console.client
    await console.login()
    r = await c.post("/submit", data={
        "csrf": console.csrf, "name": "bad name!", "command": "echo 'unterminated",
        "gpus": "lots", "gpu_model": "", "cpus": "0", "memory_mb": "-5",
    })
    assert r.status_code == 422
    assert_security_headers(r)
    for field in ("name", "command", "gpus", "cpus", "memory_mb"):
        assert f'id="f-{field}-error"' in r.text, field
    assert 'id="f-gpu_model-error"' not in r.text
    assert "cannot be split into arguments" in r.text
    # What was typed is kept.
    assert 'value="bad name!"' in r.text
    # GPU model without GPUs, unknown model.
    r = await c.post("/submit", data={
        "csrf": console.csrf, "name": "ok", "command": "true", "gpus": "0", "gpu_model": "H100",
        "cpus": "1", "memory_mb": "512",
    })
    assert r.status_code == 422 and 'id="f-gpu_model-error"' in r.text
    r = await c.post("/submit", data={
        "csrf": console.csrf, "name": "ok", "command": "true", "gpus": "1", "gpu_model": "Z9000",
        "cpus": "1", "memory_mb": "512",
    })
    assert r.status_code == 422 and "unknown GPU model" in r.text
    r = await c.post("/submit", data={"csrf": console.csrf, "name": "ok", "command": "   "})
    assert r.status_code == 422 and 'id="f-command-error"' in r.text

    await asyncio.sleep(0.5)  # let history flush, should anything have been stored
    assert console.muster.state.jobs == {}
    assert console.muster.history is not None
    assert console.muster.history.list_jobs() == ([], 0)


async def test_submission_to_a_queue_with_a_time_limit(console: Console) -> None:
    """The submit form offers the queues the session's token may use, takes a time limit,
    and shows the queue's refusals on their fields."""
    c = console.client
    m = console.muster
    await console.login()
    await m.create_queue({"name": "vision", "max_time_limit_s": 3600}, "operator")
    await m.create_queue({"name": "audio"}, "operator")
    await eventually(lambda: {"vision", "audio"} <= set(m.state.queues), what="the queues in the view")
    form = await c.get("/submit")
    assert '<option value="vision">' in form.text and '<option value="audio">' in form.text
    base = {"csrf": console.csrf, "name": "q-job", "command": "true", "cpus": "1", "memory_mb": "512"}
    r = await c.post("/submit", data={**base, "queue": "vision", "time_limit": "7200"})
    assert r.status_code == 422 and 'id="f-time_limit-error"' in r.text and "allows at most 3600 s" in r.text
    r = await c.post("/submit", data={**base, "queue": "nope"})
    assert r.status_code == 422 and 'id="f-queue-error"' in r.text and "no queue named" in r.text
    r = await c.post("/submit", data={**base, "queue": "vision", "time_limit": "1800"})
    assert r.status_code == 303, r.text
    job = m.state.jobs[r.headers["location"].split("/")[2].split("?")[0]]
    assert (job.spec.queue, job.spec.time_limit_s) == ("vision", 1800.0)
    page = await c.get(f"/jobs/{job.id}")
    assert "<dt>Time limit</dt><dd>1800 s <span class=\"muted\">(its own)</span>" in page.text
    r = await c.post("/submit", data={**base, "queue": "vision"})  # none given: the queue's maximum
    page = await c.get(r.headers["location"])
    assert "<dt>Time limit</dt><dd>3600 s <span class=\"muted\">(the queue&#39;s maximum)</span>" in page.text
    # A token bound to one queue is offered that one, and refused another on the field.
    assert m.store is not None
    bound, _ = await create_token(m.store, "vic", "operator", ["audio"])
    await eventually(lambda: len(m.state.tokens) == 2, what="the bound token in the view")
    c.cookies.clear()
    assert (await c.post("/login", data={"token": bound})).status_code == 303
    form = await c.get("/submit")
    assert '<option value="audio">' in form.text and '<option value="vision">' not in form.text
    assert "the queue to run in (default: audio)" in form.text
    r = await c.post("/submit", data={**base, "csrf": console.csrf, "queue": "vision"})
    assert r.status_code == 403 and 'id="f-queue-error"' in r.text and "may not submit to queue" in r.text


async def test_a_gang_with_a_priority_from_the_form(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    base = {"csrf": console.csrf, "name": "gang", "command": "torchrun train.py", "gpus": "8", "cpus": "1",
            "memory_mb": "512"}
    r = await c.post("/submit", data={**base, "replicas": "0"})
    assert r.status_code == 422 and 'id="f-replicas-error"' in r.text, r.text
    r = await c.post("/submit", data={**base, "host_labels": "zone"})
    assert r.status_code == 422 and 'id="f-host_labels-error"' in r.text and "expected KEY=VALUE" in r.text
    r = await c.post("/submit", data={**base, "host_labels": "Zone=a"})
    assert r.status_code == 422 and 'id="f-host_labels-error"' in r.text and "invalid label key" in r.text
    r = await c.post("/submit", data={**base, "after_rule": "bogus"})
    assert r.status_code == 422 and 'id="f-after_rule-error"' in r.text and "ok, any or notok" in r.text, r.text
    r = await c.post("/submit", data={**base, "exclude_hosts": "gpu/7"})
    assert r.status_code == 422 and 'id="f-exclude_hosts-error"' in r.text and "host ids" in r.text, r.text
    r = await c.post("/submit", data={**base, "replicas": "4", "priority": "7", "host_labels": "zone=eu-1, net=ib",
                                      "exclude_hosts": "gpu-9, gpu-7"})
    assert r.status_code == 303, r.text
    job = m.state.jobs[r.headers["location"].split("/")[2].split("?")[0]]
    assert (job.spec.replicas, job.spec.priority, job.spec.gpus) == (4, 7, 8)
    assert job.spec.host_labels == {"zone": "eu-1", "net": "ib"}
    assert job.spec.exclude_hosts == ["gpu-7", "gpu-9"]
    page = await c.get(f"/jobs/{job.id}")
    assert '<span class="label">net=ib</span> <span class="label">zone=eu-1</span>' in page.text
    assert '<dd id="job-exclude"><a href="/hosts/gpu-7"><code>gpu-7</code></a>, ' \
           '<a href="/hosts/gpu-9"><code>gpu-9</code></a></dd>' in page.text


async def test_valid_submission_redirects_to_job_page(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    r = await c.post("/submit", data={
        "csrf": console.csrf, "name": "train-1", "command": "python -c 'print(\"hi there\")'",
        "gpus": "1", "gpu_model": "H100", "cpus": "2", "memory_mb": "1024",
    })
    assert r.status_code == 303, r.text
    loc = r.headers["location"]
    m_ = re.fullmatch(r"/jobs/(j[0-9a-f]+)\?notice=submitted", loc)
    assert m_, loc
    job_id = m_.group(1)
    job = m.state.jobs[job_id]
    assert job.spec.command == ["python", "-c", 'print("hi there")']
    assert job.spec.user == "operator"
    assert (job.spec.gpus, job.spec.gpu_model, job.spec.cpus, job.spec.memory_mb) == (1, "H100", 2.0, 1024)

    r = await c.get(loc)
    assert r.status_code == 200
    assert_security_headers(r)
    assert "Job submitted." in r.text
    assert "train-1" in r.text and "QUEUED" in r.text
    assert "Why pending" in r.text and "Queue position" in r.text
    assert "No hosts have reported yet" in r.text
    assert f'action="/jobs/{job_id}/cancel"' in r.text
    # The live poll of the job page is a fragment.
    r = await c.get(f"/jobs/{job_id}", headers={"HX-Request": "true"})
    assert r.status_code == 200 and "<html" not in r.text and "QUEUED" in r.text

    # With a host that cannot take it (no free capacity of that model), the reasons are counted.
    await put_heartbeat(m, "sim-a100", gpus=0)
    await eventually(lambda: "sim-a100" in m.state.hosts, what="heartbeat")
    r = await c.get(f"/jobs/{job_id}")
    assert "wrong GPU model" in r.text

    # The jobs list shows it (live overlay, then history).
    r = await c.get("/jobs")
    assert r.status_code == 200 and job_id in r.text
    r = await c.get("/jobs?state=QUEUED")
    assert job_id in r.text
    r = await c.get("/jobs?state=FAILED")
    assert job_id not in r.text


async def test_post_without_csrf_is_refused(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    good = {"name": "x", "command": "true"}
    r = await c.post("/submit", data=good)
    assert r.status_code == 403
    assert_security_headers(r)
    r = await c.post("/submit", data={**good, "csrf": "0" * 64})
    assert r.status_code == 403
    assert m.state.jobs == {}

    await put_heartbeat(m, "sim-1")
    await eventually(lambda: "sim-1" in m.state.hosts, what="heartbeat")
    r = await c.post("/hosts/sim-1/cordon", data={"reason": "maintenance"})
    assert r.status_code == 403
    assert "sim-1" not in m.state.hostcfg
    r = await c.post("/jobs/jx/cancel", data={"reason": "no"})
    assert r.status_code == 403


# ---------------------------------------------------------------- hosts


async def test_hosts_table_paging_search_and_cordon(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    ids = [f"sim-{i:03d}" for i in range(55)] + ["real-1"]
    await asyncio.gather(*(put_heartbeat(m, h, simulated=h != "real-1") for h in ids))
    await eventually(lambda: len(m.state.hosts) == len(ids), what="heartbeats")

    r = await c.get("/hosts")
    assert r.status_code == 200
    assert "56 hosts" in r.text and "Page 1 of 2" in r.text
    assert "SIMULATED" in r.text and "H100" in r.text and "rack=r1" in r.text
    assert r.text.count('<tr class="row-sim">') == 49  # real-1 sorts first, then 49 sim hosts
    r2 = await c.get("/hosts?page=2")
    assert "Page 2 of 2" in r2.text
    assert r2.text.count("<tr") == 1 + 6  # header row + 6 hosts
    assert (await c.get("/hosts?page=abc")).status_code == 200
    r = await c.get("/hosts?q=real")
    assert "real-1" in r.text and "sim-000" not in r.text and "SIMULATED" not in r.text.split("<tbody>")[1]
    r = await c.get("/hosts?q=nothing-like-this")
    assert "No host id contains" in r.text
    r = await c.get("/hosts?page=2", headers={"HX-Request": "true"})
    assert r.text.lstrip().startswith('<div id="live"') and 'hx-get="/hosts?page=2"' in r.text

    r = await c.get("/")
    assert "55 of 56 hosts report simulated GPUs" in r.text

    r = await c.get("/hosts/sim-007")
    assert r.status_code == 200
    assert "SIMULATED" in r.text and "Cordon host" in r.text
    # A reason is required.
    r = await c.post("/hosts/sim-007/cordon", data={"csrf": console.csrf, "reason": " "})
    assert r.status_code == 422 and 'id="cordon-error"' in r.text
    assert not (m.state.hostcfg.get("sim-007") and m.state.hostcfg["sim-007"].cordoned)
    r = await c.post("/hosts/sim-007/cordon", data={"csrf": console.csrf, "reason": "bad fan"})
    assert r.status_code == 303
    assert r.headers["location"] == "/hosts/sim-007?notice=cordoned"
    cfg = m.state.hostcfg["sim-007"]
    assert cfg.cordoned and cfg.by == "operator" and cfg.reason == "bad fan"
    r = await c.get("/hosts/sim-007?notice=cordoned")
    assert "CORDONED" in r.text and "bad fan" in r.text and "Uncordon host" in r.text
    r = await c.post("/hosts/sim-007/uncordon", data={"csrf": console.csrf, "reason": ""})
    assert r.status_code == 422
    r = await c.post("/hosts/sim-007/uncordon", data={"csrf": console.csrf, "reason": "fan replaced"})
    assert r.status_code == 303
    assert not m.state.hostcfg["sim-007"].cordoned
    r = await c.post("/hosts/nope/cordon", data={"csrf": console.csrf, "reason": "x"})
    assert r.status_code == 404


# ---------------------------------------------------------------- cancel


async def test_cancel_form(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    r = await c.post("/submit", data={"csrf": console.csrf, "name": "sleepy", "command": "sleep 100"})
    assert r.status_code == 303
    job_id = r.headers["location"].split("/")[2].split("?")[0]
    r = await c.post(f"/jobs/{job_id}/cancel", data={"csrf": console.csrf, "reason": "not needed"})
    assert r.status_code == 303
    assert r.headers["location"] == f"/jobs/{job_id}?notice=cancel"
    # The leader applies the cancel command.
    await eventually(lambda: m.state.jobs[job_id].state is JobState.CANCELLED, timeout=20,
                     what="the job to be cancelled")
    r = await c.get(f"/jobs/{job_id}")
    assert "CANCELLED" in r.text and "not needed" in r.text
    assert f'action="/jobs/{job_id}/cancel"' not in r.text
    r = await c.post(f"/jobs/{job_id}/cancel", data={"csrf": console.csrf, "reason": "again"})
    assert r.status_code == 409 and "already" in r.text
    r = await c.post("/jobs/jmissing/cancel", data={"csrf": console.csrf})
    assert r.status_code == 404


# ---------------------------------------------------------------- jobs paging, roles


async def test_jobs_table_paging_and_filter(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    for i in range(53):
        job = await m.submit({"name": f"batch-{i:02d}", "command": ["true"], "gpus": 64}, "operator")
        assert job.spec.name == f"batch-{i:02d}"
    assert m.history is not None
    history = m.history
    await eventually(lambda: history.list_jobs(limit=1)[1] == 53, what="history to catch up")
    r = await c.get("/jobs")
    assert r.status_code == 200
    assert "53 jobs" in r.text and "Page 1 of 2" in r.text
    assert r.text.count('id="job-j') == 50
    assert "batch-52" in r.text and "batch-02" not in r.text  # newest first
    r = await c.get("/jobs?page=2")
    assert r.text.count('id="job-j') == 3 and "batch-00" in r.text
    r = await c.get("/jobs?page=99")
    assert r.status_code == 200 and "Page 2 of 2" in r.text
    r = await c.get("/jobs?state=queued")
    assert "53 jobs QUEUED" in r.text
    r = await c.get("/jobs?state=BOGUS")
    assert r.status_code == 200 and "Unknown state" in r.text
    r = await c.get("/jobs?page=2", headers={"HX-Request": "true"})
    assert r.text.lstrip().startswith('<div id="live"') and 'hx-get="/jobs?page=2"' in r.text


async def test_viewer_token_may_only_view(console: Console) -> None:
    from server.state.cluster import TokenInfo

    c = console.client
    m = console.muster
    viewer = "mst_viewer-token"
    h = hashlib.sha256(viewer.encode()).hexdigest()
    m.state.tokens[h] = TokenInfo(name="alice", role="viewer")
    r = await c.post("/login", data={"token": viewer})
    assert r.status_code == 303
    r = await c.get("/")
    assert r.status_code == 200 and "alice" in r.text
    r = await c.post("/submit", data={"csrf": console.csrf, "name": "x", "command": "true"})
    assert r.status_code == 403
    assert m.state.jobs == {}
    page = (await c.get("/submit")).text  # no form it could not use
    assert 'action="/submit"' not in page and "it cannot submit jobs" in page


async def test_a_viewer_sees_no_job_environment(console: Console) -> None:
    """A job's env may hold its owner's secrets: operators see it on the job page, viewers
    do not (nor does GraphQL show it to anyone)."""
    m = console.muster
    job = await m.submit({"name": "envy", "command": ["true"], "gpus": 64, "env": {"WANDB_API_KEY": "k-123"}},
                         "operator")
    assert job is not None
    await eventually(lambda: job.id in m.state.jobs, what="the job in the view")
    c = console.client
    await console.login()
    assert "WANDB_API_KEY=k-123" in (await c.get(f"/jobs/{job.id}")).text
    assert m.store is not None
    viewer, _ = await create_token(m.store, "vera", "viewer")
    await eventually(lambda: len(m.state.tokens) == 2, what="the viewer token in the view")
    c.cookies.clear()
    assert (await c.post("/login", data={"token": viewer})).status_code == 303
    page = await c.get(f"/jobs/{job.id}")
    assert page.status_code == 200 and "envy" in page.text
    assert "WANDB_API_KEY" not in page.text and "k-123" not in page.text


async def test_an_admin_sets_hosts_aside_and_deletes_the_reservation_from_the_queues_page(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()  # the cluster's first token: an admin's
    for h in ("ar1", "ar2"):
        await put_heartbeat(m, h)
    await eventually(lambda: len(m.state.hosts) == 2, what="the hosts in the view")
    await m.create_queue({"name": "launch"}, "operator")
    page = (await c.get("/queues")).text
    assert 'action="/queues/reservations"' in page and "or <a href=\"#new-reservation\">the form below</a>" in page
    form = {"csrf": console.csrf, "name": "launch-run", "hosts": "", "rack": "r1", "label": "", "queues": "launch",
            "users": "", "start": "", "duration": "", "description": "the launch"}
    r = await c.post("/queues/reservations", data=form)  # no duration: refused at its form, the values kept
    # Each error names its field by its label (found by exploring: "no host has it" did not
    # say which field had it wrong).
    assert r.status_code == 422 and 'id="advres-error"' in r.text and "For: a duration such as 8h" in r.text
    assert 'value="launch-run"' in r.text and "<details class=\"card\" id=\"new-reservation\" open>" in r.text
    r = await c.post("/queues/reservations", data={**form, "rack": "nope", "duration": "2h"})
    assert r.status_code == 422 and "Rack: no host has it" in r.text
    r = await c.post("/queues/reservations", data={**form, "queues": "nope", "duration": "2h"})
    assert r.status_code == 422 and "For queues: no queue named &#39;nope&#39;" in r.text, r.text
    r = await c.post("/queues/reservations", data={**form, "start": "soon", "duration": "2h"})
    assert r.status_code == 422 and "Opens: the start must be a date and time" in r.text
    r = await c.post("/queues/reservations", data={**form, "duration": "2h"})
    assert r.status_code == 303 and r.headers["location"] == "/queues?notice=advres-created#advance-reservations"
    made = m.state.advance["launch-run"]
    assert sorted(made.hosts) == ["ar1", "ar2"] and made.queues == ["launch"] and made.by == "operator"
    assert made.ends - made.starts == pytest.approx(7200, abs=5) and made.description == "the launch"
    page = (await c.get("/queues?notice=advres-created")).text
    assert "Advance reservation made" in page
    row = page[page.index('id="advres-launch-run"'):]
    row = row[:row.index("</tr>")]
    assert "<td>open</td><td>queue launch</td>" in row and 'action="/queues/reservations/launch-run/delete"' in row
    r = await c.post("/queues/reservations", data={**form, "duration": "2h"})  # the name is taken
    assert r.status_code == 422 and "exists" in r.text
    # Not an admin: no form, no delete button, and the endpoints refuse.
    assert m.store is not None
    operator, _ = await create_token(m.store, "otto", "operator")
    await eventually(lambda: len(m.state.tokens) == 2, what="the operator token in the view")
    admin_cookies = dict(c.cookies)
    c.cookies.clear()
    assert (await c.post("/login", data={"token": operator})).status_code == 303
    page = (await c.get("/queues")).text
    assert 'id="advres-launch-run"' in page and 'action="/queues/reservations' not in page
    r = await c.post("/queues/reservations/launch-run/delete", data={"csrf": console.csrf})
    assert r.status_code == 403 and "admin" in r.text and "launch-run" in m.state.advance
    c.cookies.clear()
    c.cookies.update(admin_cookies)
    r = await c.post("/queues/reservations/launch-run/delete", data={"csrf": console.csrf})
    assert r.status_code == 303 and "notice=advres-deleted" in r.headers["location"]
    assert "launch-run" not in m.state.advance
    r = await c.post("/queues/reservations/launch-run/delete", data={"csrf": console.csrf})
    assert r.status_code == 404


async def test_jobs_list_filters_by_name_and_user_and_acts_on_what_they_match(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    sweep = [await m.submit({"name": f"sweep-{i}", "command": ["true"], "gpus": 64, "group": "sw"}, "operator")
             for i in range(3)]
    other = await m.submit({"name": "train", "command": ["true"], "gpus": 64}, "operator")
    await eventually(lambda: all(j.id in m.state.jobs for j in [*sweep, other]), what="the jobs in the view")
    page = (await c.get("/jobs?group=sw")).text
    assert "3 jobs in group sw" in page and "train" not in page.split("<tbody>")[1]
    assert '<input type="hidden" name="group" value="sw">' in page  # the cancel form keeps the filter
    assert "No jobs in group nope" in (await c.get("/jobs?group=nope")).text
    page = (await c.get("/jobs?name=sweep-&user=nobody")).text
    assert "No jobs named sweep-… of nobody" in page
    assert "Signed in as <strong>operator</strong>" in page  # the filter is not the signed-in user
    page = (await c.get("/jobs?name=sweep-&user=operator")).text
    assert "3 jobs named sweep-… of operator" in page and "train" not in page.split("<tbody>")[1]
    assert 'action="/jobs/cancel"' in page
    assert 'action="/jobs/cancel"' not in (await c.get("/jobs")).text  # no filter: no cancel-all form
    r = await c.post("/jobs/cancel", data={"csrf": console.csrf, "name": "sweep-", "user": "operator", "state": "",
                                           "queue": "", "reason": ""})
    assert r.status_code == 422 and 'id="cancel-many-error"' in r.text and "a reason is required" in r.text
    assert "3 jobs named sweep-… of operator" in r.text  # the list again, with its filters
    r = await c.post("/jobs/cancel", data={"csrf": console.csrf, "name": "", "user": "", "state": "", "queue": "",
                                           "reason": "all of them"})
    assert r.status_code == 422 and 'id="cancel-many-error"' in r.text and "give at least one filter" in r.text
    r = await c.post("/jobs/cancel", data={"csrf": console.csrf, "name": "sweep-", "state": "BOGUS", "reason": "x"})
    assert r.status_code == 422 and "no state &#39;BOGUS&#39;" in r.text, r.text  # it cancelled none, saying done
    # A misspelt queue is refused (found by exploring: the queue was dropped, and the jobs
    # of that name in every queue were cancelled; then it was told "0 cancelled").
    r = await c.post("/jobs/cancel", data={"csrf": console.csrf, "name": "sweep-", "queue": "defualt", "reason": "x"})
    assert r.status_code == 404 and 'id="cancel-many-error"' in r.text and "no queue &#39;defualt&#39;" in r.text
    assert "There is no queue defualt" in r.text and "sweep-0" not in r.text
    assert all(m.state.jobs[j.id].state is JobState.QUEUED for j in sweep)
    # Held and released by the same filters (scontrol hold and release of many jobs).
    assert 'action="/jobs/hold"' in page and 'action="/jobs/hold"' not in (await c.get("/jobs")).text
    r = await c.post("/jobs/hold", data={"csrf": console.csrf, "group": "sw", "reason": "quota review"})
    assert r.status_code == 303 and "notice=hold-many" in r.headers["location"] and "n=3" in r.headers["location"]
    assert "Hold requested for 3 queued job(s)" in (await c.get(r.headers["location"])).text
    await eventually(lambda: all(m.state.jobs[j.id].hold == "held by operator: quota review" for j in sweep),
                     timeout=20, what="the sweep held")
    r = await c.post("/jobs/release", data={"csrf": console.csrf, "group": "sw", "queue": "defualt"})
    assert r.status_code == 404 and 'id="hold-many-error"' in r.text and "no queue &#39;defualt&#39;" in r.text
    r = await c.post("/jobs/release", data={"csrf": console.csrf, "group": "sw"})
    assert r.status_code == 303 and "notice=release-many" in r.headers["location"] and "n=3" in r.headers["location"]
    await eventually(lambda: not any(m.state.jobs[j.id].hold for j in sweep), timeout=20, what="the sweep released")
    r = await c.post("/jobs/cancel", data={"csrf": console.csrf, "name": "", "user": "", "state": "",
                                           "queue": "", "group": "sw", "reason": "sweep over"})
    assert r.status_code == 303 and "notice=cancel-many" in r.headers["location"] and "n=3" in r.headers["location"]
    assert "Cancel requested for 3 job(s)" in (await c.get(r.headers["location"])).text
    await eventually(lambda: all(m.state.jobs[j.id].state is JobState.CANCELLED for j in sweep), timeout=20,
                     what="the sweep cancelled")
    assert m.state.jobs[other.id].state is JobState.QUEUED


async def test_a_job_page_shows_what_it_runs_after_and_waits_for(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    first = await submitted(m, {"name": "prep", "command": ["true"], "gpus": 64})
    then = await submitted(m, {"name": "train", "command": ["true"], "depends_on": [first.id]})
    page = (await c.get(f"/jobs/{then.id}")).text
    link = f'<a href="/jobs/{first.id}"><code>{first.id}</code></a>'
    assert f'id="job-after">{link} <span class="muted">(once they succeeded)' in page
    assert f'id="job-waiting">{link}</dd>' in page and "Waiting for the jobs it runs after" in page
    # From the submit form: a begin time and a group (an unreadable time refused on its field).
    base_form = {"csrf": console.csrf, "name": "later", "command": "true", "cpus": "1", "memory_mb": "512"}
    r = await c.post("/submit", data={**base_form, "begin": "tomorrow"})
    assert r.status_code == 422 and 'id="f-begin-error"' in r.text and "a date and time" in r.text
    r = await c.post("/submit", data={**base_form, "retry_exit_codes": "75, x"})
    assert r.status_code == 422 and 'id="f-retry_exit_codes-error"' in r.text
    for bad in ("x", "7200", "nan"):
        r = await c.post("/submit", data={**base_form, "retry_failures": "1", "retry_delay": bad})
        assert r.status_code == 422 and 'id="f-retry_delay-error"' in r.text, bad
    r = await c.post("/submit", data={**base_form, "begin": "2126-01-01T06:00", "group": "etl", "group_limit": "1",
                                      "retry_failures": "2", "retry_exit_codes": "75, 143", "retry_delay": "45",
                                      "checkpoints": "1"})
    assert r.status_code == 303
    later = m.state.jobs[r.headers["location"].split("/jobs/")[1].split("?")[0]]
    assert later.not_before == later.spec.begin_at == dt.datetime(2126, 1, 1, 6, tzinfo=dt.UTC).timestamp()
    assert (later.spec.group, later.spec.group_limit) == ("etl", 1)
    assert (later.spec.retry_failures, later.spec.retry_exit_codes, later.spec.retry_delay_s) == (2, [75, 143], 45)
    assert later.spec.checkpoints
    page = (await c.get(f"/jobs/{later.id}")).text
    assert 'id="job-checkpoints">saves its state when stopped and resumes from it</dd>' in page
    assert 'id="job-begin">2126-01-01T06:00:00Z' in page and "waiting for its start time" in page
    assert ('id="job-retries">up to 2 failed tries exiting 75, 143, 45 s before the first, doubling (at most an '
            'hour)</dd>') in page
    grouped = await submitted(m, {"name": "sweep-0", "command": ["true"], "group": "sweep#1", "group_limit": 2})
    page = (await c.get(f"/jobs/{grouped.id}")).text
    assert ('id="job-group"><code>sweep#1</code> <span class="muted">(at most 2 of operator\'s jobs in it placed '
            "or running at once)") in page
    assert "after 1</span>" in (await c.get("/jobs")).text
    # From the submit form: run after, submitted held; an unknown job refused on its field.
    base = {"csrf": console.csrf, "name": "evaluate", "command": "true", "cpus": "1", "memory_mb": "512"}
    r = await c.post("/submit", data={**base, "after": "jnosuchjob1"})
    assert r.status_code == 422 and 'id="f-after-error"' in r.text and "no job jnosuchjob1" in r.text
    r = await c.post("/submit", data={**base, "after": f"{first.id}, {then.id}", "held": "1"})
    assert r.status_code == 303, r.text
    made = m.state.jobs[r.headers["location"].split("/")[2].split("?")[0]]
    assert made.spec.depends_on == [first.id, then.id] and made.waiting_for == [first.id, then.id]
    assert made.hold == "held by operator at submission"
    assert not made.spec.depend_any and not made.spec.depend_not_ok  # the rule's default: afterok
    # The rule chosen: afternotok, shown on the job's page.
    assert 'name="after_rule"' in (await c.get("/submit")).text
    r = await c.post("/submit", data={**base, "name": "on-failure", "after": first.id, "after_rule": "notok"})
    assert r.status_code == 303, r.text
    made = m.state.jobs[r.headers["location"].split("/")[2].split("?")[0]]
    assert made.spec.depend_not_ok and not made.spec.depend_any
    page = (await c.get(f"/jobs/{made.id}")).text
    assert "(once they ended otherwise than succeeded)" in page


async def test_a_job_that_waits_for_no_host_is_not_said_to_wait_for_the_next_cycle(console: Console) -> None:
    """Found by exploring: a held job (or one its queue's limit keeps back) on a cluster with
    room was said to be waiting only for the next scheduling cycle ("A host can take it
    now"), while `job why` and GraphQL gave its real reason."""
    m = console.muster
    await console.login()
    await put_heartbeat(m, "room-1")
    await eventually(lambda: "room-1" in m.state.hosts, timeout=20, what="the host in the view")
    job = await submitted(m, {"name": "kept", "command": ["true"], "gpus": 1, "held": True})
    page = (await console.client.get(f"/jobs/{job.id}")).text
    assert "Held: out of queue default" in page
    assert "A host can take it now" not in page


async def test_hold_release_and_priority_forms(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    job = await submitted(m, {"name": "waits", "command": ["true"], "gpus": 64})
    page = (await c.get(f"/jobs/{job.id}")).text
    assert f'action="/jobs/{job.id}/hold"' in page and f'action="/jobs/{job.id}/release"' not in page
    r = await c.post(f"/jobs/{job.id}/hold", data={"csrf": console.csrf, "reason": "dataset not ready"})
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{job.id}?notice=held"
    await eventually(lambda: m.state.jobs[job.id].hold == "held by operator: dataset not ready", timeout=20,
                     what="the hold applied")
    page = (await c.get(f"/jobs/{job.id}")).text
    assert 'id="job-hold">held by operator: dataset not ready<' in page and "Held: out of queue default" in page
    assert f'action="/jobs/{job.id}/release"' in page and f'action="/jobs/{job.id}/hold"' not in page
    r = await c.post(f"/jobs/{job.id}/priority", data={"csrf": console.csrf, "priority": "99999"})
    assert r.status_code == 422 and 'id="change-error"' in r.text and "from -1000 to 1000" in r.text
    r = await c.post(f"/jobs/{job.id}/priority", data={"csrf": console.csrf, "priority": "-5"})
    assert r.status_code == 303
    r = await c.post(f"/jobs/{job.id}/release", data={"csrf": console.csrf})
    assert r.status_code == 303
    await eventually(lambda: (m.state.jobs[job.id].hold, m.state.jobs[job.id].spec.priority) == ("", -5),
                     timeout=20, what="the release and the priority applied")
    # Its time limit: an admin's session may set any (the console's first token is one).
    page = (await c.get(f"/jobs/{job.id}")).text
    assert f'action="/jobs/{job.id}/time-limit"' in page and "As an admin you may raise it" in page
    r = await c.post(f"/jobs/{job.id}/time-limit", data={"csrf": console.csrf, "time_limit": "soon"})
    assert r.status_code == 422 and 'id="change-error"' not in r.text and 'id="limit-error"' in r.text, r.text
    assert "must be a number of seconds" in r.text and 'value="soon"' in r.text
    r = await c.post(f"/jobs/{job.id}/time-limit", data={"csrf": console.csrf, "time_limit": "5400"})
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{job.id}?notice=time-limit"
    await eventually(lambda: m.state.jobs[job.id].spec.time_limit_s == 5400, timeout=20, what="the time limit applied")
    assert "<dt>Time limit</dt><dd>5400 s" in (await c.get(f"/jobs/{job.id}")).text
    # Thirty days, in days; the form's field in seconds (found by exploring: 2.592e+06 s).
    r = await c.post(f"/jobs/{job.id}/time-limit", data={"csrf": console.csrf, "time_limit": "2592000"})
    assert r.status_code == 303
    await eventually(lambda: m.state.jobs[job.id].spec.time_limit_s == 2592000, timeout=20, what="30 days applied")
    page = (await c.get(f"/jobs/{job.id}")).text
    assert "<dt>Time limit</dt><dd>30d <span" in page and 'value="2592000"' in page, page
    # The forms say what they were made for, as the live part does: live.js fetches them
    # again (the whole page, for `#actions`) when the two differ.
    page = (await c.get(f"/jobs/{job.id}")).text
    version = re.search(r'id="live"[^>]* data-version="([^"]+)"', page)
    assert version is not None and f'<div id="actions" data-for="{version.group(1)}">' in page
    live = (await c.get(f"/jobs/{job.id}", headers={"HX-Request": "true"})).text
    assert 'id="actions"' not in live and f'data-version="{version.group(1)}"' in live
    forms = (await c.get(f"/jobs/{job.id}", headers={"HX-Request": "true", "HX-Target": "actions"})).text
    assert f'<div id="actions" data-for="{version.group(1)}">' in forms
    # A job that ended offers no form, and a change refused then is said all the same
    # (found by exploring: a priority set on a job that had just ended showed nothing).
    await m.cancel(job.id, by="operator", reason="done with it")
    await eventually(lambda: m.state.jobs[job.id].state is JobState.CANCELLED, timeout=20, what="the cancel")
    r = await c.post(f"/jobs/{job.id}/priority", data={"csrf": console.csrf, "priority": "3"})
    assert r.status_code == 409 and 'class="field-error"' in r.text and "CANCELLED" in r.text, r.text
    assert f'action="/jobs/{job.id}/priority"' not in r.text


async def test_a_queued_job_whose_last_try_was_preempted_offers_a_time_limit(console: Console) -> None:
    """A job queued again after a preemption: its last try's stop is over, and its time
    limit may be set (found by exploring: the form was missing, as for a try still being
    stopped, while `muster job set --time-limit` worked)."""
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from wire.messages import Attempt, AttemptState

    c = console.client
    m = console.muster
    await console.login()
    tried = Attempt(id="jpreempted1.1", number=1, host_id="h1", gpu_indices=[0], state=AttemptState.PREEMPTED,
                    placed_at=10.0, started_at=11.0, finished_at=20.0, stop_kind="preempt", stop_at=15.0)
    rec = make_job("jpreempted1", spec=job_spec("again", gpus=1), state=JobState.QUEUED, attempts=[tried],
                   submitted_at=5.0, updated_at=20.0)
    assert m.store is not None
    await m.store.put(subjects.job_key(rec.id), encode(rec))
    await eventually(lambda: rec.id in m.state.jobs, what="the job in the view")
    page = (await c.get(f"/jobs/{rec.id}")).text
    assert f'action="/jobs/{rec.id}/time-limit"' in page and f'action="/jobs/{rec.id}/hold"' in page


async def test_requeue_form(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    await put_heartbeat(m, "h1")
    await eventually(lambda: "h1" in m.state.hosts, what="the host")
    job = await submitted(m, {"name": "placed", "command": ["true"], "gpus": 1})
    await eventually(lambda: m.state.jobs[job.id].state is JobState.PLACED, timeout=20, what="the job placed")
    page = (await c.get(f"/jobs/{job.id}")).text
    assert f'action="/jobs/{job.id}/requeue"' in page and f'action="/jobs/{job.id}/hold"' not in page
    r = await c.post(f"/jobs/{job.id}/requeue", data={"csrf": console.csrf, "reason": "bad node", "hold": "1"})
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{job.id}?notice=requeued"
    await eventually(lambda: m.state.jobs[job.id].attempts[0].stop_kind == "requeue", timeout=20,
                     what="the try stopping for the requeue")
    assert m.state.jobs[job.id].hold == "held by operator: bad node"


async def test_a_teams_token_acts_on_its_queues_jobs_only(console: Console) -> None:
    """A token bound to queues (a team's) sees the environment of, and may cancel, its
    queues' jobs only, and may not cordon, drain or clear GPU faults."""
    m = console.muster
    await m.create_queue({"name": "audio"}, "operator")
    await m.create_queue({"name": "vision"}, "operator")
    await put_heartbeat(m, "h1")
    await eventually(lambda: {"audio", "vision"} <= set(m.state.queues) and "h1" in m.state.hosts,
                     what="the queues and the host in the view")
    env = {"WANDB_API_KEY": "k-123"}
    mine = await m.submit({"name": "mine", "command": ["true"], "gpus": 64, "queue": "audio", "env": env}, "vic")
    theirs = await m.submit({"name": "theirs", "command": ["true"], "gpus": 64, "queue": "vision", "env": env},
                            "operator")
    await eventually(lambda: {mine.id, theirs.id} <= set(m.state.jobs), what="the jobs in the view")
    assert m.store is not None
    bound, _ = await create_token(m.store, "vic", "operator", ["audio"])
    await eventually(lambda: len(m.state.tokens) == 2, what="the bound token in the view")
    c = console.client
    assert (await c.post("/login", data={"token": bound})).status_code == 303
    page = (await c.get(f"/jobs/{mine.id}")).text
    assert "WANDB_API_KEY=k-123" in page and f'action="/jobs/{mine.id}/cancel"' in page
    page = (await c.get(f"/jobs/{theirs.id}")).text
    assert "theirs" in page and "k-123" not in page and f'action="/jobs/{theirs.id}/cancel"' not in page
    r = await c.post(f"/jobs/{theirs.id}/cancel", data={"csrf": console.csrf, "reason": "mine now"})
    assert r.status_code == 403 and "in queue &#39;vision&#39;" in r.text
    # Its other forms' refusals are said too (found by exploring: nothing was shown).
    for action, field in (("priority", {"priority": "5"}), ("hold", {}), ("time-limit", {"time_limit": "60"})):
        r = await c.post(f"/jobs/{theirs.id}/{action}", data={"csrf": console.csrf, **field})
        assert r.status_code == 403 and 'class="field-error"' in r.text and "vision" in r.text, (action, r.text)
    # The bulk cancel is offered for its own queue's list, not for another's.
    assert 'action="/jobs/cancel"' in (await c.get("/jobs?queue=audio")).text
    assert 'action="/jobs/cancel"' not in (await c.get("/jobs?queue=vision")).text
    host = (await c.get("/hosts/h1")).text
    assert "Cordon host" not in host and "Drain host" not in host and "bound to queues (audio)" in host
    r = await c.post("/hosts/h1/cordon", data={"csrf": console.csrf, "reason": "mine"})
    assert r.status_code == 403 and "acting on hosts needs a token bound to no queue" in r.text
    assert "h1" not in m.state.hostcfg
    r = await c.post(f"/jobs/{mine.id}/cancel", data={"csrf": console.csrf, "reason": "not needed"})
    assert r.status_code == 303
    await eventually(lambda: m.state.jobs[mine.id].state is JobState.CANCELLED, timeout=20, what="mine cancelled")
    assert m.state.jobs[theirs.id].state is JobState.QUEUED


# ---------------------------------------------------------------- overview heat map, hosts filters


async def put_hb(m: Muster, host_id: str, *, rack: str = "r1", zone: str = "z1", util: float = 40.0,
                 gpus: int = 2, model: str = "H100", temp: float = 50.0, power: float = 300.0,
                 ts: float | None = None) -> None:
    hb = heartbeat(host_id, seq=0, ts=time.time() if ts is None else ts, labels={"rack": rack, "zone": zone},
                   gpus=gpus, model=model, gpu_memory_mb=81920, util=util, temp_c=[temp + i for i in range(gpus)],
                   power_w=[power + i for i in range(gpus)], cpus=32, memory_mb=256 * 1024, cpu_pct=50.0,
                   mem_used_mb=64 * 1024, simulated=True)
    assert m.store is not None
    await m.store.put(host_id, encode(hb), bucket=subjects.HOSTS_BUCKET)


async def get_when_summary_shows(
    c: httpx.AsyncClient, url: str, headers: dict[str, str], text: str
) -> httpx.Response:
    """GET `url` until its page holds `text`. The fleet summary a page shows may be up to
    `LEADER_SUMMARY_MAX_AGE_S` old (it is cached), so a page read just after new
    heartbeats may still show the previous one."""
    from server.api.reads import LEADER_SUMMARY_MAX_AGE_S

    async def showing() -> httpx.Response | None:
        r = await c.get(url, headers=headers)
        return r if text in r.text else None

    return await eventually(showing, timeout=4 * LEADER_SUMMARY_MAX_AGE_S, what=f"{url} to show {text!r}",
                            interval=0.2)


def live_fragment(text: str) -> str:
    return text[text.index('<div id="live"'):]


async def test_overview_utilization_and_heat_map(console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    import web.console.hosts as wc

    c = console.client
    m = console.muster
    await console.login()
    r = await c.get("/")
    assert "No hosts have reported yet, so there is nothing to map." in r.text
    await asyncio.gather(
        put_hb(m, "a-1", rack="ra", util=5.0), put_hb(m, "a-2", rack="ra", util=45.0),
        put_hb(m, "b-1", rack="rb", util=100.0), put_hb(m, "c-1", rack="rc", gpus=0),
    )
    await eventually(lambda: len(m.state.hosts) == 4, what="heartbeats")
    r = await get_when_summary_shows(c, "/", {}, "0 of 6 GPUs")
    assert r.status_code == 200
    assert_security_headers(r)
    assert "style=" not in r.text
    html = r.text
    # Utilization: GPUs allocated as a bar, CPU and RAM.
    assert 'id="util-gpu"' in html and 'id="util-cpu"' in html and 'id="util-mem"' in html
    assert "0 of 6 GPUs" in html
    assert "64 of 128 cores" in html  # 4 hosts x 32 cores at 50 % (the GPU-less one too)
    assert "50.0 %" in html  # CPU and RAM both half used
    # Few hosts: one cell per host, grouped by rack, coloured in 10 % steps.
    assert "One cell per host" in html
    assert re.search(r'class="cell heat-0" href="/hosts/a-1"', html)
    assert re.search(r'class="cell heat-4" href="/hosts/a-2"', html)
    assert re.search(r'class="cell heat-10" href="/hosts/b-1"', html)
    assert re.search(r'class="cell heat-none" href="/hosts/c-1"', html)
    assert 'title="a-2: 45.0 % GPU util, 0/2 GPUs allocated, HEALTHY"' in html
    assert 'href="/hosts?rack=ra"' in html
    assert '<dd id="ov-gpus-free">6</dd>' in html and 'id="ov-gpus-unavailable"' not in html
    # A cordoned host's GPUs are not free (the overview said total minus allocated), and its
    # cell is marked.
    await m.set_cordon("a-1", True, "operator", "maintenance")
    r = await get_when_summary_shows(c, "/", {}, '<dd id="ov-gpus-free">4</dd>')
    assert "2 more GPUs neither allocated nor free" in r.text
    assert re.search(r'class="cell heat-0 cell-cordoned" href="/hosts/a-1"', r.text)
    assert 'title="a-1: 5.0 % GPU util, 0/2 GPUs allocated, HEALTHY, cordoned"' in r.text
    await m.set_cordon("a-1", False, "operator", "")
    await get_when_summary_shows(c, "/", {}, '<dd id="ov-gpus-free">6</dd>')

    # Many hosts: one cell per rack, capped, and the page says so.
    monkeypatch.setattr(wc, "HEAT_PER_HOST_MAX", 2)
    monkeypatch.setattr(wc, "HEAT_MAX_CELLS", 2)
    await put_hb(m, "a-3", rack="ra", util=60.0)  # a new host: the snapshot is rebuilt
    await eventually(lambda: len(m.state.hosts) == 5, what="heartbeat")
    # (Not just "over 3 hosts": the page's overall line says "over 3 hosts with GPUs" before a-3 too.)
    r = await get_when_summary_shows(c, "/", {"HX-Request": "true"}, "mean GPU util over 3 hosts")
    html = r.text
    assert "One cell per rack (3 racks)" in html
    assert "Showing the first 2 of 3 racks" in html
    assert html.count('class="cell ') == 2
    # rack ra: mean of 5, 45, 60 = 36.7 %
    assert re.search(
        r'class="cell heat-3" href="/hosts\?rack=ra"[^>]*title="ra: 36.7 % mean GPU util over 3 hosts', html
    )
    assert re.search(r'class="cell heat-10" href="/hosts\?rack=rb"', html)
    await m.set_cordon("b-1", True, "operator", "maintenance")  # rack rb's only host
    r = await get_when_summary_shows(c, "/", {}, "1 cordoned")
    assert re.search(r'class="cell heat-10 cell-cordoned" href="/hosts\?rack=rb"', r.text)
    assert re.search(r'class="cell heat-3" href="/hosts\?rack=ra"', r.text)
    assert "rc" not in re.findall(r'href="/hosts\?rack=(\w+)"', html)
    # A lost host: its GPUs, the work still allocated there and its last utilization count
    # for nothing in the totals and its rack's cell (found by exploring: "8 of 4 GPUs"); the
    # work it holds is said apart.
    from tests.factories import host_alloc, task
    from wire.records import Record

    m.state.apply_alloc(host_alloc("a-2", [task("l", command=["x"], gpu_indices=[0, 1])]), 10**9)
    m.state.apply_host_record(Record("a-2", 10**9, None), now=time.time())
    r = await get_when_summary_shows(c, "/", {}, 'id="ov-gpus-lost"')
    assert "2 GPUs still allocated on lost hosts" in r.text and "0 of 6 GPUs" in r.text
    assert re.search(r'href="/hosts\?rack=ra"[^>]*title="ra: 32.5 % mean GPU util over 2 hosts', r.text)


async def test_hosts_filters_and_sorting(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    await asyncio.gather(
        put_hb(m, "h-1", rack="r1", zone="z1", util=10.0),
        put_hb(m, "h-2", rack="r1", zone="z2", util=90.0, model="A100"),
        put_hb(m, "h-3", rack="r2", zone="z1", util=50.0),
        put_hb(m, "h-4", rack="r2", zone="z2", util=70.0, gpus=4),
    )
    await eventually(lambda: len(m.state.hosts) == 4, what="heartbeats")
    await m.set_cordon("h-3", True, "operator", "flaky NIC")

    def ids(text: str) -> list[str]:
        return re.findall(r'<th scope="row"><a href="/hosts/([^"]+)"', text)

    r = await c.get("/hosts")
    assert ids(r.text) == ["h-1", "h-2", "h-3", "h-4"]
    for col in ("id", "health", "util", "alloc"):
        assert f'id="sort-{col}"' in r.text
    # Dropdowns offer what the fleet has.
    assert '<option value="r2">' in r.text and '<option value="z2">' in r.text and '<option value="A100">' in r.text

    assert ids((await c.get("/hosts?rack=r1")).text) == ["h-1", "h-2"]
    assert ids((await c.get("/hosts?zone=z2")).text) == ["h-2", "h-4"]
    assert ids((await c.get("/hosts?model=A100")).text) == ["h-2"]
    assert ids((await c.get("/hosts?cordoned=yes")).text) == ["h-3"]
    assert ids((await c.get("/hosts?cordoned=no")).text) == ["h-1", "h-2", "h-4"]
    assert ids((await c.get("/hosts?health=HEALTHY&rack=r2")).text) == ["h-3", "h-4"]
    r = await c.get("/hosts?health=LOST")
    assert ids(r.text) == [] and "No host matches these filters" in r.text
    r = await c.get("/hosts?rack=r2&zone=z2&q=h-")
    assert ids(r.text) == ["h-4"] and "1 host matching “h-”" in r.text

    r = await c.get("/hosts?sort=util")
    assert ids(r.text) == ["h-1", "h-3", "h-4", "h-2"]
    assert 'aria-sort="ascending"' in r.text
    assert 'href="/hosts?sort=-util" id="sort-util"' in r.text  # a second click reverses
    r = await c.get("/hosts?sort=-util")
    assert ids(r.text) == ["h-2", "h-4", "h-3", "h-1"] and 'aria-sort="descending"' in r.text
    assert ids((await c.get("/hosts?sort=-id")).text) == ["h-4", "h-3", "h-2", "h-1"]
    assert ids((await c.get("/hosts?sort=health")).text) == ["h-1", "h-2", "h-3", "h-4"]
    assert ids((await c.get("/hosts?sort=-alloc&rack=r2")).text) == ["h-4", "h-3"]  # 0/4 before 0/2

    # The form sends every field; the server redirects to the canonical URL, and the
    # live fragment polls that URL with the filters kept.
    r = await c.get("/hosts?q=h-&health=&rack=r2&zone=&model=&cordoned=&sort=util")
    assert r.status_code == 303 and r.headers["location"] == "/hosts?q=h-&rack=r2&sort=util"
    r = await c.get("/hosts?health=healthy&sort=bogus&cordoned=maybe")
    assert r.status_code == 303 and r.headers["location"] == "/hosts?health=HEALTHY"
    r = await c.get("/hosts?rack=r2&sort=util", headers={"HX-Request": "true"})
    assert 'hx-get="/hosts?rack=r2&amp;sort=util"' in r.text
    assert ids(r.text) == ["h-3", "h-4"]
    # Paging keeps the filters.
    r = await c.get("/hosts?q=nothing")
    assert "No host id contains “nothing”" in r.text
    # A lost host's last telemetry is stale: its utilization is not shown.
    m.state.apply_heartbeat("h-2", 10**9, None, None, time.time())  # its key's expiry marker
    await eventually(lambda: m.state.health("h-2", time.time()).value == "LOST", what="h-2 lost")
    r = await c.get("/hosts?health=LOST")
    row = r.text[r.text.index('href="/hosts/h-2"'):]
    row = row[:row.index("</tr>")]
    assert ids(r.text) == ["h-2"] and "90.0" not in row, row
    # Nor its CPU and RAM use (found by exploring: its last heartbeat's were shown as now's).
    assert "50.0 %" not in row and "64.0 GiB /" not in row and "— / 256.0 GiB" in row, row
    # Nor on its page, per GPU (found by exploring: util, temperature and power were shown).
    r = await c.get("/hosts/h-2")
    gpus = r.text[r.text.index("<caption class=\"visually-hidden\">GPUs of h-2"):]
    body = gpus[gpus.index("<tbody>"):]
    first = body[:body.index("</tr>")]
    assert "<td" in first and "°C" not in first and " W</td>" not in first and "90" not in first, first
    assert '<dd id="host-cpu">— of 32 cores</dd>' in r.text and '<dd id="host-ram">— of 256.0 GiB</dd>' in r.text


async def test_hosts_filters_page_through_many(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    ids = [f"n-{i:03d}" for i in range(120)]
    await asyncio.gather(*(put_hb(m, h, rack=f"r{i % 2}", util=float(i % 100)) for i, h in enumerate(ids)))
    await eventually(lambda: len(m.state.hosts) == len(ids), what="heartbeats")
    r = await c.get("/hosts?rack=r1&sort=-util")
    assert "60 hosts (rack r1)." in r.text and "Page 1 of 2" in r.text
    assert 'href="/hosts?rack=r1&amp;sort=-util&amp;page=2"' in r.text
    r = await c.get("/hosts?rack=r1&sort=-util&page=2")
    assert "Page 2 of 2" in r.text and r.text.count('<tr class="row-sim">') == 10


# ---------------------------------------------------------------- host page: charts, drain


async def test_host_page_lists_the_attempts_recorded_there_newest_first(console: Console) -> None:
    """What ran on a host and how it ended (from history: SQL), on its page; the live part
    the page polls reads no database."""
    from tests.factories import job, job_spec
    from wire.messages import Attempt, AttemptState

    m = console.muster
    await console.login()
    assert m.history is not None
    await put_heartbeat(m, "gpu-9")
    await eventually(lambda: "gpu-9" in m.state.hosts, what="the host")
    page = (await console.client.get("/hosts/gpu-9")).text
    assert "No attempt on this host is recorded yet." in page
    now = time.time()
    for i, (ended, code) in enumerate([(AttemptState.SUCCEEDED, 0), (AttemptState.FAILED, 139)]):
        a = Attempt(id=f"jr{i}.1", number=1, host_id="gpu-9", state=ended, exit_code=code, placed_at=now - 600 + i,
                    started_at=now - 600 + i, finished_at=now - 60 + i)
        spec = job_spec(f"r{i}", queue="vision", user="ann")
        m.history.record(job(f"jr{i}", spec=spec, state=JobState(ended.value), attempts=[a], submitted_at=now - 900), 1)
    other = Attempt(id="jx.1", number=1, host_id="gpu-8", state=AttemptState.SUCCEEDED, placed_at=now)
    m.history.record(job("jx", spec=job_spec("x"), state=JobState.SUCCEEDED, attempts=[other]), 1)
    m.history.flush()
    page = (await console.client.get("/hosts/gpu-9")).text
    table = page[page.index('<table id="recent-attempts">'):]
    table = table[:table.index("</table>")]
    rows = re.findall(r'<a href="/jobs/(\w+)">.*?<td>(\w+)</td>\s*<td class="num">([^<]+)</td>', table, re.S)
    assert rows == [("jr1", "FAILED", "139"), ("jr0", "SUCCEEDED", "0")], table
    assert "The latest 2 of 2 recorded" in page and "jx" not in table
    live = (await console.client.get("/hosts/gpu-9", headers={"HX-Request": "true"})).text
    assert "recent-attempts" not in live


async def test_host_page_charts_after_heartbeats(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    t0 = time.time()
    await put_hb(m, "gpu-1", util=10.0, ts=t0)
    await eventually(lambda: "gpu-1" in m.state.hosts, what="heartbeat")
    r = await c.get("/hosts/gpu-1")
    assert r.status_code == 200
    assert "Collecting: the charts fill in" in r.text and "<polyline" not in r.text
    for i, util in enumerate((50.0, 90.0, 30.0), start=1):
        await put_hb(m, "gpu-1", util=util, temp=60.0 + i, power=350.0 + 10 * i, ts=t0 + i)
        await eventually(lambda u=util: m.state.hosts["gpu-1"].latest().gpu_usage[0].util_pct == u,  # type: ignore[union-attr]
                         what="heartbeat")
        await c.get("/hosts/gpu-1", headers={"HX-Request": "true"})
    r = await c.get("/hosts/gpu-1")
    assert_security_headers(r)
    html = r.text
    assert "style=" not in html
    assert 'id="tele-gpu-0"' in html and 'id="tele-gpu-1"' in html
    assert html.count("<svg") == 6  # 2 GPUs x (util, temp, power)
    util_line = re.search(
        r'<svg class="spark spark-util"[^>]*aria-label="GPU 0 Utilization: now 30 %, min 10 %, max 90 %"'
        r'.*?<polyline points="([^"]+)"',
        html,
        re.S,
    )
    assert util_line, html[html.index('id="tele-gpu-0"'):][:1500]
    points = [tuple(map(float, p.split(","))) for p in util_line.group(1).split()]
    assert len(points) == 4
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    assert xs == sorted(xs) and xs[0] == 0 and xs[-1] == 120
    assert ys[2] < ys[1] < ys[0]  # 90 % is drawn highest (smallest y)
    assert "GPU 1 Temperature: now 64 °C" in html and "GPU 1 Power: now 381 W" in html
    # Bounded: a host's samples are kept in a ring buffer.
    import web.console.charts as wc

    tel = console.app.state.console_telemetry  # type: ignore[attr-defined]
    assert tel.buffers["gpu-1"].maxlen == wc.TELEMETRY_MAX_SAMPLES


async def test_host_page_shows_a_dash_for_a_gpu_figure_not_read(console: Console) -> None:
    """NVML gives no utilisation for a GPU in MIG mode (GpuUsage.unread): the GPU's row
    shows "—" for it, not "0.0 %", the host's mean is over the GPU read, and its chart has
    no point for it; a GPU read at all shows "—" for each figure."""
    c = console.client
    m = console.muster
    await console.login()
    hb = heartbeat("mig-1", seq=0, ts=time.time(), labels={"rack": "r1"}, gpus=3, gpu_memory_mb=81920,
                   util=[0.0, 80.0, 0.0], temp_c=55.0, power_w=300.0, simulated=True,
                   unread={0: ["util"], 2: ["util", "memory", "temperature", "power"]})
    assert m.store is not None
    await m.store.put("mig-1", encode(hb), bucket=subjects.HOSTS_BUCKET)
    await eventually(lambda: "mig-1" in m.state.hosts, what="heartbeat")
    html = (await c.get("/hosts/mig-1")).text
    body = html[html.index("<caption class=\"visually-hidden\">GPUs of mig-1"):]
    rows = body[body.index("<tbody>"):body.index("</tbody>")].split("</tr>")
    cells = [re.findall(r'<td class="num">([^<]*)</td>', r) for r in rows[:3]]
    assert cells[0] == ["0 MiB / 80.0 GiB", "—", "55 °C", "300 W"], cells
    assert cells[1] == ["0 MiB / 80.0 GiB", "80.0 %", "55 °C", "300 W"], cells
    assert cells[2] == ["— / 80.0 GiB", "—", "—", "—"], cells
    assert "<dt>GPU util</dt><dd>80.0 %</dd>" in html
    later = hb.model_copy(update={"seq": 1, "ts": hb.ts + 1})
    await m.store.put("mig-1", encode(later), bucket=subjects.HOSTS_BUCKET)
    await eventually(lambda: m.state.hosts["mig-1"].latest().ts == later.ts,  # type: ignore[union-attr]
                     what="the second heartbeat")
    html = (await c.get("/hosts/mig-1")).text
    assert "GPU 0 Utilization: now —, min —, max —" in html and "GPU 0 Temperature: now 55 °C" in html
    assert "GPU 1 Utilization: now 80 %" in html and "GPU 2 Power: now —" in html
    # A host none of whose GPUs' utilisation was read: no mean (not 0 %) on the heat map.
    dark = heartbeat("dark-1", seq=0, ts=time.time(), labels={"rack": "r1"}, gpus=1, simulated=True,
                     unread={0: ["util"]})
    await m.store.put("dark-1", encode(dark), bucket=subjects.HOSTS_BUCKET)
    await eventually(lambda: "dark-1" in m.state.hosts, what="its heartbeat")
    r = await get_when_summary_shows(c, "/", {"HX-Request": "true"}, 'id="heat-dark-1"')
    assert re.search(r'class="cell heat-none" href="/hosts/dark-1"[^>]*title="dark-1: not read GPU util', r.text)
    assert "(not read on 1 more host with GPUs)" in r.text
    html = (await c.get("/hosts/dark-1")).text
    assert "<dt>GPU util</dt><dd>—</dd>" in html


async def signed_in_with_host(console: Console, host_id: str) -> tuple[httpx.AsyncClient, Muster]:
    """The console's client, signed in, and its replica, which has read `host_id`'s heartbeat."""
    await console.login()
    await put_hb(console.muster, host_id)
    await eventually(lambda: host_id in console.muster.state.hosts, what="heartbeat")
    return console.client, console.muster


async def test_drain_needs_a_reason_and_confirmation(console: Console) -> None:
    c, m = await signed_in_with_host(console, "d-1")
    r = await c.get("/hosts/d-1")
    assert 'action="/hosts/d-1/drain"' in r.text and 'name="deadline_s"' in r.text
    # The deadline the API and the CLI default to (a review: the console's was 600 s).
    from server.timefmt import DRAIN_DEADLINE_S

    assert re.search(rf'id="drain-deadline"[^>]*value="{DRAIN_DEADLINE_S:g}"', r.text) and DRAIN_DEADLINE_S == 300
    # Destructive forms ask for confirmation (static/live.js) and need a reason.
    assert re.search(r'<form method="post" action="/hosts/d-1/drain" class="stack" data-confirm="Drain d-1\?', r.text)
    assert re.search(r'<form method="post" action="/hosts/d-1/cordon" class="stack" data-confirm="', r.text)
    assert re.search(r'<input id="drain-reason" name="reason" required', r.text)

    r = await c.post("/hosts/d-1/drain", data={"csrf": console.csrf, "reason": "  ", "deadline_s": "60"})
    assert r.status_code == 422 and 'id="drain-error"' in r.text and "a reason is required" in r.text
    assert "d-1" not in m.state.hostcfg
    r = await c.post("/hosts/d-1/drain", data={"csrf": console.csrf, "reason": "swap PSU", "deadline_s": "soon"})
    assert r.status_code == 422 and "number of seconds" in r.text and 'value="swap PSU"' in r.text
    r = await c.post("/hosts/d-1/drain", data={"csrf": console.csrf, "reason": "swap PSU", "deadline_s": "9999999"})
    assert r.status_code == 422 and "604800" in r.text
    r = await c.post("/hosts/d-1/drain", data={"reason": "swap PSU", "deadline_s": "60"})
    assert r.status_code == 403  # no CSRF token
    assert "d-1" not in m.state.hostcfg

    before = time.time()
    r = await c.post("/hosts/d-1/drain", data={"csrf": console.csrf, "reason": "swap PSU"})  # no deadline given
    assert r.status_code == 303 and r.headers["location"] == "/hosts/d-1?notice=draining"
    cfg = m.state.hostcfg["d-1"]
    assert cfg.draining and cfg.cordoned and cfg.reason == "swap PSU" and cfg.by == "operator"
    assert before + 299 <= cfg.drain_deadline <= time.time() + 301
    r = await c.get("/hosts/d-1?notice=draining")
    assert "Host draining" in r.text and "DRAINING" in r.text and "swap PSU" in r.text
    assert 'action="/hosts/d-1/drain"' not in r.text and "Uncordon host" in r.text
    r = await c.get("/hosts?cordoned=draining")
    assert "d-1" in r.text and "DRAINING" in r.text
    assert (await c.post("/hosts/nope/drain", data={"csrf": console.csrf, "reason": "x"})).status_code == 404


async def test_a_drain_scheduled_ahead_is_shown_until_it_begins_and_can_be_called_off(console: Console) -> None:
    c, m = await signed_in_with_host(console, "w-1")
    r = await c.get("/hosts/w-1")
    assert 'name="at" type="datetime-local"' in r.text
    r = await c.post("/hosts/w-1/drain", data={"csrf": console.csrf, "reason": "driver update", "deadline_s": "60",
                                               "at": "next tuesday"})
    assert r.status_code == 422 and "a date and time" in r.text and 'value="next tuesday"' in r.text
    assert "w-1" not in m.state.hostcfg
    r = await c.post("/hosts/w-1/drain", data={"csrf": console.csrf, "reason": "driver update", "deadline_s": "60",
                                               "at": "2126-01-01T00:00"})
    assert r.status_code == 422 and "at most 90 days ahead" in r.text
    # A start well past is refused as the mistake it most likely is (a wrong day or year
    # drained the host at once); one a moment past is taken as now.
    r = await c.post("/hosts/w-1/drain", data={"csrf": console.csrf, "reason": "driver update", "deadline_s": "60",
                                               "at": "2025-01-01T06:00"})
    assert r.status_code == 422 and "s in the past: give a time ahead, or none to drain now" in r.text
    assert "w-1" not in m.state.hostcfg
    at = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(days=2)
    r = await c.post("/hosts/w-1/drain", data={"csrf": console.csrf, "reason": "driver update", "deadline_s": "60",
                                               "at": at.strftime("%Y-%m-%dT%H:%M")})
    assert r.status_code == 303 and r.headers["location"] == "/hosts/w-1?notice=drain-scheduled"
    cfg = m.state.hostcfg["w-1"]
    assert cfg.draining and not cfg.cordoned and cfg.drain_at == at.timestamp()
    assert cfg.drain_deadline == at.timestamp() + 60
    r = await c.get("/hosts/w-1?notice=drain-scheduled")
    assert "Drain scheduled" in r.text and 'id="drain-scheduled"' in r.text and "driver update" in r.text
    assert "Cancel the scheduled drain" in r.text
    assert "uncordoned by" not in r.text  # a drain scheduled is no uncordon (found by exploring)
    r = await c.get("/hosts?cordoned=scheduled")
    assert "w-1" in r.text and "DRAIN AT" in r.text
    assert "w-1" not in (await c.get("/hosts?cordoned=draining")).text
    r = await c.post("/hosts/w-1/uncordon", data={"csrf": console.csrf, "reason": "postponed"})
    assert r.status_code == 303
    cfg = m.state.hostcfg["w-1"]
    assert not cfg.draining and not cfg.cordoned and m.state.maintenance == {}
    assert "uncordoned by" in (await c.get("/hosts/w-1")).text
    # The form's minute, just past, is taken as now: drained at once.
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    r = await c.post("/hosts/w-1/drain", data={"csrf": console.csrf, "reason": "now", "deadline_s": "60",
                                               "at": now.strftime("%Y-%m-%dT%H:%M")})
    assert r.status_code == 303
    cfg = m.state.hostcfg["w-1"]
    assert cfg.draining and cfg.cordoned and cfg.drain_at == 0.0


async def test_clearing_gpu_faults_needs_a_reason_and_keeps_the_cordon(console: Console) -> None:
    c, m = await signed_in_with_host(console, "g-1")
    assert 'action="/hosts/g-1/clear-gpu-faults"' not in (await c.get("/hosts/g-1")).text  # nothing to clear
    hb = heartbeat("g-1", seq=1, ts=time.time(), gpus=2, unhealthy=[1], fault="xid 79: GPU has fallen off the bus")
    assert m.store is not None
    await m.store.put("g-1", encode(hb), bucket=subjects.HOSTS_BUCKET)
    await eventually(lambda: m.state.faulted_gpus.get("g-1") == frozenset({1}), what="the fault")
    await m.set_cordon("g-1", True, "operator", "GPU 1 fell off the bus")
    r = await c.get("/hosts?faults=yes")
    assert 'href="/hosts/g-1"' in r.text and '<option value="yes" selected>With a faulted GPU</option>' in r.text
    assert 'href="/hosts/g-1"' not in (await c.get("/hosts?faults=no")).text
    # Hosts whose agent asks for no new work are a filter of their own.
    assert 'href="/hosts/g-1"' not in (await c.get("/hosts?pressure=yes")).text
    hb = hb.model_copy(update={"seq": 2, "pressure": "disk: less than 256 MB free in its state directory"})
    await m.store.put("g-1", encode(hb), bucket=subjects.HOSTS_BUCKET)
    await eventually(lambda: m.state.hosts["g-1"].heartbeat.pressure != "", what="the pressure")  # type: ignore[union-attr]
    r = await c.get("/hosts?pressure=yes")
    assert 'href="/hosts/g-1"' in r.text and '<option value="yes" selected>Asking for no new work</option>' in r.text
    assert 'href="/hosts/g-1"' not in (await c.get("/hosts?pressure=no")).text
    r = await c.get("/hosts/g-1")
    assert re.search(r'action="/hosts/g-1/clear-gpu-faults" class="stack" data-confirm="Clear GPU fault marks '
                     r'of g-1\? The GPUs cleared', r.text)
    assert 'name="gpus"' in r.text and "every faulted GPU (1)" in r.text
    r = await c.post("/hosts/g-1/clear-gpu-faults", data={"csrf": console.csrf, "reason": " "})
    assert r.status_code == 422 and 'id="gpus-error"' in r.text and "a reason is required" in r.text
    r = await c.post("/hosts/g-1/clear-gpu-faults", data={"reason": "reset"})
    assert r.status_code == 403  # no CSRF token
    assert m.state.hostcfg["g-1"].gpu_clears == {}
    r = await c.post("/hosts/g-1/clear-gpu-faults", data={"csrf": console.csrf, "reason": "reset", "gpus": "one"})
    assert r.status_code == 422 and "whole numbers" in r.text and 'value="one"' in r.text
    r = await c.post("/hosts/g-1/clear-gpu-faults", data={"csrf": console.csrf, "reason": "reset", "gpus": "7"})
    assert r.status_code == 422 and "has GPUs [0, 1]" in r.text
    assert m.state.hostcfg["g-1"].gpu_clears == {}
    r = await c.post("/hosts/g-1/clear-gpu-faults", data={"csrf": console.csrf, "reason": "GPU 1 reset"})
    assert r.status_code == 303 and r.headers["location"] == "/hosts/g-1?notice=gpus-cleared"
    cfg = m.state.hostcfg["g-1"]
    assert cfg.gpu_clears == {1: 1} and cfg.cordoned and cfg.reason == "GPU 1 fell off the bus"
    assert "GPU fault marks cleared" in (await c.get("/hosts/g-1?notice=gpus-cleared")).text
    # A cordon change keeps the count: the clear is not undone.
    await m.set_cordon("g-1", False, "operator", "")
    assert m.state.hostcfg["g-1"].gpu_clears == {1: 1} and not m.state.hostcfg["g-1"].cordoned
    # GPUs named: cleared whether or not the heartbeat shows them faulted.
    await m.clear_gpu_faults("g-1", "operator", "GPU 0 swapped", [0])
    assert m.state.hostcfg["g-1"].gpu_clears == {0: 1, 1: 1}
    assert (await c.post("/hosts/nope/clear-gpu-faults", data={"csrf": console.csrf, "reason": "x"})).status_code == 404


async def test_cancel_needs_a_reason(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    job = await m.submit({"name": "keep", "command": ["true"], "gpus": 64}, "operator")
    assert job is not None
    r = await c.get(f"/jobs/{job.id}")
    assert re.search(rf'action="/jobs/{job.id}/cancel" class="stack" data-confirm="Cancel job keep', r.text)
    r = await c.post(f"/jobs/{job.id}/cancel", data={"csrf": console.csrf, "reason": " "})
    assert r.status_code == 422 and "a reason is required" in r.text
    await asyncio.sleep(0.3)
    assert m.state.jobs[job.id].state is JobState.QUEUED


# ---------------------------------------------------------------- job page timeline


async def test_job_page_timeline_attempts_and_why_pending(console: Console) -> None:
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from wire.messages import Attempt, AttemptState

    c = console.client
    m = console.muster
    await console.login()
    now = time.time()
    job = make_job(
        "jgang0001", spec=job_spec("gang-job", command=["train"], gpus=1, replicas=2, max_attempts=3),
        state=JobState.QUEUED, submitted_at=now - 60, updated_at=now - 5, not_before=now + 30,
        pending_reasons={"not enough free GPUs": 3},
        attempts=[
            Attempt(id="a1", number=1, task=0, host_id="h-x", gpu_indices=[0], state=AttemptState.FAILED,
                    placed_at=now - 50, started_at=now - 49, finished_at=now - 40, exit_code=3,
                    output_tail="boom from task 0", reason="exit code 3"),
            Attempt(id="a2", number=1, task=1, host_id="h-y", gpu_indices=[1], state=AttemptState.KILLED,
                    placed_at=now - 50, started_at=now - 49, finished_at=now - 39, reason="gang member failed"),
        ],
    )
    m.state.apply_job(job, 10**9)  # the live record; history may not have it yet
    r = await c.get("/jobs/jgang0001")
    assert r.status_code == 200
    assert_security_headers(r)
    html = r.text
    assert "Gang" in html and "2 tasks placed together" in html
    # In the jobs table a queued job shows no host: where its last try ran is not where it is.
    row = re.search(r'<tr>\s*<th scope="row"><a href="/jobs/jgang0001".*?</tr>', (await c.get("/jobs")).text, re.S)
    assert row is not None and "QUEUED" in row.group(0) and "/hosts/" not in row.group(0)
    assert "1 try, 0 counted of at most 3 (preempted tries, those a drain, shutdown or requeue stopped, and failed " \
        "tries, which count against its retries, are not); each try runs 2 tasks." in html
    # A preempted try is not counted against the attempt limit (found by exploring: "2 tries
    # of at most 1" for a job the scheduler rightly ran again).
    again = make_job(
        "jpre00001", spec=job_spec("again", command=["train"], gpus=1, max_attempts=1), state=JobState.RUNNING,
        submitted_at=now - 60, updated_at=now - 5,
        attempts=[Attempt(id="p1", number=1, host_id="h-x", gpu_indices=[0], state=AttemptState.PREEMPTED,
                          placed_at=now - 50, started_at=now - 49, finished_at=now - 30, reason="preempted"),
                  Attempt(id="p2", number=2, host_id="h-y", gpu_indices=[1], state=AttemptState.RUNNING,
                          placed_at=now - 20, started_at=now - 19)])
    m.state.apply_job(again, 10**9 + 1)
    page = (await c.get("/jobs/jpre00001")).text
    assert "2 tries, 1 counted of at most 1 (preempted tries" in page
    rows = re.findall(r'<tr>\s*<th scope="row" class="num">(\d+)</th>(.*?)</tr>', html, re.S)
    assert len(rows) == 2
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for _, row in rows]
    assert [re.sub("<[^>]+>", "", cs[4]).strip() for cs in cells] == ["0", "1"]  # gang task index
    assert "Output of try 1, task 0 on h-x (tail)" in html and "boom from task 0" in html
    # The timeline: derived from the record, in time order, with UTC timestamps.
    timeline = html[html.index('<ol class="timeline"'):]
    kinds = re.findall(r'<span class="ev-kind">([^<]+)</span>', timeline)
    assert kinds[0] == "job.submitted"
    assert kinds.count("attempt.placed") == 2 and "attempt.failed" in kinds and "attempt.killed" in kinds
    assert kinds.index("attempt.failed") < kinds.index("attempt.killed")
    assert re.search(r'<time datetime="\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ">', timeline)
    assert "exit code 3" in timeline
    # Why pending: the live explanation, the last try, the back-off.
    assert "Why pending" in html and "not enough free GPUs" in html
    assert "its next try waits out the retry backoff (in about" in html and "<dt>Not before</dt>" in html
    # Once the back-off is over (or for a try requeued at once, as a preempted one is),
    # nothing says the job is held back.
    m.state.apply_job(job.model_copy(update={"not_before": now - 1}), 10**9 + 1)
    html = (await c.get("/jobs/jgang0001")).text
    assert "Why pending" in html and "retry backoff" not in html and "back-off" not in html
    assert "<dt>Not before</dt>" not in html


async def test_why_pending_tells_a_host_too_small_from_a_busy_one(console: Console) -> None:
    m = console.muster
    await console.login()
    await put_heartbeat(m, "h-small")  # 32 CPUs, 2 GPUs
    await eventually(lambda: "h-small" in m.state.hosts, what="heartbeat")
    big = await submitted(m, {"name": "big", "command": ["true"], "cpus": 64})
    fits = await submitted(m, {"name": "fits", "command": ["true"], "cpus": 2, "gpus": 2})
    html = (await console.client.get(f"/jobs/{big.id}")).text
    assert "not enough CPUs on host" in html and "(these hosts could not take it even idle)" in html
    assert ("It could never run as the cluster stands: no host could run it even idle (of 1 known: 1 host: not "
            "enough CPUs on host); it waits for one that can.") in html
    # One that would fit the idle host says nothing of the kind (here the host is free:
    # a host can take it now).
    assert "even idle" not in (await console.client.get(f"/jobs/{fits.id}")).text


async def test_the_jobs_table_says_what_each_job_asks_of_gpus(console: Console) -> None:
    m = console.muster
    await console.login()
    share = await m.submit({"name": "s", "command": ["true"], "gpu_share": 250, "gpu_models": ["A10", "T4"]},
                           "operator")
    gang = await m.submit({"name": "g", "command": ["true"], "gpus": 8, "replicas": 4}, "operator")
    r = await console.client.get("/jobs")

    def gpus_cell(job_id: str) -> str:
        row = r.text[r.text.index(f'href="/jobs/{job_id}"'):]
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row[:row.index("</tr>")], re.S)
        return re.sub(r"<[^>]+>", "", cells[4]).strip()

    assert gpus_cell(share.id) == "250/1000 shared × A10|T4"  # not "0"
    assert gpus_cell(gang.id) == "8 × 4 tasks"


async def test_a_running_trys_gpus_show_how_busy_they_are(console: Console) -> None:
    """The job page tells, by a running try's GPUs, how busy they are in its host's latest
    heartbeat (is the job using what it holds?); an ended try tells nothing."""
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from wire.messages import Attempt, AttemptState

    m = console.muster
    await console.login()
    await put_hb(m, "gpu-u", util=62.0)
    await eventually(lambda: "gpu-u" in m.state.hosts, what="the host")
    now = time.time()
    tries = [Attempt(id="jbusy0001.1", number=1, host_id="gpu-u", gpu_indices=[0, 1], state=AttemptState.KILLED,
                     placed_at=now - 50, started_at=now - 49, finished_at=now - 20, gpu_util_pct=12.5),
             Attempt(id="jbusy0001.2", number=2, host_id="gpu-u", gpu_indices=[0, 1], state=AttemptState.RUNNING,
                     placed_at=now - 5, started_at=now - 4)]
    m.state.apply_job(make_job("jbusy0001", spec=job_spec("busy", command=["train"], gpus=2),
                               state=JobState.RUNNING, attempts=tries), 10**9)
    page = (await console.client.get("/jobs/jbusy0001")).text
    assert '<span class="muted" id="gpu-use-jbusy0001.2">now 62 % busy' in page
    assert 'id="gpu-use-jbusy0001.1"' not in page
    # The ended try: how busy its GPUs were over its run, as its agent reported.
    assert '<span class="muted" id="gpu-avg-jbusy0001.1">12.5 % busy on average over its run</span>' in page


async def test_a_job_holding_idle_gpus_is_alerted_and_shown(console: Console) -> None:
    """A host's heartbeat names an attempt whose GPUs have all been idle for its agent's
    --gpu-idle-after: the leader publishes `alerts.job.gpus_idle` once, the job's page
    and `Attempt.gpuIdleSince` say since when."""
    from server.api.graphql import build_schema
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from wire.messages import Attempt, AttemptState, Event, decode

    m = console.muster
    await console.login()
    assert m.nc is not None and m.store is not None
    heard: list[Event] = []

    async def on_alert(msg: Any) -> None:
        heard.append(decode(Event, msg.data))

    sub = await m.nc.subscribe("alerts.job.gpus_idle", cb=on_alert)
    now = time.time()
    tries = [Attempt(id="jidle0001.1", number=1, host_id="gpu-i", gpu_indices=[0, 1], state=AttemptState.RUNNING,
                     placed_at=now - 4000, started_at=now - 3999)]
    m.state.apply_job(make_job("jidle0001", spec=job_spec("idle", command=["train"], gpus=2, queue="default"),
                               state=JobState.RUNNING, attempts=tries), 10**9)
    hb = heartbeat("gpu-i", seq=0, ts=now, gpus=2, util=0.5, gpu_idle={"jidle0001.1": now - 1900})
    await m.store.put("gpu-i", encode(hb), bucket=subjects.HOSTS_BUCKET)
    try:
        await eventually(lambda: len(heard) >= 1, timeout=20, what="the idle GPUs alert")
        await asyncio.sleep(1.5)  # a later check: no second alert for the same attempt
    finally:
        await sub.unsubscribe()
    assert len(heard) == 1 and heard[0].job_id == "jidle0001" and heard[0].host_id == "gpu-i", heard
    page = (await console.client.get("/jobs/jidle0001")).text
    assert '<span class="badge cordoned" id="gpu-idle-jidle0001.1">IDLE since' in page
    res = await build_schema().execute('{ job(id: "jidle0001") { attempts { gpuIdleSince } } }',
                                       context_value={"muster": m, "token": None})
    assert res.errors is None and res.data is not None, res.errors
    assert res.data["job"]["attempts"][0]["gpuIdleSince"].startswith(
        dt.datetime.fromtimestamp(now - 1900, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M"))
    # The list an operator reads after the alert (`muster job idle`'s own query).
    from server.cli.jobs import IDLE_QUERY
    res = await build_schema().execute(IDLE_QUERY, variable_values={"n": 10},
                                       context_value={"muster": m, "token": None})
    assert res.errors is None and res.data is not None, res.errors
    [row] = res.data["idleGpus"]
    assert (row["host"], row["job"]["id"], row["attempt"]["gpuIndices"]) == ("gpu-i", "jidle0001", [0, 1]), row
    for n, rows in ((0, []), (1001, None), (-1, None)):  # at most 1,000, as api.md says
        res = await build_schema().execute(IDLE_QUERY, variable_values={"n": n},
                                           context_value={"muster": m, "token": None})
        if rows is None:
            assert res.errors and res.errors[0].extensions["code"] == "OUT_OF_RANGE", res
        else:
            assert res.errors is None and res.data["idleGpus"] == rows, res


async def test_a_running_trys_output_so_far_comes_from_its_agent(console: Console) -> None:
    """The job page asks each running try's agent for its output so far (the request an
    agent answers on `muster.output.<host>`; here the test answers for host h-live), and
    says so when an agent does not answer (h-gone)."""
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from wire import subjects
    from wire.messages import Attempt, AttemptState, OutputReply, OutputRequest, decode, encode

    m = console.muster
    await console.login()
    now = time.time()
    attempts = [Attempt(id=f"jlive0001.1.{t}", number=1, task=t, host_id=h, gpu_indices=[0],
                        state=AttemptState.RUNNING, placed_at=now - 5, started_at=now - 4)
                for t, h in ((0, "h-live"), (1, "h-gone"))]
    m.state.apply_job(make_job("jlive0001", spec=job_spec("live", command=["train"], replicas=2),
                               state=JobState.RUNNING, attempts=attempts), 10**9)
    assert m.store is not None
    asked: list[str] = []

    async def agent(msg: Any) -> None:
        req = decode(OutputRequest, msg.data)
        asked.append(req.attempt_id)
        await msg.respond(encode(OutputReply(attempt_id=req.attempt_id, running=True,
                                             output_tail="epoch 1 <loss> 0.5\u202e\n", ts=time.time())))

    sub = await m.store.nc.subscribe(subjects.output_subject("h-live"), cb=agent)
    try:
        r = await console.client.get("/jobs/jlive0001")
    finally:
        await sub.unsubscribe()
    assert r.status_code == 200 and asked == ["jlive0001.1.0"]
    assert "Output of try 1, task 0 on h-live so far" in r.text
    assert '<pre tabindex="0" class="tail" id="live-jlive0001.1.0"><code>epoch 1 &lt;loss&gt; 0.5' in r.text  # escaped
    # A bidirectional override shown, not obeyed (found by exploring).
    assert '0.5<span class="ctl">&lt;U+202E&gt;</span>\n' in r.text and "\u202e" not in r.text
    # The page is polled while a try runs, the event stream open or not (found by exploring).
    assert " data-poll>" in r.text[r.text.index('<div id="live"'):][:1000]
    gone = r.text[r.text.index("Output of try 1, task 1 on h-gone so far"):]
    assert gone.index("Its agent did not answer") < gone.index("</section>")
    # Neither host was ever heard of (LOST): each try says its host is lost.
    assert r.text.count('<span class="badge health-lost">LOST</span> <span class="muted">replaced once') == 2
    # A gang of 34 running tasks: the page (polled every 2 s) asks 32 agents, and says why
    # the other two show no output.
    many = [Attempt(id=f"jlive0002.1.{t}", number=1, task=t, host_id="h-live", gpu_indices=[0],
                    state=AttemptState.RUNNING, placed_at=now - 5, started_at=now - 4) for t in range(34)]
    m.state.apply_job(make_job("jlive0002", spec=job_spec("big", command=["train"], replicas=34),
                               state=JobState.RUNNING, attempts=many), 10**9 + 1)
    asked.clear()
    sub = await m.store.nc.subscribe(subjects.output_subject("h-live"), cb=agent)
    try:
        r = await console.client.get("/jobs/jlive0002")
    finally:
        await sub.unsubscribe()
    assert r.status_code == 200 and sorted(asked) == sorted(a.id for a in many[:32])
    assert r.text.count("Not asked: this page asks the agents of the first 32 running tasks only") == 2


async def test_job_timeline_from_history(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    r = await c.post("/submit", data={"csrf": console.csrf, "name": "tl", "command": "true", "gpus": "64"})
    job_id = r.headers["location"].split("/")[2].split("?")[0]
    assert m.history is not None
    history = m.history
    await eventually(lambda: bool(history.list_events(job_id=job_id)), what="history to record the job")
    r = await c.get(f"/jobs/{job_id}")
    timeline = r.text[r.text.index('<ol class="timeline"'):]
    assert timeline.count("job.submitted") == 1  # history and the live record merged by id
    assert "No events recorded yet" not in r.text


# ---------------------------------------------------------------- server-sent events


async def test_event_stream_sends_job_events(console: Console) -> None:
    import uvicorn

    from server.broker.natsd import free_port

    m = console.muster
    # Not signed in: no stream.
    r = await console.client.get("/events/stream")
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert_security_headers(r)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(console.app, host="127.0.0.1", port=port, log_level="warning",  # type: ignore[arg-type]
                                           lifespan="off"))
    serving = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started, what="uvicorn")
        listeners = len(m.state.listeners)
        await console.login()
        cookies = {COOKIE: console.session}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", cookies=cookies, timeout=10) as http:
            async with http.stream("GET", "/events/stream") as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                assert_security_headers(resp)
                lines = resp.aiter_lines()

                async def next_event() -> tuple[str, str]:
                    event = data = ""
                    while True:
                        line = await asyncio.wait_for(anext(lines), timeout=10)
                        if line.startswith("event: "):
                            event = line[7:]
                        elif line.startswith("data: "):
                            data = line[6:]
                        elif line == "" and event:
                            return event, data

                assert (await next_event())[0] == "stats"
                assert len(m.state.listeners) == listeners + 1
                job = await m.submit({"name": "sse", "command": ["true"], "gpus": 64}, "operator")
                assert job is not None
                for _ in range(20):
                    event, data = await next_event()
                    if event == "job":
                        break
                assert event == "job"
                import json

                assert json.loads(data) == {"id": job.id, "state": "QUEUED"}
        # The client went away: its listener is removed.
        await eventually(lambda: len(m.state.listeners) == listeners, what="the stream's listener to go")
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=15)


async def test_pages_carry_live_update_wiring(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    r = await c.get("/")
    assert '<script src="/static/live.js" defer></script>' in r.text
    assert 'data-sse="/events/stream" data-sse-on="job host stats"' in r.text
    assert 'hx-trigger="every 2s"' in r.text  # the fallback while the stream is down
    js = await c.get("/static/live.js")
    assert js.status_code == 200 and "EventSource" in js.text and "htmx:confirm" in js.text
    job = await m.submit({"name": "w", "command": ["true"], "gpus": 64}, "operator")
    assert job is not None
    r = await c.get(f"/jobs/{job.id}")
    assert f'data-sse-on="job" data-sse-id="{job.id}"' in r.text
    for path in ("/", "/hosts", "/jobs", f"/jobs/{job.id}", "/submit", "/hosts?rack=x"):
        r = await c.get(path)
        assert r.status_code == 200, path
        assert_security_headers(r)
        assert "style=" not in r.text and "<style" not in r.text, path
        assert re.search(r"<script(?![^>]*\bsrc=)", r.text) is None, path


async def test_alerts_page_lists_recorded_alerts(console: Console) -> None:
    from wire.messages import Event

    await console.login()
    r = await console.client.get("/alerts")
    assert r.status_code == 200 and "No alerts" in r.text
    assert_security_headers(r)
    m = console.muster
    assert m.nc is not None
    await m.nc.publish("alerts.host.lost", encode(Event(kind="host.lost", host_id="rack9-host",
                                                        message="host rack9-host: heartbeat key expired")))
    await m.nc.publish("alerts.gpu.unhealthy", encode(Event(kind="gpu.unhealthy", host_id="gpu-host",
                                                            message="GPU 3 on gpu-host is unschedulable: xid 79")))
    deadline = time.monotonic() + 20
    while True:
        r = await console.client.get("/alerts")
        if "rack9-host" in r.text and "xid 79" in r.text:
            break
        assert time.monotonic() < deadline, "alerts never showed up in the console"
        await asyncio.sleep(0.2)
    assert "host.lost" in r.text and "gpu.unhealthy" in r.text
    r = await console.client.get("/alerts?kind=gpu.unhealthy")
    assert "xid 79" in r.text and "rack9-host" not in r.text
    # Past the last page: the last page (found by exploring: "No alerts yet.", no pager).
    r = await console.client.get("/alerts?page=999")
    assert "rack9-host" in r.text and "xid 79" in r.text and "No alerts" not in r.text
    # Every kind the control plane publishes is a filter (the page once offered 8 of 12).
    from wire import subjects
    offered = re.findall(r'<option value="([a-z._]+)"', r.text)
    assert set(offered) == set(subjects.ALERT_KINDS) and "input.rejected" in offered, offered
    await m.nc.publish("alerts.input.rejected", encode(Event(kind="input.rejected", message="record too large")))
    deadline = time.monotonic() + 20
    while "record too large" not in (r := await console.client.get("/alerts?kind=input.rejected")).text:
        assert time.monotonic() < deadline, "the rejected input's alert never showed up under its kind"
        await asyncio.sleep(0.2)
    assert "xid 79" not in r.text


async def test_queues_page_queue_filter_and_queue_reasons(console: Console) -> None:
    c = console.client
    m = console.muster
    await console.login()
    await put_heartbeat(m, "qh1", gpus=2)
    await eventually(lambda: "qh1" in m.state.hosts, what="the host")
    await m.create_queue({"name": "vision", "cohort": "lab", "quota": {"gpu:H100": {"nominal": 1}}}, "operator")
    small = await m.submit({"name": "v-small", "command": ["sleep", "60"], "gpus": 1, "queue": "vision"}, "operator")
    big = await m.submit({"name": "v-big", "command": ["true"], "gpus": 2, "queue": "vision"}, "operator")
    await m.submit({"name": "plain", "command": ["true"], "gpus": 64}, "operator")
    assert m.history is not None
    history = m.history
    await eventually(lambda: history.list_jobs(limit=1)[1] == 3, what="history to catch up")
    r = await c.get("/queues")
    assert r.status_code == 200
    assert_security_headers(r)
    assert 'id="queue-vision"' in r.text and 'id="queue-default"' in r.text
    assert "gpu:H100" in r.text and "<meter" in r.text and "nominal 1" in r.text
    # vision holds one GPU of the two (its dominant share), is entitled to half of the
    # cluster beside the default queue, and ranks by share / weight (1).
    await eventually(lambda: len(m.state.queue_live.get("vision", ())) == 1, what="v-small placed")
    r = await c.get("/queues")
    row = r.text[r.text.index('id="queue-vision"'):]
    row = row[:row.index("</tr>")]
    assert ">Fair-share rank</th>" in r.text
    # A bar for the metered GPUs only; CPU and memory, unmetered, are counted without one.
    assert row.count("<meter") == 1 and 'aria-label="vision gpu:H100 used"' in row and "not metered" in row
    assert re.findall(r'<td class="num">([0-9.]+)</td>', row)[-3:] == ["0.500", "0.500", "0.500"], row
    # Fairness now, over the two queues with jobs waiting (vision's v-big, default's plain):
    # vision holds half the cluster for its half, default nothing for its half: Jain 0.5.
    assert "Fairness now: <strong>0.500</strong>" in r.text and "over the 2 queues with jobs waiting" in r.text
    assert "Submission limits" not in row and "users by fair share" not in row  # none: nothing said of them
    await m.update_queue("vision", {"max_submitted_jobs": 10, "max_submitted_jobs_per_user": 4,
                                    "max_running_jobs_per_user": 3, "host_labels": {"rack": "r1"},
                                    "fair_share_users": True}, "operator")
    r = await c.get("/queues")
    row = r.text[r.text.index('id="queue-vision"'):]
    assert "jobs 2 / 10, ≤ 4 a user</small>" in row[:row.index("</tr>")]
    assert "≤ 3 running a user</small>" in row[:row.index("</tr>")]
    assert "users by fair share</small>" in row[:row.index("</tr>")]
    assert re.search(r'class="muted queue-users"[^>]*>operator 1 GPU · 1 run</small>', row[:row.index("</tr>")]), row
    assert 'on <span class="label">rack=r1</span>' in row[:row.index("</tr>")]
    # The host's tasks say which job, by name, and its queue.
    r = await c.get("/hosts/qh1")
    task_row = r.text[r.text.index(f'id="task-{small.id}.1"'):]
    task_row = task_row[:task_row.index("</tr>")]
    assert "<td>v-small</td>" in task_row and '<a href="/queues#queue-vision">vision</a>' in task_row
    # An advance reservation: listed on the queues page, named on its host's page.
    assert "No host is set aside for a queue" in (await c.get("/queues")).text and "Set aside" not in r.text
    await m.create_advance_reservation({"name": "demo", "hosts": ["qh1"], "queues": ["vision"],
                                        "starts": time.time() + 3600, "ends": time.time() + 7200}, "admin")
    r = await c.get("/queues")
    row = r.text[r.text.index('id="advres-demo"'):]
    row = row[:row.index("</tr>")]
    assert "<td>upcoming</td><td>queue vision</td>" in row and ">1</td>" in row, row
    r = await c.get("/hosts/qh1")
    assert "<dt>Set aside</dt>" in r.text and "(advance reservation demo): until then other jobs" in r.text
    await m.delete_advance_reservation("demo", "admin")
    r = await c.get("/jobs?queue=vision")
    assert r.status_code == 200 and "v-small" in r.text and "v-big" in r.text and "plain" not in r.text
    assert "in queue vision" in r.text
    # The 2-GPU job waits on its queue's quota (1 GPU, in a cohort with nothing to lend).
    r = await c.get(f"/jobs/{big.id}")
    assert r.status_code == 200
    assert 'id="queue-reasons"' in r.text and "over nominal quota and cannot borrow" in r.text
    assert 'href="/queues#queue-vision"' in r.text
    assert small.spec.queue == "vision"


async def test_the_queues_pages_usage_says_what_preemption_cost(console: Console) -> None:
    """The usage table, from the recorded attempts: GPU-hours run, and GPU-hours lost by
    the attempts that ended preempted (all a try ran; from its stop to its exit for a
    job that checkpoints)."""
    from tests.factories import job, job_spec
    from wire.messages import Attempt, AttemptState

    m = console.muster
    await console.login()
    assert m.history is not None
    now = time.time()
    runs = [("lost-all", False, AttemptState.PREEMPTED), ("saved", True, AttemptState.PREEMPTED),
            ("done", False, AttemptState.SUCCEEDED)]
    for i, (name, ckpt, ended) in enumerate(runs):
        spec = job_spec(name, gpus=2, queue="vision", user="ann", checkpoints=ckpt)
        a = Attempt(id=f"jv{i}.1", number=1, host_id="h", gpu_indices=[0, 1], state=ended, placed_at=now - 3600,
                    started_at=now - 3600, finished_at=now - 1800, gpu_model="H100",
                    stop_at=now - 1800 - 360 if ended is AttemptState.PREEMPTED else None,
                    gpu_util_pct=(20.0, None, 80.0)[i])
        m.history.record(job(f"jv{i}", spec=spec, state=JobState.QUEUED, attempts=[a], submitted_at=now - 3600), 1)
    m.history.flush()
    r = await console.client.get("/queues?period=day")
    row = r.text[r.text.index("<td>vision</td>"):]
    cells = re.findall(r'<td class="num">([0-9.]+)</td>', row[:row.index("</tr>")])
    # 3 tries of 2 GPUs for half an hour: 3 GPU-hours; lost: 1 GPU-hour (all of one try)
    # + 0.2 (the other's 6 minutes from its stop to its exit, on 2 GPUs).
    assert cells[0] == "3.00" and cells[-2:] == ["3", "1.20"], cells
    assert "GPU-hours lost to preemption" in r.text
    # How busy the GPUs were: the two tries that reported it, weighted alike: 50 %.
    assert '<td class="num">50 %</td></tr>' in row[:row.index("</tr>") + 5], row[:row.index("</tr>")]


async def test_a_host_under_pressure_says_so_on_its_page_and_in_the_table(console: Console) -> None:
    c, m = await signed_in_with_host(console, "p-1")
    assert "PRESSURE" not in (await c.get("/hosts/p-1")).text
    hb = heartbeat("p-1", seq=1, ts=time.time(), gpus=2, labels={"rack": "r1", "zone": "z1"}).model_copy(
        update={"pressure": "disk: 12 MB free in its work directory /w (below 256 MB)"})
    assert m.store is not None
    await m.store.put("p-1", encode(hb), bucket=subjects.HOSTS_BUCKET)
    await eventually(lambda: m.state.hosts["p-1"].latest().pressure, what="the pressure")  # type: ignore[union-attr]
    page = (await c.get("/hosts/p-1")).text
    assert 'id="host-pressure"' in page and "takes no new work: disk: 12 MB free in its work directory /w" in page
    assert 'title="Takes no new work: disk: 12 MB free' in (await c.get("/hosts")).text


async def test_a_host_page_says_which_labels_are_the_operators_and_which_of_its_agents_are_ignored(
        console: Console) -> None:
    from server.scheduling.hostlabels import LabelTrust

    c, m = await signed_in_with_host(console, "lb-1")
    m.state.set_label_trust(LabelTrust(frozenset({"team"})))
    hb = heartbeat("lb-1", seq=1, ts=time.time(), gpus=2, labels={"rack": "r1", "team": "vision", "net": "ib"})
    assert m.store is not None
    await m.store.put("lb-1", encode(hb), bucket=subjects.HOSTS_BUCKET)
    await eventually(lambda: "team" in m.state.hosts["lb-1"].latest().labels, what="the labels")  # type: ignore
    await m.set_labels("lb-1", "operator", {"rack": "r2"}, reason="moved")
    page = (await c.get("/hosts/lb-1")).text
    shown = page[page.index('id="host-labels"'):]
    shown = shown[:shown.index("</dd>")]
    assert re.findall(r'<span class="label( operator-label)?"[^>]*>(\w+=\w+)', shown) == [
        ("", "net=ib"), (" operator-label", "rack=r2")], shown
    ignored = page[page.index('id="host-labels-ignored"'):]
    assert "rack=r1" in ignored[:ignored.index("</dd>")] and "team=vision" in ignored[:ignored.index("</dd>")]


async def test_pages_that_read_history_say_when_its_database_is_down(console: Console,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by exploring: with the history database down, the host page (its recent
    attempts) and the alerts page were a bare 500. The host page shows the host and says
    history did not answer; a page made of history says so, 503."""
    from sqlalchemy.exc import OperationalError

    c, m = await signed_in_with_host(console, "hd-1")
    assert m.history is not None

    def down(*_a: object, **_k: object) -> None:
        raise OperationalError("SELECT", None, ConnectionRefusedError("connection refused"))

    monkeypatch.setattr(m.history, "list_attempts", down)
    monkeypatch.setattr(m.history, "list_alerts", down)
    r = await c.get("/hosts/hd-1")
    assert r.status_code == 200 and 'id="history-down"' in r.text
    r = await c.get("/alerts")
    assert r.status_code == 503 and "History unavailable" in r.text and "did not answer" in r.text
    # The database's own words (its host and port, here its error) only in the log.
    assert "connection refused" not in r.text and "connection refused" not in (await c.get("/hosts/hd-1")).text


# ---------------------------------------------------------------- found by exploring


def attempts_of(job_id: str, tries: int, tasks: int, state: Any, *, output: str = "") -> list[Any]:
    """`tries` tries of `tasks` tasks each, all ended in `state` (an AttemptState)."""
    from wire.messages import Attempt

    now = time.time()
    return [Attempt(id=f"{job_id}.{n}.{t}", number=n, task=t, host_id=f"h-{t}", gpu_indices=[0], state=state,
                    placed_at=now - 60, started_at=now - 50, finished_at=now - 10, exit_code=0, output_tail=output)
            for n in range(1, tries + 1) for t in range(tasks)]


def live_tag(text: str) -> str:
    """The opening tag of a page's live part."""
    part = live_fragment(text)
    return part[:part.index(">") + 1]


async def test_only_a_job_page_with_a_try_running_is_polled_with_the_stream_open(console: Console) -> None:
    """Found by exploring: a running try's output so far and "now N % busy" never moved
    while the job page's event stream was open (live.js polled only while it was down, and
    no job event fires as output grows). While a try runs, the live part says so
    (data-poll) and live.js polls it all the same; otherwise the stream alone refreshes it."""
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from wire.messages import AttemptState

    m = console.muster
    await console.login()
    m.state.apply_job(make_job("jpolled01", spec=job_spec("done"), state=JobState.SUCCEEDED,
                               attempts=attempts_of("jpolled01", 1, 1, AttemptState.SUCCEEDED)), 10**9)
    r = await console.client.get("/jobs/jpolled01")
    assert r.status_code == 200 and "data-poll" not in live_tag(r.text)
    js = (await console.client.get("/static/live.js")).text
    assert 'hasAttribute("data-poll")' in js
    # (a running try's page: test_a_running_trys_output_so_far_comes_from_its_agent)


async def test_a_jobs_output_shows_control_and_bidi_characters_as_code_points(console: Console) -> None:
    """Found by exploring: a job's output with Unicode bidirectional controls (a
    right-to-left override, isolates, marks) showed its text reordered, and other control
    characters hid in it. Each shows as its code point (<U+202E>), in a span of class
    "ctl"; tabs and newlines are kept."""
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from wire.messages import AttemptState

    m = console.muster
    await console.login()
    out = "ok \u202eevil\u202c \u2066iso\u2069 \u200e\u200f\u061c\x1b[31mred\x07\x00\x7f\tx\ny <b>"
    m.state.apply_job(make_job("jbidi0001", spec=job_spec("bidi"), state=JobState.SUCCEEDED,
                               attempts=attempts_of("jbidi0001", 1, 1, AttemptState.SUCCEEDED, output=out)), 10**9)
    r = await console.client.get("/jobs/jbidi0001")
    assert r.status_code == 200
    pre = r.text[r.text.index('<pre tabindex="0" class="tail"><code>'):]
    pre = pre[:pre.index("</pre>")]

    def ctl(code: str) -> str:
        return f'<span class="ctl">&lt;U+{code}&gt;</span>'

    assert (f"ok {ctl('202E')}evil{ctl('202C')} {ctl('2066')}iso{ctl('2069')} {ctl('200E')}{ctl('200F')}"
            f"{ctl('061C')}{ctl('001B')}[31mred{ctl('0007')}{ctl('0000')}{ctl('007F')}\tx\ny &lt;b&gt;") in pre, pre
    assert not re.search("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\x00-\x08\x1b\x7f]", r.text)


async def test_an_action_the_store_did_not_answer_says_it_may_have_been_done(console: Console,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by exploring: when the store timed out on an action, the console said "Store
    unavailable ... cancel: nats: timeout" as a failure, and the cancel had been applied
    (so had a requeue). The outcome is unknown: the page says it may have been applied and
    to look before trying again."""
    from wire.errors import StoreError

    c = console.client
    m = console.muster
    await console.login()
    job = await submitted(m, {"name": "slow-store", "command": ["true"], "gpus": 64})

    async def timed_out(*_a: object, **_k: object) -> None:
        raise StoreError("cancel: nats: timeout")

    monkeypatch.setattr(m, "cancel", timed_out)
    r = await c.post(f"/jobs/{job.id}/cancel", data={"csrf": console.csrf, "reason": "not needed"})
    assert r.status_code == 503 and "Store unavailable" not in r.text
    assert "Outcome unknown" in r.text and "cancel: nats: timeout" in r.text and "may have been applied" in r.text
    assert "before trying again" in r.text
    monkeypatch.setattr(m, "requeue", timed_out)
    r = await c.post(f"/jobs/{job.id}/requeue", data={"csrf": console.csrf}, headers={"HX-Request": "true"})
    assert r.status_code == 503 and r.text.startswith("The cluster store did not answer in time")
    assert "may have been applied" in r.text


async def test_the_jobs_list_counts_tries_as_the_job_page_does(console: Console) -> None:
    """Found by exploring: the jobs list's Attempts column counted a gang's tasks (4 for a
    4-task gang's first try) while the job's page said "1 try". It counts tries."""
    from tests.factories import job as make_job
    from tests.factories import job_spec
    from wire.messages import AttemptState

    m = console.muster
    await console.login()
    m.state.apply_job(make_job("jgang0001", spec=job_spec("gang", replicas=4), state=JobState.SUCCEEDED,
                               attempts=attempts_of("jgang0001", 2, 4, AttemptState.SUCCEEDED)), 10**9)
    r = await console.client.get("/jobs")
    assert '<th scope="col" class="num">Tries</th>' in r.text
    row = r.text[r.text.index('id="job-jgang0001"'):]
    row = row[:row.index("</tr>")]
    assert '<td class="num">2</td>' in row and '<td class="num">8</td>' not in row, row
    assert "2 tries" in (await console.client.get("/jobs/jgang0001")).text


async def test_no_bulk_forms_for_a_queue_that_does_not_exist(console: Console) -> None:
    """Found by exploring: /jobs?queue=<a deleted queue> offered the forms that cancel, hold
    or release the jobs it matches, which were always refused (404). The list still shows
    the jobs recorded in it; the forms are not offered."""
    from tests.factories import job as make_job
    from tests.factories import job_spec

    c = console.client
    m = console.muster
    await console.login()
    m.state.apply_job(make_job("jgone0001", spec=job_spec("old", queue="gone"), state=JobState.SUCCEEDED), 10**9)
    await submitted(m, {"name": "here", "command": ["true"], "gpus": 64})
    r = await c.get("/jobs?queue=gone")
    assert r.status_code == 200 and "There is no queue gone" in r.text and 'id="job-jgone0001"' in r.text
    assert 'id="cancel-matching"' not in r.text and 'id="hold-matching"' not in r.text
    r = await c.get("/jobs?queue=default")  # a queue that exists: offered
    assert 'id="cancel-matching"' in r.text and 'id="hold-matching"' in r.text


async def test_the_overviews_jobs_card_counts_ended_jobs_from_history(console: Console,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by exploring: once ended jobs' records expired from the live state
    (MUSTER_FINISHED_JOB_TTL), the overview's Jobs card said "No jobs yet", and its
    SUCCEEDED and FAILED counts disagreed with /jobs?state=..., which reads history. Ended
    jobs are counted from history; with history down, the card says so."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from tests.factories import job as make_job
    from tests.factories import job_spec

    c = console.client
    m = console.muster
    await console.login()
    assert m.history is not None
    # Ended an hour ago: in history only, as after the live state forgot them.
    for i, state in enumerate((JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.FAILED)):
        m.history.record(make_job(f"jold{i}", spec=job_spec(f"old-{i}"), state=state), 1)
    m.history.flush()
    queued = await submitted(m, {"name": "waiting", "command": ["true"], "gpus": 64})

    def count(text: str, state: str) -> int:
        found = re.search(rf'id="ov-state-{state}">.*?</a></td><td class="num">(\d+)</td>', text)
        assert found, (state, text)
        return int(found.group(1))

    r = await c.get("/")
    assert "No jobs yet" not in r.text
    assert (count(r.text, "SUCCEEDED"), count(r.text, "FAILED"), count(r.text, "QUEUED")) == (3, 1, 1)
    assert "3 jobs SUCCEEDED" in (await c.get("/jobs?state=SUCCEEDED")).text  # as the list counts them
    assert "1 job FAILED" in (await c.get("/jobs?state=FAILED")).text

    def down(*_a: object, **_k: object) -> None:
        raise OperationalError("SELECT", None, ConnectionRefusedError("connection refused"))

    from web.console import hosts as hosts_module

    monkeypatch.setattr(m.history, "count_by_state", down)
    hosts_module._ENDED_COUNTS.clear()  # (the counts are kept ENDED_COUNTS_MAX_AGE_S)
    r = await c.get("/")
    assert r.status_code == 200 and 'id="ov-jobs-history-down"' in r.text
    assert "connection refused" not in r.text  # the driver's words in the log only (a review)
    assert count(r.text, "QUEUED") == 1 and count(r.text, "SUCCEEDED") == 0 and queued.id in m.state.jobs

    # A database that answers with a refusal (a permission taken away): the same, not a
    # 500 on the landing page (a review).
    def refused(*_a: object, **_k: object) -> None:
        raise ProgrammingError("SELECT", None, Exception("permission denied for table jobs"))

    monkeypatch.setattr(m.history, "count_by_state", refused)
    hosts_module._ENDED_COUNTS.clear()
    r = await c.get("/")
    assert r.status_code == 200 and 'id="ov-jobs-history-down"' in r.text
