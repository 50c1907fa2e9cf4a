"""The message broker as Muster runs it: the embedded nats-server (one node or a local
cluster, `natsd`) and its credentials (`natsauth`: one nkey user per party, with
per-party permissions)."""
