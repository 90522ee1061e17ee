"""Redis URLs, one node or a cluster: `redis://...` and `redis+cluster://host:port[,host:port...]`.

The store, the replay guard and the fleet bus all take the same URL. A cluster URL names one
or more seed nodes (one is enough: redis-py's cluster client learns the rest from
`CLUSTER SLOTS`); credentials, TLS (`rediss+cluster://`) and query options apply to every node.
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SCHEMES = ("redis://", "rediss://", *CLUSTER_SCHEMES)
SLOTS = 16384


def is_cluster(url: str) -> bool:
    """Whether `url` names a Redis Cluster (`redis+cluster://`, `rediss+cluster://`)."""
    return url.startswith(CLUSTER_SCHEMES)


def seed_nodes(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A cluster URL as (the plain `redis://` URL of its first seed, every seed's (host, port)).

    Raises:
        ValueError: No seed, or a seed without a numeric port.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.removesuffix("+cluster")
    auth, _, hosts = parts.netloc.rpartition("@")
    seeds: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not item.strip():
            continue
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"cluster seed {item!r} in {url!r} must be host:port")
        seeds.append((host.strip("[]"), int(port)))
    if not seeds:
        raise ValueError(f"a cluster URL names at least one seed node host:port, not {url!r}")
    first_host, first_port = seeds[0]
    first = f"[{first_host}]:{first_port}" if ":" in first_host else f"{first_host}:{first_port}"
    netloc = f"{auth}@{first}" if auth else first
    path = "" if parts.path in ("", "/", "/0") else parts.path
    if path:
        raise ValueError(f"a Redis Cluster has one database (0): {url!r} names {parts.path!r}")
    return urlunsplit((scheme, netloc, "", parts.query, "")), seeds


@functools.lru_cache(maxsize=32)
def shard_tags(prefix: str, shards: int) -> tuple[str, ...]:
    """The hash tags of a cluster store's shards: `{<prefix>NN.j}`, shard `i`'s slot in the `i`-th
    `1/shards` of the slot range, near its middle (`j` is the first suffix that lands there), so
    primaries that split the range evenly get an even share of the shards."""
    tags = []
    for i in range(shards):
        low, high = i * SLOTS // shards, (i + 1) * SLOTS // shards
        eighth = (high - low) * 3 // 8
        low, high = low + eighth, max(high - eighth, low + eighth + 1)
        j = 0
        while not low <= key_slot(f"{prefix}{i:02d}.{j}".encode()) < high:
            j += 1
        tags.append(f"{{{prefix}{i:02d}.{j}}}")
    return tuple(tags)


def client(url: str, **kwargs: Any) -> aioredis.Redis | RedisCluster:
    """A client for `url`: `redis.asyncio.Redis` for one node, `RedisCluster` for a cluster URL."""
    if not is_cluster(url):
        return aioredis.Redis.from_url(url, **kwargs)
    first, seeds = seed_nodes(url)
    # redis-py's cluster client fails a command outright (MaxConnectionsError) past 100 connections to
    # one node, where the one-node client just opens another: give a busy server the same room.
    kwargs.setdefault("max_connections", 1024)
    return RedisCluster.from_url(first, startup_nodes=[ClusterNode(host, port) for host, port in seeds], **kwargs)


__all__ = ["CLUSTER_SCHEMES", "SCHEMES", "SLOTS", "client", "is_cluster", "seed_nodes", "shard_tags"]
