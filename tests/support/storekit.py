"""Leave the shared Redis and PostgreSQL as the tests found them: one cleanup for every test."""

from __future__ import annotations

REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


async def drop_namespace(kind: str, namespace: str, *, url: str | None = None) -> None:
    """Delete a test's Redis keys under `namespace:` or its PostgreSQL tables (`namespace`, `namespace_rounds`)."""
    if kind == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url or REDIS_URL)
        try:
            keys = [key async for key in client.scan_iter(match=f"{namespace}:*")]
            if keys:
                await client.delete(*keys)
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
