"""server.api.graphql.conversion: an input built with its plan made once is the object
strawberry's own field-by-field conversion builds, for any value GraphQL hands over."""

from __future__ import annotations

import enum
from typing import Any

import strawberry
from hypothesis import given, settings
from hypothesis import strategies as st
from strawberry.types.arguments import convert_argument

from server.api.graphql.conversion import plan_once
from server.api.graphql.inputs import OnDisconnect, SubmitJobInput
from server.api.graphql.schema import build_schema

SCHEMA = build_schema()


def _both(cls: type, value: dict[str, Any]) -> tuple[Any, Any]:
    """`value` converted with the class's plan, and by strawberry without it."""
    registry = SCHEMA.schema_converter.scalar_registry
    definition = cls.__strawberry_definition__  # type: ignore[attr-defined]
    fast = convert_argument(value, cls, registry, SCHEMA.config)
    hook, definition.from_input = definition.from_input, None
    try:
        slow = convert_argument(value, cls, registry, SCHEMA.config)
    finally:
        definition.from_input = hook
    return fast, slow


def test_submit_job_input_uses_its_plan() -> None:
    assert SubmitJobInput.__strawberry_definition__.from_input is not None  # type: ignore[attr-defined]


_text = st.text(max_size=8)
_json = st.recursive(st.none() | st.booleans() | st.integers() | _text,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                     max_leaves=6)
# What graphql-core hands a resolver: GraphQL names, the published defaults filled in for
# omitted fields, enums as their Python members, a null where the client sent one.
_submit = st.fixed_dictionaries(
    {"name": _text, "command": st.lists(_text, max_size=3)},
    optional={
        "gpus": st.integers(), "gpuModel": st.none() | _text, "gpuModels": st.none() | st.lists(_text, max_size=3),
        "sameModel": st.booleans(), "gpuShare": st.integers(), "gpuMemoryMb": st.integers(),
        "migProfile": st.none() | _text, "cpus": st.floats(allow_nan=False), "memoryMb": st.integers(),
        "priority": st.integers(), "maxAttempts": st.integers(), "cwd": st.none() | _text,
        "env": st.none() | st.dictionaries(_text, _json, max_size=3), "replicas": st.integers(),
        "sameRack": st.booleans(), "onDisconnect": st.sampled_from(list(OnDisconnect)),
        "replaceAfter": st.floats(allow_nan=False), "queue": _text, "timeLimitSeconds": st.floats(allow_nan=False),
    })


@settings(max_examples=300, deadline=None)
@given(_submit)
def test_a_submitted_job_is_built_as_strawberry_builds_it(value: dict[str, Any]) -> None:
    fast, slow = _both(SubmitJobInput, value)
    assert type(fast) is SubmitJobInput
    assert fast == slow
    if value["command"]:
        assert fast.command is not value["command"]  # copied, as strawberry copies a list


@strawberry.enum
class _Colour(enum.Enum):
    RED = "RED"
    BLUE = "BLUE"


@strawberry.input
class _Inner:
    n: int
    colours: list[_Colour] | None = None


@plan_once
@strawberry.input
class _Outer:
    required: str | None
    inner: _Inner | None = None
    inners: list[_Inner] = strawberry.field(default_factory=list)
    maybe: strawberry.Maybe[int | None] = None
    ident: strawberry.ID = strawberry.ID("x")
    colour: _Colour = _Colour.RED


@strawberry.type
class _Query:
    @strawberry.field
    def echo(self, value: _Outer) -> str:
        return repr(value)


_OUTER_SCHEMA = strawberry.Schema(query=_Query)

_inner = st.fixed_dictionaries({"n": st.integers()},
                               optional={"colours": st.none() | st.lists(st.sampled_from(list(_Colour)), max_size=3)})
_outer = st.fixed_dictionaries(
    {"required": st.none() | _text},
    optional={"inner": st.none() | _inner, "inners": st.lists(_inner, max_size=3), "maybe": st.none() | st.integers(),
              "ident": _text, "colour": st.sampled_from(list(_Colour))})


@settings(max_examples=200, deadline=None)
@given(_outer)
def test_nested_inputs_enums_and_maybe_go_through_strawberry(value: dict[str, Any]) -> None:
    assert _OUTER_SCHEMA.as_str()  # the types are part of a schema, as in the server
    fast, slow = _both(_Outer, value)
    assert fast == slow
    if "maybe" in value:
        assert fast.maybe is not None and fast.maybe.value == value["maybe"]  # Some(...), a null too
    if value.get("inner") is not None:
        assert type(fast.inner) is _Inner


def test_a_request_through_the_schema_gets_the_same_input() -> None:
    """Through a whole request: omitted fields take their defaults, a null stays None."""
    res = _OUTER_SCHEMA.execute_sync(
        '{ echo(value: {required: null, inners: [{n: 1, colours: [BLUE]}], maybe: null, colour: BLUE}) }')
    assert res.errors is None
    assert res.data == {"echo": repr(_Outer(required=None, inners=[_Inner(n=1, colours=[_Colour.BLUE])],
                                            maybe=strawberry.Some(None), colour=_Colour.BLUE))}
