"""Static checks of the deployment files (compose.yaml, Dockerfile, .dockerignore, NATS
configs), read with PyYAML and regular expressions: services, health checks, volumes,
secrets, the NATS credentials wiring (each party mounts only its own seed; each agent
reports the host id its seed was issued for), the image. What runs the files for real
(the Compose schema, `nats-server -t`, a loopback cluster) is in
tests/integration/test_compose.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

yaml = pytest.importorskip("yaml")

COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
NATS_DEV_CONF = ROOT / "nats" / "nats.conf"
NATS_CLUSTER_CONFS = [ROOT / "nats" / "cluster" / f"n{i}.conf" for i in (1, 2, 3)]
NATS_COMPOSE_CONF = ROOT / "nats" / "compose" / "nats-cluster.conf"

NATS_SERVICES = ("nats1", "nats2", "nats3")
NATS_MONITOR_PORT = 8222
JS_HEALTH_PATH = "/healthz?js-enabled-only=true"


# --------------------------------------------------------------------------
# helpers


@pytest.fixture(scope="module")
def compose() -> dict:
    with COMPOSE.open() as fh:
        doc = yaml.safe_load(fh)  # SafeLoader resolves `<<` merge keys
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def services(compose) -> dict:
    svcs = compose.get("services")
    assert isinstance(svcs, dict) and svcs, "compose.yaml has no services"
    return svcs


def _depends_on(svc: dict) -> dict[str, dict]:
    dep = svc.get("depends_on") or {}
    if isinstance(dep, list):  # short syntax: no condition
        return {name: {"condition": "service_started"} for name in dep}
    return {name: (spec or {}) for name, spec in dep.items()}


def _is_named_volume(source: str) -> bool:
    return not (source.startswith(("/", ".", "~", "$")) or "/" in source)


def _named_volumes(svc: dict) -> list[str]:
    names = []
    for vol in svc.get("volumes") or []:
        if isinstance(vol, str):
            parts = vol.split(":")
            if len(parts) >= 2 and _is_named_volume(parts[0]):
                names.append(parts[0])
        elif isinstance(vol, dict):
            if vol.get("type", "volume") == "volume" and vol.get("source"):
                names.append(vol["source"])
    return names


def _secret_names(svc: dict) -> list[str]:
    out = []
    for sec in svc.get("secrets") or []:
        out.append(sec if isinstance(sec, str) else sec["source"])
    return out


def _config_names(svc: dict) -> list[str]:
    out = []
    for cfg in svc.get("configs") or []:
        out.append(cfg if isinstance(cfg, str) else cfg["source"])
    return out


def _published_container_ports(svc: dict) -> set[int]:
    """Container-side ports of every `ports:` entry (short or long syntax)."""
    result: set[int] = set()
    for entry in svc.get("ports") or []:
        if isinstance(entry, dict):
            target = str(entry.get("target"))
        else:
            spec = str(entry).split("/")[0]  # drop /tcp
            target = spec.rsplit(":", 1)[-1]
        if "-" in target:
            lo, hi = target.split("-", 1)
            result.update(range(int(lo), int(hi) + 1))
        else:
            result.add(int(target))
    return result


def _healthcheck_text(svc: dict) -> str:
    test = (svc.get("healthcheck") or {}).get("test")
    if isinstance(test, list):
        return " ".join(str(t) for t in test)
    return str(test or "")


def _server_services(services: dict) -> dict:
    return {
        name: svc
        for name, svc in services.items()
        if re.search(r"\bmuster server\b", " ".join(map(str, _command(svc))))
        and name not in NATS_SERVICES
        and name != "postgres"
    }


def _command(svc: dict) -> list:
    cmd = svc.get("command") or []
    return cmd if isinstance(cmd, list) else [cmd]


# --------------------------------------------------------------------------
# compose.yaml: consistency


def test_expected_services_exist(services):
    for name in (*NATS_SERVICES, "postgres", "agent", "agent-cpu"):
        assert name in services, f"missing service {name}"
    servers = _server_services(services)
    replicas = sum(
        int(((svc.get("deploy") or {}).get("replicas")) or 1) for svc in servers.values()
    )
    assert replicas >= 2, f"need >= 2 control-plane replicas, have {sorted(servers)}"


def test_depends_on_targets_exist_and_wait_for_health(services):
    for name, svc in services.items():
        for dep, spec in _depends_on(svc).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if dep in NATS_SERVICES or dep == "postgres":
                assert spec.get("condition") == "service_healthy", (
                    f"{name} -> {dep} must use condition: service_healthy"
                )
            if spec.get("condition") == "service_healthy":
                assert services[dep].get("healthcheck"), (
                    f"{name} waits for {dep} to be healthy but {dep} has no healthcheck"
                )


def test_servers_and_agents_wait_for_their_backends(services):
    for name, svc in _server_services(services).items():
        deps = _depends_on(svc)
        for dep in (*NATS_SERVICES, "postgres"):
            assert dep in deps, f"{name} must depend on {dep}"
    for name in ("agent", "agent-cpu"):
        deps = _depends_on(services[name])
        for dep in NATS_SERVICES:
            assert dep in deps, f"{name} must depend on {dep}"


def test_required_healthchecks(services):
    required = [*NATS_SERVICES, "postgres", *_server_services(services)]
    for name in required:
        hc = services[name].get("healthcheck") or {}
        assert hc.get("test") and not hc.get("disable"), f"{name} needs a healthcheck"


def test_named_volumes_declared(compose, services):
    declared = set((compose.get("volumes") or {}).keys())
    for name, svc in services.items():
        for vol in _named_volumes(svc):
            assert vol in declared, f"{name} uses undeclared volume {vol}"


def test_stateful_services_use_named_volumes(services):
    for name in (*NATS_SERVICES, "postgres"):
        assert _named_volumes(services[name]), f"{name} must keep its data in a named volume"
    nats_vols = [tuple(_named_volumes(services[n])) for n in NATS_SERVICES]
    assert len(set(nats_vols)) == len(NATS_SERVICES), "each NATS node needs its own volume"


def test_secrets_declared_and_file_based(compose, services):
    declared = compose.get("secrets") or {}
    used = set()
    for name, svc in services.items():
        for sec in _secret_names(svc):
            assert sec in declared, f"{name} uses undeclared secret {sec}"
            used.add(sec)
    assert used, "no service uses a secret"
    for sec, spec in declared.items():
        assert "file" in spec, f"secret {sec} must come from a file"
        assert str(spec["file"]).startswith("./secrets/"), f"secret {sec} must live in ./secrets/"


def test_configs_declared_and_present(compose, services):
    declared = compose.get("configs") or {}
    for name, svc in services.items():
        for cfg in _config_names(svc):
            assert cfg in declared, f"{name} uses undeclared config {cfg}"
            path = declared[cfg].get("file")
            if path:
                assert (ROOT / path).is_file(), f"config {cfg}: {path} does not exist"


def test_no_credentials_in_environment(services):
    secretish = re.compile(r"(PASSWORD|TOKEN|SECRET|DB_URL)$")
    for name, svc in services.items():
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
        for key, value in env.items():
            if secretish.search(key) and not key.endswith("_FILE"):
                pytest.fail(f"{name}: {key} set in environment; use a secret file instead")
            if value is not None:
                assert not re.search(r"://[^/\s:@]+:[^@\s$]+@", str(value)), (
                    f"{name}: {key} contains inline credentials"
                )


def test_postgres_password_from_secret(services):
    pg = services["postgres"]
    assert str(pg["image"]).startswith("postgres:16")
    env = pg.get("environment") or {}
    assert "POSTGRES_PASSWORD" not in env
    pw_file = env.get("POSTGRES_PASSWORD_FILE", "")
    assert pw_file.startswith("/run/secrets/"), pw_file
    assert pw_file.rsplit("/", 1)[-1] in _secret_names(pg)
    assert "pg_isready" in _healthcheck_text(pg)


def test_nats_services(services):
    for name in NATS_SERVICES:
        svc = services[name]
        image = str(svc["image"])
        m = re.fullmatch(r"nats:(\d+)\.(\d+)[\w.\-]*", image)
        assert m, f"{name}: unexpected image {image}"
        assert (int(m.group(1)), int(m.group(2))) >= (2, 11), f"{name}: need nats 2.11+"
        hc = _healthcheck_text(svc)
        assert "wget" in hc and f":{NATS_MONITOR_PORT}{JS_HEALTH_PATH}" in hc, hc
        cmd = " ".join(map(str, _command(svc)))
        assert re.search(r"(-c|--config)\s+\S+", cmd), f"{name}: command must pass the config"
        env = svc.get("environment") or {}
        assert env.get("SERVER_NAME") == name


def test_nats_monitoring_port_not_published(services):
    for name, svc in services.items():
        assert NATS_MONITOR_PORT not in _published_container_ports(svc), (
            f"{name} publishes the NATS monitoring port {NATS_MONITOR_PORT}"
        )


def test_servers_publish_http(services):
    for name, svc in _server_services(services).items():
        assert 8080 in _published_container_ports(svc), f"{name} must publish container port 8080"
        hc = _healthcheck_text(svc)
        assert "8080" in hc and ("/readyz" in hc or "/livez" in hc), hc
        assert {"muster_token", "postgres_password"} <= set(_secret_names(svc))


def test_agent_has_nvidia_reservation(services):
    devices = services["agent"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        d.get("driver") == "nvidia" and d.get("count") == "all" and "gpu" in d.get("capabilities", [])
        for d in devices
    ), devices


def test_agent_cpu_simulates_gpus(services):
    svc = services["agent-cpu"]
    assert svc.get("profiles") == ["cpu"]
    cmd = list(map(str, _command(svc)))
    assert cmd[0] == "agent"
    assert "--simulate-gpus" in cmd and cmd[cmd.index("--simulate-gpus") + 1] == "8xH100"
    assert "deploy" not in svc or "devices" not in str(svc["deploy"]), "cpu agent must not reserve GPUs"


def test_secrets_dir_not_shipped():
    lines = {
        ln.strip().rstrip("/")
        for ln in DOCKERIGNORE.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    for entry in (".git", ".venv", ".muster", "secrets"):
        assert entry in lines, f".dockerignore must exclude {entry}"
    for needed in ("pyproject.toml", "README.md", "server", "agent", "web", "bench"):
        assert needed not in lines, f".dockerignore must not exclude {needed}"


def test_dockerfile():
    text = DOCKERFILE.read_text()
    instr = [
        ln.strip()
        for ln in re.sub(r"\\\n", " ", text).splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    froms = [ln for ln in instr if ln.upper().startswith("FROM ")]
    assert froms and froms[-1].split()[1].startswith("python:3.11-slim"), froms
    users = [ln.split()[1] for ln in instr if ln.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0", "0:0"), "image must run as non-root"
    assert any("pip install" in ln and "--no-cache-dir" in ln for ln in instr)
    entry = [ln for ln in instr if ln.upper().startswith("ENTRYPOINT")]
    assert entry and json.loads(entry[-1].split(None, 1)[1]) == ["muster"], entry
    assert not re.search(r"^\s*(ENV|ARG)\s+\S*(TOKEN|PASSWORD|DB_URL)", text, re.M | re.I), (
        "no credentials baked into the image"
    )


def test_compose_wires_nats_credentials(compose, services):
    auth = services["nats-auth"]
    assert auth.get("restart") == "no"
    script = " ".join(map(str, _command(auth)))
    assert "muster creds issue-agent" in script
    mounts = {v.split(":")[1]: v.split(":")[0] for v in auth["volumes"]}
    for name in NATS_SERVICES:
        svc = services[name]
        assert _depends_on(svc)["nats-auth"]["condition"] == "service_completed_successfully"
        vols = [v for v in svc["volumes"] if v.endswith(":/etc/nats/auth:ro")]
        assert vols and vols[0].split(":")[0] == mounts["/auth/nats"], f"{name} must mount the auth conf"
    # Each party gets only its own seeds: servers the control plane's, agents theirs.
    for name in _server_services(services):
        svc = services[name]
        assert svc["environment"]["MUSTER_NATS_CREDS"] == "/run/nats-creds/server.nk"
        assert f"{mounts['/auth/server']}:/run/nats-creds:ro" in svc["volumes"]
        assert not {mounts["/auth/agent"], mounts["/auth/agent-cpu"]} & set(_named_volumes(svc))
    for name, target, host_var in (("agent", "/auth/agent", "MUSTER_HOST_ID"),
                                   ("agent-cpu", "/auth/agent-cpu", "MUSTER_SIM_HOST_ID")):
        svc = services[name]
        creds = svc["environment"]["MUSTER_NATS_CREDS"]
        assert creds.startswith("/run/nats-creds/") and creds.endswith(".nk")
        # Its own volume, into which nats-auth installs its host's seed and no other.
        assert f"{mounts[target]}:/run/nats-creds:ro" in svc["volumes"]
        others = {v for t, v in mounts.items() if t != target and t != "/auth/nats"}
        assert not others & set(_named_volumes(svc)), (name, svc["volumes"])
        installs = re.findall(rf'install [^;]*"{target}/([^"]+)"', script.replace("\\\n", " "))
        assert installs == [f"$${host_var}.nk"], (name, installs)
    assert mounts["/auth/agent"] != mounts["/auth/agent-cpu"]
    # The agents' host ids are the ones nats-auth issues credentials for: the same
    # variables with the same defaults, so that the two cannot drift apart.
    env = auth["environment"]
    agent_env, sim_env = services["agent"]["environment"], services["agent-cpu"]["environment"]
    assert env["MUSTER_HOST_ID"] == agent_env["MUSTER_HOST_ID"] == "${MUSTER_HOST_ID:-gpu-host-1}"
    assert env["MUSTER_SIM_HOST_ID"] == sim_env["MUSTER_HOST_ID"] == "${MUSTER_SIM_HOST_ID:-sim-host-1}"
    assert "for h in $$MUSTER_HOST_ID $$MUSTER_SIM_HOST_ID $$MUSTER_AGENT_HOSTS; do" in script


def test_the_tasks_network_reaches_nats_only(compose, services):
    """Agents (and the tasks they run) share a network with NATS and nothing else of the
    control plane; the NATS monitoring port listens on each container's loopback."""
    for name in ("agent", "agent-cpu"):
        assert services[name]["networks"] == ["hosts"], name
        assert services[name]["user"] == "0:0"  # so that tasks run as another user
    on_hosts = {n for n, svc in services.items() if "hosts" in (svc.get("networks") or [])}
    assert on_hosts == {*NATS_SERVICES, "agent", "agent-cpu"}, on_hosts
    for name in ("postgres", *_server_services(services)):
        assert services[name]["networks"] == ["control"], name
    assert services["nats-auth"]["network_mode"] == "none"
    assert set(compose["networks"]) == {"control", "hosts"}
    assert re.search(r'^http:\s*"127\.0\.0\.1:8222"', NATS_COMPOSE_CONF.read_text(), re.M)


