"""`muster up`'s agents: simulated GPUs for as many as asked, one agent for real ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.cli.up import plan_agents


def test_without_a_driver_two_agents_get_simulated_gpus_by_default() -> None:
    assert plan_agents(None, None, nvidia=False) == ["8xH100", "8xH100"]
    assert plan_agents(3, None, nvidia=False) == ["8xH100"] * 3
    assert plan_agents(0, None, nvidia=False) == []


def test_a_simulated_spec_applies_to_every_agent_even_with_a_driver() -> None:
    assert plan_agents(None, "2xA10", nvidia=True) == ["2xA10", "2xA10"]
    assert plan_agents(4, "1xH200", nvidia=True) == ["1xH200"] * 4


def test_real_gpus_back_one_agent_only() -> None:
    assert plan_agents(None, None, nvidia=True) == [None]
    assert plan_agents(1, None, nvidia=True) == [None]
    with pytest.raises(ValueError, match="one agent only"):
        plan_agents(2, None, nvidia=True)
    with pytest.raises(ValueError, match="0 or more"):
        plan_agents(-1, None, nvidia=False)
    # A bad spec is refused before anything starts (found by hand: `--simulate-gpus 4`
    # started NATS and the server, then each agent exited with the error).
    with pytest.raises(ValueError, match="expected COUNTxMODEL"):
        plan_agents(None, "4", nvidia=False)


def test_up_refuses_a_port_another_process_listens_on(tmp_path: Path) -> None:
    """Found by exploring: with its NATS port in use, `muster up` said it was up, its own
    nats-server dead, and its server joined the other NATS."""
    import socket
    import subprocess
    import sys

    from server.cli.up import port_free

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert not port_free(port)
        r = subprocess.run([sys.executable, "-m", "server.cli", "up", "--data-dir", str(tmp_path / "d"),
                            "--nats-port", str(port), "--http-port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and f"port {port} is in use" in r.stderr, (r.returncode, r.stdout, r.stderr)
    assert port_free(port)
