"""The 3-node NATS JetStream cluster of `muster bench --nats-cluster 3`, rendered in code.

The settings of the configs shipped in nats/cluster/n*.conf (and of what `muster nats
--cluster` writes, `server.broker.natsd.start_cluster`): server names n1, n2, n3, one
cluster named `muster`, each node routing to the other two, a monitoring port, and a
JetStream store of its own with `sync_interval: always` (unless --nats-sync default).
Everything on loopback, on free ports, the configs and stores under the run's work
directory. The files are written by `server.broker.natsd.render_config`, so an
installed package, which has no nats/ directory, runs a cluster as well as a checkout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from server.broker.natsd import free_port, render_config

CLUSTER_NAME = "muster"


@dataclass(frozen=True)
class ClusterNode:
    name: str  # n1, n2, ...
    config: Path  # the nats-server config file (`nats-server -c`)
    port: int  # client port
    http_port: int  # monitoring port (/healthz)
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"


def write_cluster_configs(work: Path, *, sync_always: bool, size: int = 3,
                          host: str = "127.0.0.1") -> list[ClusterNode]:
    """Write `work/n1.conf` ... for a `size`-node cluster, its stores in `work/nats/n1` ...;
    the nodes are started with `nats-server -c <config>` (from any directory)."""
    work = work.resolve()
    ports = [(free_port(), free_port(), free_port()) for _ in range(size)]  # client, route, monitoring
    nodes: list[ClusterNode] = []
    for i, (client, route, http) in enumerate(ports, start=1):
        name = f"n{i}"
        store = work / "nats" / name
        store.mkdir(parents=True, exist_ok=True)
        conf = work / f"{name}.conf"
        routes = [f"nats-route://{host}:{r}" for j, (_, r, _) in enumerate(ports, start=1) if j != i]
        conf.write_text(render_config(store_dir=store, host=host, port=client, conf_dir=work, server_name=name,
                                      cluster_name=CLUSTER_NAME, cluster_port=route, routes=routes,
                                      http_port=http, sync_always=sync_always))
        nodes.append(ClusterNode(name, conf, client, http, host))
    return nodes