def test_nats_routes_authenticate(services):
    text = NATS_COMPOSE_CONF.read_text()
    cluster = text[text.index("cluster {"):]
    assert re.search(r"authorization\s*\{\s*user:\s*muster-route\s+password:\s*\$NATS_ROUTE_PASSWORD", cluster)
    assert [f"$NATS_ROUTE_{i}" for i in (1, 2, 3)] == re.findall(r"\$NATS_ROUTE_\d", cluster)
    for name in NATS_SERVICES:
        svc = services[name]
        assert "nats_route_password" in _secret_names(svc)
        script = " ".join(map(str, _command(svc)))
        assert 'NATS_ROUTE_PASSWORD="$$(cat /run/secrets/nats_route_password)"' in script
        assert "nats-route://muster-route:$$NATS_ROUTE_PASSWORD@nats$$i:6222" in script


def test_servers_run_in_production_mode(services):
    for name, svc in _server_services(services).items():
        assert svc["environment"]["MUSTER_ENV"] == "production", name


def _interpolate(value: str | None, env: dict[str, str]) -> str | None:
    """Compose's interpolation of a value, in the forms compose.yaml uses: `${VAR:-default}`
    (the default when VAR is unset or empty), `${VAR}` and `$VAR`, and `$$` for a `$`
    left to the container's shell. A key without a value (None) passes VAR through from
    the environment."""
    if value is None:
        return None

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(3)
        if m.group(2) is not None:
            return env.get(name) or m.group(2)
        return env.get(name, "")

    return re.sub(r"\$\$|\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", one, str(value))


