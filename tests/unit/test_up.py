"""`muster up`'s agents: simulated GPUs for as many as asked, one agent for real ones."""

from __future__ import annotations

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
