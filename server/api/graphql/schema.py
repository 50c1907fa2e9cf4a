"""The schema: queries, mutations and subscriptions, with the limits every request runs
under (depth, tokens, aliases). Errors carry their code (`extensions.code`, from
wire.errors); in production an unexpected error's message is masked ("Unexpected error."),
not Muster's own refusals (`unexpected`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import strawberry
from graphql import GraphQLError, OperationDefinitionNode
from graphql.execution.executor import Executor
from strawberry.extensions import (
    AddValidationRules,
    MaskErrors,
    MaxAliasesLimiter,
    MaxTokensLimiter,
    ParserCache,
    QueryDepthLimiter,
    SchemaExtension,
    ValidationCache,
)

from server.api.graphql.context import PerOperation
from server.api.graphql.errors import add_code
from server.api.graphql.mutations import Mutation
from server.api.graphql.queries import Query
from server.api.graphql.subscriptions import Subscription
from wire.errors import MusterError

log = logging.getLogger(__name__)


class _Schema(strawberry.Schema):
    def process_errors(self, errors: Any, execution_context: Any = None) -> None:
        """Each error with its code; the client's (a query that does not validate, a bad
        variable, a refusal of ours: MusterError) logged in one line, only the others with
        their traceback (strawberry logged a traceback for every one: 91 in ten minutes of
        a client's mistakes)."""
        unexpected = []
        for e in errors:
            add_code(e)
            original = e.original_error
            if original is None or isinstance(original, MusterError | GraphQLError):
                log.info("GraphQL request refused: %s", e.message)
            else:
                unexpected.append(e)
        if unexpected:
            super().process_errors(unexpected, execution_context)


def unexpected(error: GraphQLError) -> bool:
    """An error no client should see the text of (a bug, a library's): not one of ours
    (MusterError: a refusal, with its code, written for the client) nor the request's own
    (a query that does not validate). Only these are masked in production (found by
    exploring: every error was, and a client could not tell a bad cursor or a time range
    from a failure, nor see any code)."""
    original = error.original_error
    return original is not None and not isinstance(original, MusterError | GraphQLError)


class OneOperation(SchemaExtension):
    """A document of several operations needs the name of the one to run: the GraphQL
    spec's request error, which strawberry does not give (it ran the first: found by
    exploring). After ValidationCache, which sets the validation's errors."""

    def on_validate(self) -> Iterator[None]:
        ctx = self.execution_context
        doc = ctx.graphql_document
        # (The name the client gave, which strawberry keeps apart from the one it infers;
        # were that to change, nothing is refused.)
        if getattr(ctx, "_provided_operation_name", "") is None and doc is not None and sum(
                isinstance(d, OperationDefinitionNode) for d in doc.definitions) > 1:
            ctx.pre_execution_errors = [*(ctx.pre_execution_errors or []), GraphQLError(
                "Must provide operation name if query contains multiple operations.")]
        yield


# The depth and alias limits as validation rules, made once. Each limiter extension
# makes a new rule class when it is constructed (once per request), and ValidationCache
# keys its cache on the rule classes, so with the limiters as extensions no request
# would ever hit the cache (validation is about a sixth of a replica's samples under
# single-job submissions). One set of rule classes added to every request lets a
# repeated query text be validated once.
LIMIT_RULES = [*QueryDepthLimiter(max_depth=10).validation_rules,
               *MaxAliasesLimiter(max_alias_count=30).validation_rules]


def per_event_memo() -> None:
    """Give each subscription event's executor a memo of its own (graphql-core 3.3's
    `collect_subfields` memo, keyed by the identity of lists made anew for every event, is
    shared by the shallow copies `build_per_event_executor` makes: found by exploring, a
    `jobUpdates` subscription kept about 1 KB for every event it delivered, 2 MB/s at 500
    jobs/s, and all of it was leaked when it closed). Once per process; a graphql-core
    without that memo is left as it is."""
    original = Executor.build_per_event_executor
    if getattr(original, "muster_per_event_memo", False):
        return

    def build_per_event_executor(self: Executor, payload: Any) -> Executor:
        executor = original(self, payload)
        if isinstance(getattr(executor, "_relevant_sub_fields", None), dict):
            executor._relevant_sub_fields = {}
        return executor

    build_per_event_executor.muster_per_event_memo = True  # type: ignore[attr-defined]
    Executor.build_per_event_executor = build_per_event_executor  # type: ignore[method-assign]


def build_schema(production: bool = False) -> strawberry.Schema:
    per_event_memo()
    extensions: list[Any] = [
        lambda: ParserCache(maxsize=256),
        lambda: AddValidationRules(LIMIT_RULES),
        lambda: ValidationCache(maxsize=256),
        OneOperation,
        lambda: MaxTokensLimiter(max_token_count=5000),
        PerOperation,
    ]
    if production:
        extensions.append(lambda: MaskErrors(should_mask_error=unexpected))
    return _Schema(query=Query, mutation=Mutation, subscription=Subscription, extensions=extensions)


def schema_sdl() -> str:
    return build_schema().as_str() + "\n"
