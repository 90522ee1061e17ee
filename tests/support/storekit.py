"""Leave the shared Redis and PostgreSQL as the tests found them: one cleanup for every test."""

from __future__ import annotations

from typing import Any

REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def cluster_url(kind: str, request: Any) -> str | None:
    """The session's private Redis Cluster URL (the `redis_cluster` fixture, started on first use)
    when `kind` is `"redis-cluster"`, else None."""
    return str(request.getfixturevalue("redis_cluster")) if kind == "redis-cluster" else None


async def drop_namespace(kind: str, namespace: str, *, url: str | None = None) -> None:
    """Delete a test's Redis keys under `namespace:` (and, on a cluster URL, its shards' `{namespace:NN.j}:`)
    or its PostgreSQL tables (`namespace`, `namespace_rounds`)."""
    if kind in ("redis", "redis-cluster"):
        from mrtr._redisclient import client as redis_client

        client: Any = redis_client(url or REDIS_URL)
        try:
            for pattern in (f"{namespace}:*", f"{{{namespace}:*"):
                # On a cluster, scan_iter visits every primary; deletes go key by key (any slot).
                keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
                for start in range(0, len(keys), 500):
                    if kind == "redis":
                        await client.delete(*keys[start : start + 500])
                    else:
                        async with client.pipeline(transaction=False) as pipe:
                            for key in keys[start : start + 500]:
                                pipe.delete(key)
                            await pipe.execute()
        finally:
            await client.aclose()
    elif kind == "postgres":
        import psycopg

        async with await psycopg.AsyncConnection.connect(url or POSTGRES_DSN, autocommit=True) as conn:
            await conn.execute(f'DROP TABLE IF EXISTS "{namespace}", "{namespace}_rounds"')


async def service_problem(kind: str) -> str | None:
    """None if the local Redis / PostgreSQL answers, else why not (for a loud failure or a skip)."""
    try:
        if kind == "redis":
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
            try:
                await client.ping()
            finally:
                await client.aclose()
        else:
            import psycopg

            conn = await psycopg.AsyncConnection.connect(POSTGRES_DSN, connect_timeout=2)
            await conn.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
