"""The committed GraphQL schema (`schema.graphql`) is the one the code builds."""

from __future__ import annotations

from tests.conftest import ROOT


def test_schema_file_matches_code() -> None:
    from server.api.graphql import schema_sdl

    committed = (ROOT / "schema.graphql").read_text()
    assert committed == schema_sdl(), "schema.graphql drifted from the code: run `make schema`"


async def test_a_repeated_query_is_validated_once_and_the_limits_still_apply() -> None:
    """The depth and alias limits are the same rule classes on every request, so the
    validation cache, keyed on them, answers a repeated query text."""
    from strawberry.extensions.validation_cache import _get_validate_cache

    from server.api.graphql.schema import build_schema

    schema = build_schema()
    cache = _get_validate_cache(256)
    query = "query Repeated { __typename }"
    first = await schema.execute(query)
    assert first.errors is None
    before = cache.cache_info()
    for _ in range(3):
        assert (await schema.execute(query)).errors is None
    after = cache.cache_info()
    assert after.hits - before.hits == 3 and after.misses == before.misses

    deep = "{ " + " ".join(f"f{i} {{" for i in range(15)) + " x " + "}" * 15 + " }"
    for _ in range(2):  # refused the first time and from the cache
        res = await schema.execute(deep)
        assert res.errors and any("depth" in e.message for e in res.errors), res.errors
    aliased = "{ " + " ".join(f"a{i}: ping" for i in range(40)) + " }"
    res = await schema.execute(aliased)
    assert res.errors and any("alias" in e.message.lower() for e in res.errors), res.errors
