"""NATS authentication for Muster: one nkey user per party, with per-party permissions.

Everything lives in an *auth directory* (mode 0700), by default `<nats-data-dir>/auth`:

    users.json            who has credentials: kind, name, public nkey (no secrets)
    auth.conf             the nats-server `accounts {}` block, generated from users.json
    server.nk             the control plane's nkey seed (servers, `muster token`)
    agents/<host>.nk      one seed per agent host
    subscribers/<n>.nk    one seed per alert subscriber
    submitters/<u>.nk     one seed per batch client submitting as user <u>
    pids/*.pid            pid files of the nats-servers using this directory (for reloads)

The directory, and each one under it, is taken only as this user's own (wire.owndir: made
by this user, no other user able to write to it or to what leads to it), and files are
written through a fresh temporary file that no link can redirect: found by exploring, an
auth directory another user made first, with a link `server.nk.tmp` to a file of theirs,
took the control plane's seed into that file.

Seed files (mode 0600) are what `--creds FILE` / MUSTER_NATS_CREDS point at; nats-py
signs the server's nonce with them (`nkeys_seed`). The nats-server config includes
`auth.conf`; issuing or revoking a credential rewrites it and signals every server in
`pids/` to reload (SIGHUP). On reload nats-server drops connections of removed users and
refuses them from then on.

Accounts (CONTROL_ACCOUNT and the others, below): the server and subscribers are in the
control plane's account, which holds the streams; agents and submitters in accounts of
their own, which import from it the subjects they publish on.

Permissions:
- server: everything (control-plane replicas and the admin CLI).
- agent <host>: publish its heartbeat `$KV.hosts.<host>`, its status reports
  `muster.status.<host>` and the direct get of its own `alloc.<host>` record and of its
  own heartbeat key (to recognise a heartbeat whose acknowledgement was lost); subscribe
  to its assignments `muster.assign.<host>`, to `muster.output.<host>` (an API replica
  asking for a running attempt's output; one answer per request is allowed) and to its
  own inbox `_INBOX_<host>.>` (where JetStream acks and direct-get replies come). Nothing
  else.
- subscriber: subscribe to `alerts.>` and `muster.events.>`; publish nothing.
- submitter <user>: publish submissions on `muster.submit.<user>` and
  `muster.submit.<user>.<queue>` only (its jobs are `<user>`'s: the leader takes the user
  from the subject, and the queue when it names one), or, bound to queues, on
  `muster.submit.<user>.<queue>` of those queues only; and subscribe to its own inbox
  `_SUBMIT_INBOX_<user>.>` (where JetStream acknowledges them). Nothing else.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from wire import subjects
from wire.errors import ConfigError
from wire.owndir import own_dir

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
KINDS = ("server", "agent", "subscriber", "submitter")


def agent_permissions(host_id: str) -> dict[str, Any]:
    return {
        "publish": {
            "allow": [
                subjects.kv_subject(subjects.HOSTS_BUCKET, host_id),
                subjects.status_subject(host_id),
                f"$JS.API.DIRECT.GET.{subjects.STATE_STREAM}."
                + subjects.kv_subject(subjects.STATE_BUCKET, subjects.alloc_key(host_id)),
                f"$JS.API.DIRECT.GET.{subjects.HOSTS_STREAM}."
                + subjects.kv_subject(subjects.HOSTS_BUCKET, host_id),
            ]
        },
        "subscribe": {
            "allow": [subjects.assign_subject(host_id), subjects.output_subject(host_id),
                      subjects.agent_inbox_prefix(host_id) + ".>"]
        },
        # One answer to each request it receives (its running attempts' output).
        "allow_responses": {"max": 1},
    }


def subscriber_permissions() -> dict[str, Any]:
    return {
        "publish": {"deny": [">"]},
        "subscribe": {"allow": [f"{subjects.ALERTS_PREFIX}.>", f"{subjects.EVENTS_PREFIX}.>"]},
    }


def submitter_permissions(user: str, queues: list[str] | None = None) -> dict[str, Any]:
    """A submitter's: bound to `queues`, it may submit to those queues only."""
    allow = ([subjects.submit_subject(user, q) for q in queues] if queues
             else [subjects.submit_subject(user), subjects.submit_subject(user, "*")])
    return {
        "publish": {"allow": allow},
        "subscribe": {"allow": [subjects.submitter_inbox_prefix(user) + ".>"]},
    }


