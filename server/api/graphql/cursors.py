"""Opaque GraphQL cursors: keyset cursors (`<kind>:<json key>`, the last item's sort key)
for lists whose items come and go (hosts, jobs, events, alerts, attempts), offset cursors
(`o:<n>`) for short lists (queues) and as history lists gave them before. A cursor that
does not decode is the client's error: ValidationError on `after`."""

from __future__ import annotations

import base64
import bisect
import json
import math
from collections.abc import Sequence
from typing import Any

from wire.errors import ValidationError

MAX_PAGE = 500
MAX_OFFSET = 10**9  # an offset cursor past this is no list's
MAX_KEY_CHARS = 1024  # a keyset cursor's key, as JSON


def _invalid() -> ValidationError:
    return ValidationError("after", "invalid cursor", "INVALID_CURSOR")


def b64(s: str) -> str:
    return base64.urlsafe_b64encode(s.encode()).decode()


def unb64(c: str) -> tuple[str, str]:
    """(kind, rest) of a cursor."""
    try:
        kind, _, rest = base64.urlsafe_b64decode(c.encode()).decode().partition(":")
    except (ValueError, UnicodeDecodeError) as exc:
        raise _invalid() from exc
    return kind, rest


def encode_cursor(n: int) -> str:
    """An offset cursor: the item at position `n`."""
    return b64(f"o:{n}")


def decode_cursor(c: str | None) -> int:
    """The offset after an offset cursor (0 without one)."""
    if not c:
        return 0
    kind, n = unb64(c)
    if kind != "o":
        raise _invalid()
    try:
        offset = max(0, int(n) + 1)
    except ValueError as exc:
        raise _invalid() from exc
    if offset > MAX_OFFSET:  # no list is that long (one past it: a database's integer overflows)
        raise _invalid()
    return offset


def job_keyset(rest: str, texts: Sequence[bool]) -> str:
    """The key of a jobs keyset cursor (`j:<sort>:<json key>`), checked (`keyset_key`),
    as the JSON text it came as."""
    keyset_key(rest, texts)
    return rest


def keyset_key(rest: str, texts: Sequence[bool]) -> list[Any]:
    """A keyset cursor's key, checked: a JSON list with a string where `texts` says, a
    finite number elsewhere, else INVALID_CURSOR (a crafted one used to reach the
    database's error, or Python's JSON recursion limit)."""
    if len(rest) > MAX_KEY_CHARS:
        raise _invalid()
    try:
        key = json.loads(rest)
    except (ValueError, RecursionError) as exc:
        raise _invalid() from exc
    try:
        good = isinstance(key, list) and len(key) == len(texts) and all(
            isinstance(v, str) if text else (isinstance(v, int | float) and not isinstance(v, bool)
                                             and math.isfinite(v))
            for v, text in zip(key, texts, strict=False))
    except OverflowError:  # an integer too large for a float
        good = False
    if not good:
        raise _invalid()
    return key


def encode_key_cursor(kind: str, key: object) -> str:
    """A keyset cursor: the sort key of an item (stable when items come and go)."""
    return b64(f"{kind}:{json.dumps(key, separators=(',', ':'))}")


def decode_key_cursor(c: str, kind: str) -> object:
    k, rest = unb64(c)
    if k != kind or len(rest) > MAX_KEY_CHARS:
        raise _invalid()
    try:
        return json.loads(rest)
    except (ValueError, RecursionError) as exc:  # (found by exploring: "[" * 5000, a traceback)
        raise _invalid() from exc


def page_args(first: int | None, after: str | None) -> tuple[int, int]:
    """(offset, page size) from `first` and an offset cursor."""
    n = 50 if first is None else first
    if n < 0 or n > MAX_PAGE:
        raise ValidationError("first", f"must be from 0 to {MAX_PAGE}", "OUT_OF_RANGE")
    return decode_cursor(after), n


def history_page(first: int | None, after: str | None, kind: str) -> tuple[int, tuple[float, str] | None, int]:
    """(offset, key, page size) of a page of a history list (events, alerts, attempts):
    `after` is that list's keyset cursor (`kind`: the list and its order) of the last item
    seen, or an offset cursor as such lists gave before (still taken)."""
    _, n = page_args(first, None)
    if not after:
        return 0, None, n
    k, rest = unb64(after)
    if k == "o":
        return decode_cursor(after), None, n
    if k != kind:
        raise ValidationError("after", "this cursor belongs to another list or order", "INVALID_CURSOR")
    at, ident = keyset_key(rest, [False, True])
    return 0, (float(at), ident), n


def history_cursor(kind: str, at: float, ident: str) -> str:
    """The keyset cursor of a history list's item: its time and id (`history_page`)."""
    return encode_key_cursor(kind, [at, ident])


def index_after(keys: Sequence[tuple[str | int | float, ...]], after: list[object], reverse: bool) -> int:
    """Index of the first key strictly after the cursor key `after`, in `keys` (ascending,
    or descending when `reverse`)."""
    key = tuple(after)
    try:
        if not reverse:
            return bisect.bisect_right(keys, key)
        for i, k in enumerate(keys):
            if k < key:
                return i
    except TypeError as exc:  # a cursor whose values do not compare with this sort's keys
        raise _invalid() from exc
    return len(keys)
