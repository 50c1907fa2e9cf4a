"""The GraphQL subscriptions, fed by the live hubs of server.api.feeds. Each ends (with an
error) within REVOKED_CHECK_S of its token's revocation."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncGenerator
from typing import TypeVar

import strawberry
from strawberry.types import Info

from server.api.auth import allows
from server.api.feeds import hub_for
from server.api.graphql.context import muster, ts
from server.api.graphql.queries import cluster
from server.api.graphql.types import Alert, Cluster, Host, Job
from wire.errors import AuthError, NotFound


@strawberry.type
class HostHealthChange:
    host_id: strawberry.ID
    old_health: str | None = strawberry.field(description="null when the host was not known before.")
    new_health: str
    at: dt.datetime | None

    @strawberry.field
    def host(self, info: Info) -> Host | None:
        return Host.of(info, str(self.host_id))


REVOKED_CHECK_S = 1.0
T = TypeVar("T")


def _can_read(info: Info) -> None:
    if not allows(info.context.get("token"), "viewer"):
        raise AuthError("a valid token is required")


async def _while_valid(info: Info, source: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """What `source` yields, until its token is revoked or expires (then AuthError ends it)."""
    h = info.context.get("token_hash")
    tokens = muster(info).state.tokens
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if h is None or h not in tokens or tokens[h].expired():
                raise AuthError("the token was revoked, or has expired")
            if pending is None:
                pending = asyncio.ensure_future(source.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=REVOKED_CHECK_S)
            if not done:
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await source.aclose()


@strawberry.type
class Subscription:
    @strawberry.subscription(description="Host health transitions (HEALTHY, SUSPECT, LOST), as they happen.")
    async def host_health(
        self, info: Info, host_id: strawberry.ID | None = None
    ) -> AsyncGenerator[HostHealthChange, None]:
        _can_read(info)

        async def changes() -> AsyncGenerator[HostHealthChange, None]:
            gen = hub_for(muster(info)).host_health()
            try:
                async for c in gen:
                    if host_id is None or c.host_id == str(host_id):
                        yield HostHealthChange(host_id=strawberry.ID(c.host_id), old_health=c.old,
                                               new_health=c.new, at=ts(c.ts))
            finally:
                await gen.aclose()

        async for change in _while_valid(info, changes()):
            yield change

    @strawberry.subscription(description="Job records as they change; with `id`, that job only: its "
                                         "current record first, and the subscription completes once it has finished.")
    async def job_updates(self, info: Info, id: strawberry.ID | None = None) -> AsyncGenerator[Job, None]:
        _can_read(info)
        mu = muster(info)

        async def jobs() -> AsyncGenerator[Job, None]:
            gen = hub_for(mu).job_updates(str(id) if id is not None else None)
            try:
                if id is not None:
                    current = mu.jobs.get(str(id))
                    if current is None:
                        raise NotFound(f"no job {str(id)[:128]}")
                    yield Job(_m=current)
                    if current.state.terminal:
                        return
                async for j in gen:
                    yield Job(_m=j)
                    if id is not None and j.state.terminal:
                        return
            finally:
                await gen.aclose()

        async for job in _while_valid(info, jobs()):
            yield job

    @strawberry.subscription(description="The cluster summary every `intervalSeconds` (at least 0.5).")
    async def cluster_stats(self, info: Info, interval_seconds: float = 2.0) -> AsyncGenerator[Cluster, None]:
        _can_read(info)
        mu = muster(info)
        interval = max(0.5, min(interval_seconds, 3600.0))

        async def stats() -> AsyncGenerator[Cluster, None]:
            while True:
                yield cluster(mu)
                await asyncio.sleep(interval)

        async for c in _while_valid(info, stats()):
            yield c

    @strawberry.subscription(description="Alerts as they are published (`kind` like \"host.lost\").")
    async def alerts(self, info: Info, kind: str | None = None) -> AsyncGenerator[Alert, None]:
        _can_read(info)

        async def alerts() -> AsyncGenerator[Alert, None]:
            gen = hub_for(muster(info)).alerts(kind)
            try:
                async for a in gen:
                    yield Alert(id=strawberry.ID(a.id), kind=a.kind, ts=ts(a.ts), host_id=a.host_id,
                                job_id=a.job_id, message=a.message)
            finally:
                await gen.aclose()

        async for alert in _while_valid(info, alerts()):
            yield alert


