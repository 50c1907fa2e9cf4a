"""Where the error hierarchy (wire.errors) meets GraphQL, in one place.

Mutations turn the failures a client should expect (invalid input, not found, not
allowed, a concurrent change) into `userErrors` with the error's field and code. Queries
and subscriptions let them propagate: they become GraphQL errors with the error's code
(and field) in `extensions` (masked in production like every other error).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import strawberry
from graphql import GraphQLError

from wire.errors import AuthError, ConflictError, MusterError, NotFound, RejectedError, ValidationError

EXPECTED = (ValidationError, NotFound, AuthError, ConflictError, RejectedError)
T = TypeVar("T")


@strawberry.type
class UserError:
    field: str
    message: str
    code: str


def user_errors(exc: MusterError) -> list[UserError]:
    return [UserError(field=e.field, message=e.message, code=e.code) for e in exc.details()]


async def attempt(op: Callable[[], Awaitable[T]]) -> tuple[T | None, list[UserError]]:
    """Run a mutation's operation: its result and no errors, or None and its userErrors."""
    try:
        return await op(), []
    except EXPECTED as exc:
        return None, user_errors(exc)


def add_code(error: GraphQLError) -> GraphQLError:
    original = error.original_error
    if isinstance(original, MusterError):
        error.extensions = {**(error.extensions or {}), "code": original.code,
                            **({"field": original.field} if original.field else {})}
    return error
