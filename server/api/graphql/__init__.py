"""The GraphQL API (strawberry): types are views over the read models (server.views) and
the wire records; storage models stay behind the replica and the history database.

    schema         build_schema(), schema_sdl(): the schema and the limits it runs under
    queries        Query        mutations  Mutation      subscriptions  Subscription
    types          object types inputs     input types and enums
    cursors        opaque offset and keyset cursors
    errors         the one mapping of wire.errors to userErrors and GraphQL errors
    context        what resolvers take from the request

Conventions: Relay-style connections with opaque cursors, one `input` argument per
mutation where it takes more than an id, payloads whose expected failures are
`userErrors`, never exceptions.
"""

from server.api.graphql.schema import build_schema, schema_sdl

__all__ = ["build_schema", "schema_sdl"]
