"""Redis URLs for one node and for a cluster (`mrtr._redisclient`): parsed, never connected here."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from mrtr._redisclient import SLOTS, is_cluster, seed_nodes, shard_tags


def test_a_cluster_url_names_its_seeds_and_keeps_credentials_and_options() -> None:
    first, seeds = seed_nodes("rediss+cluster://app:s3cret@cache-0:6380,cache-1:6381,[::1]:7000?ssl_cert_reqs=none")
    assert first == "rediss://app:s3cret@cache-0:6380?ssl_cert_reqs=none"
    assert seeds == [("cache-0", 6380), ("cache-1", 6381), ("::1", 7000)]
    assert seed_nodes("redis+cluster://[::1]:7000")[0] == "redis://[::1]:7000"
    assert seed_nodes("redis+cluster://127.0.0.1:7000/0") == ("redis://127.0.0.1:7000", [("127.0.0.1", 7000)])
    assert is_cluster("redis+cluster://h:1") and is_cluster("rediss+cluster://h:1")
    assert not is_cluster("redis://h:1/0") and not is_cluster("rediss://h:1/0")


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis+cluster://", "at least one seed"),
        ("redis+cluster://cache", "must be host:port"),
        ("redis+cluster://cache:port", "must be host:port"),
        ("redis+cluster://cache:7000/3", "one database"),
    ],
)
def test_a_bad_cluster_url_is_a_clear_error(url: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        seed_nodes(url)


@pytest.mark.parametrize("shards", [1, 3, 16, 64])
def test_shard_tags_land_evenly_spaced_over_the_slot_range(shards: int) -> None:
    tags = shard_tags("mrtr:", shards)
    assert len(set(tags)) == shards and all(t.startswith("{mrtr:") and t.endswith("}") for t in tags)
    slots = [key_slot(f"{tag}:task:x".encode()) for tag in tags]
    width = SLOTS // shards
    assert all(i * width <= slot < (i + 1) * width + 1 for i, slot in enumerate(slots))
    # three primaries splitting the range evenly (redis-cli --cluster create) share 16 shards 5/6/5
    if shards == 16:
        thirds = [sum(1 for s in slots if low <= s < high) for low, high in ((0, 5461), (5461, 10923), (10923, SLOTS))]
        assert thirds == [5, 6, 5]
