"""`muster creds issue-agent|revoke-agent|issue-subscriber|revoke-subscriber|
issue-submitter|revoke-submitter|list`: the NATS credentials (nkeys) of agents, alert
subscribers and batch clients submitting over NATS, in the credentials directory; running
nats-servers are told to reload."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from server.cli.client import add_output, out
from wire.errors import ConfigError, NotFound

if TYPE_CHECKING:
    from server.broker.natsauth import AuthDir


def register(sub: argparse._SubParsersAction) -> None:
    cr = sub.add_parser("creds", help="issue and revoke NATS credentials of agents, subscribers and submitters")
    crsub = cr.add_subparsers(dest="creds_cmd", required=True)
    helps = {"issue-agent": "an agent's nkey for one host (it may use only that host's subjects)",
             "revoke-agent": "a host's agent may no longer connect",
             "issue-subscriber": "an nkey that may only read alerts and events",
             "revoke-subscriber": "a subscriber may no longer connect",
             "issue-submitter": "an nkey that may only submit jobs over NATS, as USER (muster.submit.USER), "
                                "to the --queues given if any",
             "revoke-submitter": "a submitter may no longer connect",
             "list": "the agents, subscribers and submitters with credentials"}
    for name, what in helps.items():
        c = crsub.add_parser(name, help=what)
        if name != "list":
            c.add_argument("name", metavar="HOST" if "agent" in name else "USER" if "submitter" in name else "NAME")
        c.add_argument("--data-dir", default=os.environ.get("MUSTER_DATA_DIR", ".muster"))
        c.add_argument("--auth-dir", default=None, help="credentials directory (default: found in --data-dir)")
        if name == "issue-submitter":
            c.add_argument("--queues", default=None, metavar="A,B",
                           help="the queues it may submit to (on muster.submit.USER.QUEUE), as a team's token is "
                                "bound (muster token create --queues); issued again, its queues become these")
        if name == "list":
            add_output(c)
            c.set_defaults(fn=cmd_list)
        elif name.startswith("issue-"):
            c.set_defaults(fn=cmd_issue)
        else:
            c.set_defaults(fn=cmd_revoke)


def _auth_dir(args: argparse.Namespace) -> AuthDir:
    """The credentials directory: `--auth-dir` as given (made on first use, as compose's
    nats-auth service makes its registry), or the one found in `--data-dir`, which must
    exist: one made there would hold credentials no nats-server knows (found by exploring:
    a wrong --data-dir made a new one, and the credential printed worked nowhere)."""
    from server.broker.natsauth import AuthDir, find_auth_dir, private_dir

    if args.auth_dir:
        auth = AuthDir(Path(args.auth_dir))
    else:
        auth = AuthDir(find_auth_dir(args.data_dir))
        if not auth.exists():
            raise ConfigError(f"no NATS credentials directory in {Path(args.data_dir).resolve()}: give the "
                              "--data-dir of `muster up` or `muster nats`, or --auth-dir")
    # Read or written only as this user's alone (another user's could hold links to its
    # own files, or a registry of its choosing).
    private_dir(auth.path)
    return auth


def cmd_issue(args: argparse.Namespace) -> int:
    auth = _auth_dir(args)
    if args.creds_cmd == "issue-agent":
        path = auth.issue_agent(args.name)
    elif args.creds_cmd == "issue-submitter":
        queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues is not None else None
        path = auth.issue_submitter(args.name, queues)
    else:
        path = auth.issue_subscriber(args.name)
    path = path.resolve()
    reloaded = auth.reload_servers()
    print(path)
    print(f"credentials for {args.name} in {path} (give the process MUSTER_NATS_CREDS={path});"
          f" {len(reloaded)} nats-server(s) reloaded", file=sys.stderr)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    auth = _auth_dir(args)
    kind = args.creds_cmd.removeprefix("revoke-")
    if not auth.revoke(kind, args.name):
        raise NotFound(f"no {kind} credentials for {args.name!r} in {auth.path}")
    reloaded = auth.reload_servers()
    print(f"revoked {kind} {args.name}; {len(reloaded)} nats-server(s) reloaded")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    users = _auth_dir(args).users()
    out(args, users, [[u["kind"], u["name"], ",".join(u.get("queues") or []) or "-", u["public"]] for u in users],
        ["KIND", "NAME", "QUEUES", "PUBLIC KEY"])
    return 0