# The NATS accounts: the control plane's holds every stream and bucket; agents and
# submitters are in accounts of their own, which reach only the subjects they publish on,
# imported from it as services. A publish into a stream is acknowledged on the reply
# subject its publisher chose, without that subject's permissions being checked: in one
# account, an agent or a submitter could have the acknowledgement of its own heartbeat
# written over any key (the leader's lease, another host's heartbeat or configuration).
# Across a service import the reply subject is the import's own, which the control plane
# routes back to the caller's account only.
CONTROL_ACCOUNT = "MUSTER"
AGENTS_ACCOUNT = "MUSTER_AGENTS"
SUBMITTERS_ACCOUNT = "MUSTER_SUBMITTERS"

# Every host's and submitter's subjects, by wildcard: each user's permissions (above)
# narrow them to its own.
_HOSTS = subjects.kv_subject(subjects.HOSTS_BUCKET, ">")
_STATUS = subjects.status_subject(">")
_ALLOC_GET = f"$JS.API.DIRECT.GET.{subjects.STATE_STREAM}." + subjects.kv_subject(
    subjects.STATE_BUCKET, subjects.alloc_key(">"))
_HEARTBEAT_GET = f"$JS.API.DIRECT.GET.{subjects.HOSTS_STREAM}." + _HOSTS
_ASSIGN = subjects.assign_subject(">")
_OUTPUT = subjects.output_subject(">")
_SUBMIT = subjects.SUBMIT_PREFIX + ".>"
_AGENT_SERVICES = (_HOSTS, _STATUS, _ALLOC_GET, _HEARTBEAT_GET)


def _imports(kind: str, account: str, subjects_: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{kind: {"account": account, "subject": s}} for s in subjects_]


ACCOUNT_LINKS: dict[str, dict[str, list[dict[str, Any]]]] = {
    CONTROL_ACCOUNT: {
        "exports": ([{"service": s, "accounts": [AGENTS_ACCOUNT]} for s in _AGENT_SERVICES]
                    + [{"stream": _ASSIGN, "accounts": [AGENTS_ACCOUNT]},
                       {"service": _SUBMIT, "accounts": [SUBMITTERS_ACCOUNT]}]),
        # An API replica asks an agent for a running attempt's output.
        "imports": _imports("service", AGENTS_ACCOUNT, (_OUTPUT,)),
    },
    AGENTS_ACCOUNT: {
        "imports": (_imports("service", CONTROL_ACCOUNT, _AGENT_SERVICES)
                    + _imports("stream", CONTROL_ACCOUNT, (_ASSIGN,))),
        "exports": [{"service": _OUTPUT, "accounts": [CONTROL_ACCOUNT]}],
    },
    SUBMITTERS_ACCOUNT: {"imports": _imports("service", CONTROL_ACCOUNT, (_SUBMIT,))},
}


def _check_name(name: str, what: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise ConfigError(f"invalid {what} {name!r}: use letters, digits, '_', '.', '-'")


def private_dir(path: Path, what: str = "NATS credentials directory") -> Path:
    """Make `path`, or take it, only as this user's alone (wire.owndir.own_dir, mode 0700);
    ConfigError saying what is wrong otherwise (another user made it, may write to it or
    to a directory on the way), before anything is read from or written into it."""
    try:
        return own_dir(path, what)
    except OSError as exc:
        raise ConfigError(str(exc)) from exc


def _write_private(path: Path, text: str) -> None:
    """Write `path` (mode 0600) in a directory of this user's alone, through `<path>.tmp`
    made afresh: one left there (a link to another file included) is removed first, and
    the new one is created exclusively, never through a link."""
    private_dir(path.parent)
    tmp = path.with_name(path.name + ".tmp")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)
    os.replace(tmp, path)