@pytest.mark.parametrize("shell, expected", [
    ({}, {"agent": "gpu-host-1", "agent-cpu": "sim-host-1"}),
    ({"MUSTER_HOST_ID": "dgx-07", "MUSTER_SIM_HOST_ID": "sim-07", "MUSTER_AGENT_HOSTS": "dgx-08 dgx-09"},
     {"agent": "dgx-07", "agent-cpu": "sim-07"}),
], ids=["defaults", "set-in-the-shell"])
def test_each_agent_reports_the_host_id_its_credentials_were_issued_for(
        services, shell: dict[str, str], expected: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """Each agent service, started the way compose starts it (the image's `muster`
    entrypoint with the service's command and environment, interpolated as compose
    does), runs an agent whose host id, heartbeat and heartbeat subject are exactly
    the host id compose sets for it, and one nats-auth issued a seed for, read from the
    file nats-auth installed for that host. The agent is built in-process; it does
    not run (nothing connects)."""
    import agent.agent as agent_mod
    import agent.cli as agent_cli
    from wire import subjects

    auth_env = {k: _interpolate(v, shell) for k, v in services["nats-auth"]["environment"].items()}
    issued = " ".join(auth_env[k] or "" for k in ("MUSTER_HOST_ID", "MUSTER_SIM_HOST_ID", "MUSTER_AGENT_HOSTS"))
    issued_for = set(issued.split())  # the nats-auth loop: `for h in $MUSTER_HOST_ID $MUSTER_SIM_HOST_ID ...`

    real_agent = agent_mod.Agent
    configs: list[agent_mod.AgentConfig] = []

    class Recorder:
        """Stands in for the agent `agent.cli.run` starts: keeps its configuration."""

        def __init__(self, config: agent_mod.AgentConfig) -> None:
            configs.append(config)

        async def run(self, stop: object) -> None:
            return None

    monkeypatch.setattr(agent_mod, "Agent", Recorder)
    monkeypatch.setattr(agent_cli, "setup_logging", lambda **_: None)
    for name, host_id in expected.items():
        svc = services[name]
        command = [str(c) for c in _command(svc)]
        assert command[0] == "agent"  # `muster agent ...`: the image's entrypoint is `muster`
        for key in [k for k in os.environ if k.startswith("MUSTER_")]:
            monkeypatch.delenv(key)
        for key, value in (svc.get("environment") or {}).items():
            resolved = _interpolate(value, shell)
            if resolved is None:  # `KEY:` without a value: passed through from the shell
                resolved = shell.get(key)
            if resolved is not None:
                monkeypatch.setenv(key, resolved)
        agent_cli.run(agent_cli.build_parser("muster agent").parse_args(command[1:]))
        (cfg,) = configs
        configs.clear()
        assert cfg.host_id == host_id, name
        assert cfg.host_id in issued_for, (name, issued_for)
        # nats-auth installs /auth/agents/<host>.nk into the volume agents mount at /run/nats-creds.
        assert cfg.nats_creds == f"/run/nats-creds/{host_id}.nk", name
        assert f"nats-creds-{name}:/run/nats-creds:ro" in svc["volumes"], name
        # What that agent reports: its heartbeat, published on its host's key of the hosts bucket.
        agent = real_agent(dataclasses.replace(cfg, state_dir=tmp_path / name, cgroups="off",
                                               run_as=pwd.getpwuid(os.geteuid()).pw_name))
        try:
            assert agent.heartbeat().host_id == host_id, name
            assert subjects.kv_subject(subjects.HOSTS_BUCKET, agent.config.host_id) == f"$KV.hosts.{host_id}"
        finally:
            agent.gpus.close()
            agent.isolation.close()


# --------------------------------------------------------------------------
# NATS configs: the loopback cluster's layout (run for real in tests/integration/test_compose.py)


def test_cluster_configs_layout():
    for i, conf in enumerate(NATS_CLUSTER_CONFS, start=1):
        text = conf.read_text()
        assert re.search(rf"server_name:\s*n{i}\b", text)
        assert re.search(r"name:\s*muster\b", text)
        assert f"127.0.0.1:{4221 + i}" in text  # client
        assert f"127.0.0.1:{6221 + i}" in text  # cluster
        others = {6222, 6223, 6224} - {6221 + i}
        for port in others:
            assert f"nats-route://127.0.0.1:{port}" in text
        m = re.search(r'store_dir:\s*"?([^"\s]+)', text)
        assert m and not m.group(1).startswith("/"), "store_dir must be relative"
