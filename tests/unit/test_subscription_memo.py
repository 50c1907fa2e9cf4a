"""Each subscription event's executor has a memo of its own (schema.per_event_memo)."""

from __future__ import annotations

from graphql import build_schema, parse
from graphql.execution.executor import Executor

from server.api.graphql.schema import per_event_memo

SDL = """
type Query { dummy: String }
type Job { id: String, attempts: [Attempt] }
type Attempt { id: String, state: String }
type Subscription { job: Job }
"""


def test_an_events_executor_leaves_nothing_in_the_subscriptions_memo() -> None:
    """Found by exploring: graphql-core's per-event executors shared one memo keyed by lists
    made anew for each event, and a subscription kept about 1 KB per event delivered."""
    per_event_memo()
    per_event_memo()  # once per process: not wrapped twice
    root = Executor.build(build_schema(SDL), parse("subscription { job { id attempts { id state } } }"))
    assert isinstance(root, Executor)
    for i in range(50):
        job = {"id": f"j{i}", "attempts": [{"id": f"j{i}.1", "state": "RUNNING"}]}
        result = root.build_per_event_executor({"job": job}).execute_operation(False)
        assert result.data == {"job": job}  # type: ignore[union-attr]
    assert root._relevant_sub_fields == {}