def new_user_seed() -> tuple[str, str]:
    """A fresh nkey user: (seed, public key)."""
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    kp = nkeys.from_seed(bytearray(seed))
    public = kp.public_key.decode()
    kp.wipe()
    return seed.decode(), public


def public_key_of(seed_file: str | Path) -> str:
    import nkeys

    kp = nkeys.from_seed(bytearray(Path(seed_file).read_bytes().strip()))
    public = kp.public_key.decode()
    kp.wipe()
    return public


class AuthDir:
    """The credentials of one NATS deployment (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # ------------------------------------------------------------ paths

    @property
    def users_file(self) -> Path:
        return self.path / "users.json"

    @property
    def conf_file(self) -> Path:
        return self.path / "auth.conf"

    @property
    def server_creds(self) -> Path:
        return self.path / "server.nk"

    @property
    def pids_dir(self) -> Path:
        return self.path / "pids"

    def agent_creds(self, host_id: str) -> Path:
        return self.path / "agents" / f"{host_id}.nk"

    def subscriber_creds(self, name: str) -> Path:
        return self.path / "subscribers" / f"{name}.nk"

    def submitter_creds(self, user: str) -> Path:
        return self.path / "submitters" / f"{user}.nk"

    def creds(self, kind: str, name: str) -> Path:
        return {"agent": self.agent_creds, "subscriber": self.subscriber_creds,
                "submitter": self.submitter_creds}[kind](name)

    def exists(self) -> bool:
        return self.users_file.exists()

    # ------------------------------------------------------------ registry

    def _load(self) -> dict[str, dict[str, Any]]:
        if not self.users_file.exists():
            return {}
        return dict(json.loads(self.users_file.read_text()))

    def _save(self, users: dict[str, dict[str, Any]]) -> None:
        _write_private(self.users_file, json.dumps(users, indent=2, sort_keys=True) + "\n")
        self.write_conf(users)

    def users(self) -> list[dict[str, Any]]:
        return sorted(self._load().values(), key=lambda u: (u["kind"], u["name"]))

    def ensure(self) -> bool:
        """Create the directory and the server credentials on first use. Returns True
        when it created them. ConfigError when the directory is not this user's alone."""
        private_dir(self.path)
        users = self._load()
        created = False
        if "server:server" not in users or not self.server_creds.exists():
            seed, public = new_user_seed()
            _write_private(self.server_creds, seed + "\n")
            users["server:server"] = {"kind": "server", "name": "server", "public": public,
                                      "created_at": time.time()}
            created = True
        if created or not self.conf_file.exists():
            self._save(users)
        return created

    def _issue(self, kind: str, name: str, path: Path, **fields: Any) -> Path:
        """Issue credentials, or keep the existing ones (their `fields`, such as a
        submitter's queues, set to these)."""
        self.ensure()
        users = self._load()
        key = f"{kind}:{name}"
        if key in users and path.exists() and public_key_of(path) == users[key]["public"]:
            if any(users[key].get(k) != v for k, v in fields.items()):
                users[key].update(fields)
                self._save(users)
            return path  # already issued: keep the existing credentials
        seed, public = new_user_seed()
        _write_private(path, seed + "\n")
        users[key] = {"kind": kind, "name": name, "public": public, "created_at": time.time(), **fields}
        self._save(users)
        return path

    def issue_agent(self, host_id: str) -> Path:
        _check_name(host_id, "host id")
        return self._issue("agent", host_id, self.agent_creds(host_id))

    def issue_subscriber(self, name: str) -> Path:
        _check_name(name, "subscriber name")
        return self._issue("subscriber", name, self.subscriber_creds(name))

    def issue_submitter(self, user: str, queues: list[str] | None = None) -> Path:
        """A batch client's credentials, submitting as `user`; bound to `queues` (none:
        any queue), as a team's API token is. Issued again, its queues become these."""
        if not subjects.SUBMITTER_RE.fullmatch(user):
            raise ConfigError(f"invalid submitter user {user!r}: 1-64 letters, digits, '_', '-'")
        bad = [q for q in queues or [] if not subjects.QUEUE_TOKEN_RE.fullmatch(q)]
        if bad:
            raise ConfigError(f"invalid queue name {bad[0]!r}: 1-63 lowercase letters, digits, '_', '-'")
        if queues is not None and not queues:
            raise ConfigError("give at least one queue (or none, for any queue)")
        return self._issue("submitter", user, self.submitter_creds(user),
                           queues=sorted(set(queues)) if queues else None)

    def revoke(self, kind: str, name: str) -> bool:
        """Remove a user (its connections are refused after the next reload).
        Returns False when there was no such user."""
        users = self._load()
        entry = users.pop(f"{kind}:{name}", None)
        if entry is None:
            return False
        self._save(users)
        path = self.creds(kind, name)
        if path.exists():
            path.unlink()
        return True

    def revoke_agent(self, host_id: str) -> bool:
        return self.revoke("agent", host_id)

    # ------------------------------------------------------------ server config

    def render(self, users: dict[str, dict[str, Any]] | None = None) -> str:
        users = self._load() if users is None else users
        parties: dict[str, list[str]] = {CONTROL_ACCOUNT: [], AGENTS_ACCOUNT: [], SUBMITTERS_ACCOUNT: []}
        for u in sorted(users.values(), key=lambda u: (u["kind"], u["name"])):
            e: dict[str, Any] = {"nkey": u["public"]}
            account = CONTROL_ACCOUNT
            if u["kind"] == "agent":
                e["permissions"] = agent_permissions(u["name"])
                account = AGENTS_ACCOUNT
            elif u["kind"] == "subscriber":
                e["permissions"] = subscriber_permissions()
            elif u["kind"] == "submitter":
                e["permissions"] = submitter_permissions(u["name"], u.get("queues"))
                account = SUBMITTERS_ACCOUNT
            parties[account].append(f"      # {u['kind']} {u['name']}\n      " + json.dumps(e))
        blocks = []
        for name, entries in parties.items():
            body = dict(ACCOUNT_LINKS[name])
            lines = [f"  {name}: {{"]
            if name == CONTROL_ACCOUNT:
                lines.append("    jetstream: enabled")
            lines.append("    users = [\n" + ",\n".join(entries) + ("\n" if entries else "") + "    ]")
            lines += [f"    {k} = {json.dumps(v)}" for k, v in body.items()]
            blocks.append("\n".join(lines) + "\n  }")
        return ("# Generated by muster (server/natsauth.py) from users.json: do not edit.\n"
                "accounts {\n" + "\n".join(blocks) + "\n}\n")

    def write_conf(self, users: dict[str, dict[str, Any]] | None = None) -> None:
        _write_private(self.conf_file, self.render(users))

    def pid_file(self, node: str = "nats") -> Path:
        private_dir(self.pids_dir)
        return self.pids_dir / f"{node}.pid"

    def reload_servers(self) -> list[int]:
        """SIGHUP every live nats-server using this directory. Returns their pids."""
        done: list[int] = []
        if not self.pids_dir.exists():
            return done
        for f in sorted(self.pids_dir.glob("*.pid")):
            try:
                pid = int(f.read_text().strip())
                cmdline = Path(f"/proc/{pid}/cmdline")
                if cmdline.parent.parent.exists() and (
                        not cmdline.exists() or b"nats-server" not in cmdline.read_bytes()):
                    f.unlink(missing_ok=True)  # stale: that pid is gone or reused
                    continue
                os.kill(pid, signal.SIGHUP)
                done.append(pid)
            except (ValueError, OSError):
                continue
        return done


def find_auth_dir(data_dir: str | Path) -> Path:
    """The auth directory for a data directory: `<d>/auth` (a `muster nats` data dir) or
    `<d>/nats/auth` (a `muster up` data dir), whichever exists; else `<d>/auth`."""
    d = Path(data_dir)
    for cand in (d / "auth", d / "nats" / "auth"):
        if (cand / "users.json").exists():
            return cand
    return d / "auth"
