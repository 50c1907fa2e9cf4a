"""Building an input object from its GraphQL value with the per-field work done once.

Strawberry converts an input value field by field on every request: it works out each
field's GraphQL name and resolves its type annotation again each time. For
`SubmitJobInput` (twenty-odd fields, one request per job under single-job submissions)
that was about an eighth of a replica's CPU per request. `plan_once` gives an input
class a `from_input` hook (strawberry's `StrawberryObjectDefinition.from_input`, the
hook its own pydantic integration uses) that makes the per-field plan on first use:
a field whose value needs no conversion (a scalar, or a list of scalars, nullable or
not) is taken as it is (a list copied), any other through strawberry's own conversion
(`InputContext.convert`). The object built is the one strawberry builds (tested). The
plan takes the field names of the first schema that builds the class: a class shared by
schemas with different name converters would need one plan each (Muster has one schema)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from strawberry import ID
from strawberry.scalars import JSON
from strawberry.types.arguments import InputContext
from strawberry.types.base import StrawberryList, StrawberryMaybe, StrawberryOptional, get_object_definition

T = TypeVar("T")

# Scalars whose GraphQL value is already their Python value.
_PLAIN = (str, int, float, bool, ID, JSON)


@dataclasses.dataclass(frozen=True)
class _Field:
    graphql_name: str
    python_name: str
    type_: Any
    plain: bool  # a scalar: taken as it is
    plain_list: bool  # a list of scalars: copied
    null_as_is: bool  # a null is None (not for a `Maybe`, which wraps it)


def _unwrap(t: Any) -> Any:
    return t.of_type if isinstance(t, StrawberryOptional) else t


def _plan(cls: type, context: InputContext) -> tuple[list[_Field], dict[str, None]]:
    definition = get_object_definition(cls, strict=True)
    fields = []
    for f in definition.fields:
        t = f.resolve_type(type_definition=definition)
        inner = _unwrap(t)
        plain_list = isinstance(inner, StrawberryList) and _unwrap(inner.of_type) in _PLAIN
        maybe = isinstance(t, StrawberryMaybe)
        fields.append(_Field(context.config.name_converter.from_field(f), f.python_name, t,
                             not maybe and inner in _PLAIN, not maybe and plain_list, not maybe))
    # Like strawberry: a field with no default is None unless given (GraphQL has checked
    # that every required one is).
    unset = {f.python_name: None for f in definition.fields
             if f.default_value is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return fields, unset


def plan_once(cls: type[T]) -> type[T]:
    """Class decorator (under `@strawberry.input`): build this input with a plan made once."""
    plan: list[tuple[list[_Field], dict[str, None]]] = []

    def build(target: type, value: Mapping[str, Any], context: InputContext) -> Any:
        if not plan:
            plan.append(_plan(cls, context))
        fields, unset = plan[0]
        kwargs: dict[str, Any] = dict(unset)
        for f in fields:
            if f.graphql_name not in value:
                continue
            v = value[f.graphql_name]
            if f.plain or v is None and f.null_as_is:
                kwargs[f.python_name] = v
            elif f.plain_list:
                kwargs[f.python_name] = list(v)
            else:
                kwargs[f.python_name] = context.convert(v, f.type_, f.graphql_name)
        return target(**kwargs)

    hook: Callable[[type, Mapping[str, Any], InputContext], Any] = build
    get_object_definition(cls, strict=True).from_input = hook
    return cls
