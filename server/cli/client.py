"""The commands' side of the GraphQL API: the token, the HTTP call, `-o table|json`
output and `--watch`.

    MUSTER_URL       the API (default http://127.0.0.1:8080)
    MUSTER_TOKEN     the bearer token; else <MUSTER_DATA_DIR or .muster>/token
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from server.cli.errors import ApiError
from wire.errors import AuthError, ValidationError

# What a token may hold: visible ASCII, which an HTTP header carries as it is.
_TOKEN = re.compile(r"[\x21-\x7e]+")


def token() -> str:
    """The bearer token, without surrounding whitespace: MUSTER_TOKEN="$(cat token)" with a
    newline after it, or a trailing space, was sent as it was and refused by the HTTP
    library in a message that held the whole token (found by exploring). One that still
    holds what a header cannot carry is refused without being printed."""
    tok = (os.environ.get("MUSTER_TOKEN") or "").strip()
    where = "MUSTER_TOKEN"
    if not tok:
        path = Path(os.environ.get("MUSTER_DATA_DIR", ".muster")) / "token"
        if not path.exists():
            raise AuthError("no token: set MUSTER_TOKEN (or run from the directory holding .muster/token)")
        tok, where = path.read_text().strip(), str(path)
    if tok and not _TOKEN.fullmatch(tok):
        raise AuthError(f"the token in {where} holds characters an HTTP header cannot carry (whitespace, control "
                        "or non-ASCII characters within it): check how it was set")
    return tok


def _redacted(text: str, tok: str) -> str:
    """`text` without the token in it (an error of the HTTP client may quote the header)."""
    return text.replace(tok, "<token>") if tok else text


def gql(query: str, variables: dict[str, Any] | None = None, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """The `data` of one GraphQL request. AuthError when the token is missing or refused
    (HTTP 401), ApiError when the API cannot be reached or answers with `errors`.

    `optional`: fields newer than some servers (a field name each: a scalar, or an object
    whose selection holds no object, with its arguments); a server whose schema lacks one
    is asked again without it, and the answer lacks it (readers use `.get`), so that a
    newer CLI still lists and shows during a rolling upgrade."""
    try:
        return _gql(query, variables)
    except _MissingFields as exc:
        gone = [f for f in optional if f in exc.fields]
        if not gone or set(exc.fields) - set(gone):
            raise ApiError(exc.text) from None
        for f in gone:
            query = re.sub(rf"(?<![\w$]){re.escape(f)}(?!\w)(\s*\([^()]*\))?(\s*\{{[^{{}}]*\}})?", "", query)
        return gql(query, variables, tuple(f for f in optional if f not in gone))


class _MissingFields(Exception):
    def __init__(self, fields: list[str], text: str) -> None:
        super().__init__(text)
        self.fields, self.text = fields, text


def _gql(query: str, variables: dict[str, Any] | None) -> dict[str, Any]:
    import httpx

    url = os.environ.get("MUSTER_URL", "http://127.0.0.1:8080").rstrip("/") + "/graphql"
    tok = token()
    try:
        r = httpx.post(url, json={"query": query, "variables": variables or {}},
                       headers={"Authorization": f"Bearer {tok}"}, timeout=30)
    except httpx.HTTPError as exc:
        # Not chained: the cause's text may hold the Authorization header.
        raise ApiError(f"cannot reach {url}: {_redacted(str(exc), tok)}") from None
    if r.status_code == 401:
        raise AuthError("unauthorised: the token was refused")
    try:
        body = r.json()
        if not isinstance(body, dict) or not ("data" in body or "errors" in body):
            raise ValueError(body)
    except ValueError as exc:
        # Not the API's answer (a proxy's error page, a wrong MUSTER_URL): said, not a
        # traceback (found by exploring).
        text = _redacted(" ".join(r.text.split()), tok)[:200]
        raise ApiError(f"{url} answered HTTP {r.status_code}, not a GraphQL answer"
                       f"{': ' + text if text else ''} (is MUSTER_URL the server's address?)") from exc
    if body.get("errors"):
        messages = [e.get("message", "?") for e in body["errors"]]
        missing = [m.group(1) for m in (re.match(r"Cannot query field '(\w+)'", x) for x in messages) if m]
        if missing and len(missing) == len(messages):
            raise _MissingFields(missing, explain_errors(messages, url))
        raise ApiError(explain_errors(messages, url))
    return body["data"]


def explain_errors(messages: list[str], url: str) -> str:
    """The API's errors in one line; a field the server's schema lacks means this CLI is
    newer than the server, which is said in so many words."""
    text = "; ".join(messages)
    missing = [m for m in messages if m.startswith("Cannot query field")]
    if missing:
        text += (f"\n  the server at {url} has an older API than this muster CLI: use the CLI of the "
                 "server's version, or upgrade the server")
    return text


# ---------------------------------------------------------------- output


def add_output(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-o", "--output", choices=["table", "json"], default="table")


def add_watch(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("-w", "--watch", action="store_true", help="re-render every 2 s until Ctrl-C")


def out(args: argparse.Namespace, data: Any, table: list[list[str]] | None = None,
        headers: list[str] | None = None) -> None:
    """`data` as indented JSON with `-o json`; else the table (or `data` itself when there is none)."""
    if args.output == "json":
        print(json.dumps(data, indent=2))
        return
    if table is None or headers is None:
        print(data)
        return
    widths = [max(len(h), *(len(r[i]) for r in table)) if table else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def key_values(option: str, items: list[str]) -> dict[str, str]:
    """Repeated `--option KEY=VALUE` arguments as a map; refuses an item without `=` or a key."""
    pairs: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValidationError(option, f"{item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


def labels_text(labels: list[dict[str, str]]) -> str:
    """GraphQL labels (`{key value}`) as `key=value,key=value`."""
    return ",".join(f"{lb['key']}={lb['value']}" for lb in labels)


def watch(args: argparse.Namespace, render: Callable[[], None], every_s: float = 2.0) -> int:
    """Render once; with --watch, re-render every `every_s` s until Ctrl-C (exit 0). An
    error (a job or host that is gone, a refused token) ends the watch with its exit code."""
    if not getattr(args, "watch", False):
        render()
        return 0
    try:
        while True:
            if args.output != "json":
                if sys.stdout.isatty():
                    print("\033[H\033[2J", end="")
                print(f"every {every_s:g}s: {time.strftime('%H:%M:%S')}  (Ctrl-C to stop)")
            render()
            sys.stdout.flush()
            time.sleep(every_s)
    except KeyboardInterrupt:
        return 0


def finite_float(text: str) -> float:
    """A number option: "nan" and "inf" are refused here (sent on, they made invalid JSON),
    and digits other than ASCII's (float() reads '٣' as 3)."""
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    v = float(text)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return v


def whole_number(text: str) -> int:
    """An integer option (--gpus, --replicas, --priority, --limit ...): ASCII digits only,
    as finite_float (int() reads '٣' as 3, and '３' as 3); refused in words, not with
    argparse's "invalid whole_number value"."""
    try:
        if not re.fullmatch(r"[+-]?[0-9]+", text):  # (int() also takes "1_000" and " 3 ": a review)
            raise ValueError(text)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (ASCII digits, e.g. 3 or -1)") from None


def nonempty(text: str) -> str:
    """A selector's or filter's value (--label, --rack, --name, --queue ...): an empty one
    is refused here, before the API is asked (found by exploring: taken for none, `host
    cordon --label '' --reason x` cordoned every host, `job cancel --name "$P" --queue q`
    with P empty cancelled the whole queue; the API refuses them too)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty, which would match everything: give a value or leave the option out")
    return text
