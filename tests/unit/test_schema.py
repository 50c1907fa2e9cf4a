"""The committed GraphQL schema (`schema.graphql`) is the one the code builds."""

from __future__ import annotations

from tests.conftest import ROOT


def test_schema_file_matches_code() -> None:
    from server.api.graphql import schema_sdl

    committed = (ROOT / "schema.graphql").read_text()
    assert committed == schema_sdl(), "schema.graphql drifted from the code: run `make schema`"
