"""The operator console, end to end: a real nats-server (fixture `nats_url` from
conftest), a real in-process Muster, the Starlette app driven through httpx."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from server import subjects
from server.app import build_app
from server.messages import GpuInfo, GpuUsage, Heartbeat, JobState, encode
from server.runtime import Muster, ServerConfig
from web.console import COOKIE, csrf_token

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
        return hashlib.sha256(self.token.encode()).hexdigest()

    @property
    def csrf(self) -> str:
        return csrf_token(self.session)

    async def login(self) -> None:
        r = await self.client.post("/login", data={"token": self.token})
        assert r.status_code == 303, r.text


@pytest.fixture
async def console(nats_url: str, tmp_path: Path) -> AsyncIterator[Console]:
    muster = Muster(ServerConfig(nats_url=nats_url, data_dir=tmp_path, http_port=0))
    await muster.start()
    try:
        assert muster.new_token, "a fresh cluster must create the operator token"
        app = build_app(muster, manage_lifecycle=False)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            yield Console(muster, app, client, muster.new_token)
    finally:
        await muster.shutdown()


async def eventually(pred, timeout: float = 10.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def put_heartbeat(m: Muster, host_id: str, *, simulated: bool = True, gpus: int = 2) -> None:
    hb = Heartbeat(
        host_id=host_id, boot_id="boot-1", ts=time.time(), labels={"rack": "r1"},
        gpus=[GpuInfo(index=i, model="H100", memory_mb=81920) for i in range(gpus)],
        gpu_usage=[GpuUsage(index=i, util_pct=40.0) for i in range(gpus)],
        cpus=32, memory_mb=256 * 1024, cpu_pct=12.5, mem_used_mb=4096, simulated=simulated,
    )
    assert m.store is not None
    await m.store.put(host_id, encode(hb), bucket=subjects.HOSTS_BUCKET)


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
    assert console.token not in cookie
    low = cookie.lower()
    assert "httponly" in low and "samesite=strict" in low and "path=/" in low
    assert "secure" not in low  # plain http here
    assert (await c.get("/")).status_code == 200

    # Over https the cookie is Secure.
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.app), base_url="https://test") as tls:
        r = await tls.post("/login", data={"token": console.token})
        assert r.status_code == 303
        assert "secure" in r.headers["set-cookie"].lower()


async def test_logged_out_user_is_redirected(console: Console) -> None:
    c = console.client
    for path in ("/", "/hosts", "/jobs", "/submit", "/jobs/j123", "/hosts/h1"):
        r = await c.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"] == "/login"
        assert_security_headers(r)
    r = await c.get("/hosts", headers={"HX-Request": "true"})
    assert r.status_code == 401
    assert r.headers["hx-redirect"] == "/login"
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
    console.muster.state.tokens.pop(console.session)
    r = await c.get("/")
    assert r.status_code == 303 and r.headers["location"] == "/login"


async def test_logout(console: Console) -> None:
    c = console.client
    await console.login()
    r = await c.post("/logout", data={})
    assert r.status_code == 403
    r = await c.post("/logout", data={"csrf": console.csrf})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert COOKIE in r.headers["set-cookie"]
    assert (await c.get("/")).status_code == 303


# ---------------------------------------------------------------- pages


async def test_pages_render_with_security_headers(console: Console) -> None:
    c = console.client
    assert_security_headers(await c.get("/login"))
    await console.login()

    r = await c.get("/")
    assert r.status_code == 200
    assert_security_headers(r)
    assert "Leader term" in r.text and console.muster.role in r.text
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
        job, errors = await m.submit({"name": f"batch-{i:02d}", "command": ["true"], "gpus": 64}, "operator")
        assert job is not None and not errors
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
    from server.cluster import TokenInfo

    c = console.client
    m = console.muster
    viewer = "mst_viewer-token"
    h = hashlib.sha256(viewer.encode()).hexdigest()
    m.state.tokens[h] = TokenInfo(name="alice", role="viewer")
    r = await c.post("/login", data={"token": viewer})
    assert r.status_code == 303
    r = await c.get("/")
    assert r.status_code == 200 and "alice" in r.text
    r = await c.post("/submit", data={"csrf": csrf_token(h), "name": "x", "command": "true"})
    assert r.status_code == 403
    assert m.state.jobs == {}
