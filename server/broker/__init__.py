"""The message broker as Muster runs it: the embedded nats-server (one node or a local
cluster, `natsd`) and its credentials (`natsauth`: one nkey user per party, with
per-party permissions).

May import: `wire` and the standard library (with `nkeys` for the credentials); it runs
nats-server as a child process and knows nothing of scheduling or the API."""
