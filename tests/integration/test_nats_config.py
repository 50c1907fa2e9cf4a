"""`muster nats --config FILE` runs nats-server with the operator's own config as it is,
and the development config the repository ships (`nats/nats.conf`) is one nats-server
takes."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from pathlib import Path

from server.broker.natsd import free_port, nats_server_binary, wait_for_port
from tests.conftest import ROOT
from wire.kv import connect


def test_the_shipped_development_config_is_valid() -> None:
    r = subprocess.run([nats_server_binary(), "-c", str(ROOT / "nats" / "nats.conf"), "-t"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and "is valid" in r.stdout + r.stderr, r.stdout + r.stderr


def test_muster_nats_runs_a_given_config_as_it_is(tmp_path: Path) -> None:
    """The shipped file on a free port and a store of the test's own: `muster nats --config`
    adds nothing (a store directory given beside the file's was refused by nats-server as a
    duplicate, so the documented command did not start), and JetStream answers."""
    port = free_port()
    text = (ROOT / "nats" / "nats.conf").read_text()
    text = re.sub(r'listen: "127\.0\.0\.1:4222"', f'listen: "127.0.0.1:{port}"', text)
    text = re.sub(r'http: "127\.0\.0\.1:8222"', f'http: "127.0.0.1:{free_port()}"', text)
    text = re.sub(r'store_dir: "[^"]*"', f'store_dir: "{tmp_path / "store"}"', text)
    conf = tmp_path / "nats.conf"
    conf.write_text(text)
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "nats", "--config", str(conf)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(port, timeout=30)

        async def main() -> bytes:
            nc = await connect(f"nats://127.0.0.1:{port}", "test")
            try:
                kv = await nc.jetstream().create_key_value(bucket="check")
                await kv.put("k", b"stored")
                return (await kv.get("k")).value or b""
            finally:
                await nc.close()

        assert asyncio.run(main()) == b"stored"
        assert (tmp_path / "store" / "jetstream").is_dir()  # the file's store, not --data-dir's
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_given_config_is_not_mixed_with_a_cluster_or_tls() -> None:
    r = subprocess.run([sys.executable, "-m", "server.cli", "nats", "--config", "x.conf", "--cluster", "3"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 1 and "--config runs your own nats-server config as it is" in r.stderr, r.stderr


def test_a_single_node_serves_monitoring_on_the_port_given(tmp_path: Path) -> None:
    """`muster nats --http-port H` (no --cluster): /healthz answers there, as the health
    checks in deployment.md use it (the flag was taken and ignored for a single node)."""
    import httpx

    port, http = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "nats", "--port", str(port), "--http-port", str(http),
                             "--data-dir", str(tmp_path / "nats")], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(http, timeout=30)
        r = httpx.get(f"http://127.0.0.1:{http}/healthz", timeout=10)
        assert r.status_code == 200 and "ok" in r.text, r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
