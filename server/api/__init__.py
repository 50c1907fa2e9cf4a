"""The HTTP API of a replica.

    app            the Starlette app: GraphQL at /graphql (HTTP and WebSocket), health,
                   metrics; other routes (the console) are passed in by the caller
    schema         the GraphQL schema (queries, mutations, subscriptions)
    auth           bearer tokens and roles (viewer, operator, admin)
    tokens         managing tokens in the state bucket (`muster token`)
    subscriptions  the live feeds behind GraphQL subscriptions

Reads come from `server.views`; operations from `server.replica.Muster`.

May import: `wire`, `server.views`, `server.state`, `server.history`, `server.replica`
(operations), Starlette, strawberry and uvicorn. Never `web` or `agent`: the console's
routes are handed in by the caller (`build_app(muster, routes=...)`).
"""
