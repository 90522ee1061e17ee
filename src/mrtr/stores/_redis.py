"""`RedisStore`: tasks for a fleet that already runs Redis.

Layout under `prefix`: one string key per task (`task:<id>`, the record's JSON including
its version) that Redis itself expires at the record's `expires_at`; a sorted set
`claimable` of `working` task ids scored by `lease_until`, so finding work is one range
scan; and a sorted set `expiry` of ids scored by `expires_at`, so the TTL check inside a
script and `purge_expired` need neither the clock of the Redis server nor a JSON parse.

Every write is one Lua script: the version check, the record write and both index
updates happen as one atomic step, and each script checks everything before its first
write (Redis does not roll back a script that fails halfway).

On a Redis Cluster (`redis+cluster://host:port[,host:port...]`) a script may touch only keys
of one hash slot, so the same layout is kept once per *shard*: `shards` (16) hash tags,
`{<prefix>NN.j}`, each with its own record keys, `claimable`, `expiry` and listing indexes. A
task lives in shard `crc32(id) % shards`, with every index entry about it, so each write is
still one script on one slot; fleet-wide reads (work to claim, listings, counts) ask every
shard and merge. The tags are chosen so the shards' slots lie evenly spaced over the slot
range, so a cluster that splits the range evenly (as `redis-cli --cluster create` does) spreads
them evenly over its primaries: no slot holds the fleet's hot keys. On one node the store
keeps its single, unsharded layout (the keys above), so existing data reads as before.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from redis import exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from mrtr._redisclient import client, is_cluster, shard_tags
from mrtr.stores._abilities import RoundPipelining, SharedStore, redacted
from mrtr.stores._base import (
    STATUSES,
    TaskExists,
    TaskPage,
    TaskQuery,
    TaskRecord,
    page_cursor,
    read_cursor,
    wait_statuses,
    waits_for,
)
from mrtr.stores._faults import store_boundary

if TYPE_CHECKING:
    from mrtr.buses._base import BrokerBus

# The listing indexes (the console, `mrtr tasks`), all sorted sets scored by `created_at`
# under `<prefix>by:`: `all`; `s:<status>`; `f:<flow>`; `sf:<status>:<flow>`; plus `ids`
# (every id at score 0, for prefix search by ZRANGEBYLEX) and the set `flows`. ARGV: 1 id,
# 8 the `by:` prefix, 9 status, 10 flow, 11 created_at. The script's local `prev` is the status
# the stored record had (nil: unknown, as in `create`): an entry depends on the status, flow and
# `created_at` alone, and only the status ever changes, so a write that keeps the status (a
# checkpoint, a heartbeat, a claim) leaves the indexes as they are, and one that changes it moves
# the entry out of the old status's two indexes only. Records written before the indexes existed
# are indexed by `_BACKFILL` (before the first listing), whatever their writes since.
_INDEX = """
local p = ARGV[8]
if prev ~= ARGV[9] then
  if prev then
    redis.call('ZREM', p .. 's:' .. prev, ARGV[1])
    redis.call('ZREM', p .. 'sf:' .. prev .. ':' .. ARGV[10], ARGV[1])
  else
    for _, s in ipairs({'working', 'input_required', 'completed', 'failed', 'cancelled'}) do
      if s ~= ARGV[9] then
        redis.call('ZREM', p .. 's:' .. s, ARGV[1])
        redis.call('ZREM', p .. 'sf:' .. s .. ':' .. ARGV[10], ARGV[1])
      end
    end
  end
  redis.call('ZADD', p .. 'all', ARGV[11], ARGV[1])
  redis.call('ZADD', p .. 's:' .. ARGV[9], ARGV[11], ARGV[1])
  redis.call('ZADD', p .. 'f:' .. ARGV[10], ARGV[11], ARGV[1])
  redis.call('ZADD', p .. 'sf:' .. ARGV[9] .. ':' .. ARGV[10], ARGV[11], ARGV[1])
  redis.call('ZADD', p .. 'ids', 0, ARGV[1])
  redis.call('SADD', p .. 'flows', ARGV[10])
end
"""

# Shared tail of `create` and `save`: write the record and make every index agree with it.
# ARGV: 1 id, 2 json, 3 now, 4 claimable (0/1), 5 lease_until, 6 expires_at|"", 7 expire_ms|"",
# 8-11 the listing indexes' (see `_INDEX`).
_WRITE = (
    _INDEX
    + """
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[7] ~= '' then redis.call('PEXPIREAT', KEYS[1], ARGV[7]) end
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
end
if ARGV[6] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
else
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return 1
"""
)

# An expired record counts as absent even before Redis drops it, as in the SQL stores.
_CREATE = (
    """
local exp = redis.call('ZSCORE', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 and not (exp and tonumber(exp) <= tonumber(ARGV[3])) then
  return 0
end
local prev = nil
"""
    + _WRITE
)

# ARGV 12: the version the caller read.
_SAVE = (
    """
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local exp = redis.call('ZSCORE', KEYS[3], ARGV[1])
if exp and tonumber(exp) <= tonumber(ARGV[3]) then return 0 end
local stored = cjson.decode(cur)
if stored['version'] ~= tonumber(ARGV[12]) then return 0 end
local prev = stored['status']
if type(prev) ~= 'string' then prev = nil end
"""
    + _WRITE
)

# KEYS: claimable, expiry. ARGV: now, limit, record key prefix. Ids whose record Redis has
# already expired are dropped from `claimable` here, in the same atomic step that saw them
# missing, so a concurrent `create` of the same id cannot lose its index entry.
_CLAIMABLE = """
local now, limit, out, offset = tonumber(ARGV[1]), tonumber(ARGV[2]), {}, 0
while #out < limit do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', offset, limit)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    if redis.call('EXISTS', ARGV[3] .. id) == 0 then
      redis.call('ZREM', KEYS[1], id)
    else
      offset = offset + 1
      local exp = redis.call('ZSCORE', KEYS[2], id)
      if not exp or tonumber(exp) > now then
        out[#out + 1] = id
        if #out >= limit then break end
      end
    end
  end
end
return out
"""

# KEYS: claimable, expiry. ARGV: now, record key prefix, batch size. Counts ids whose TTL
# passed, whether or not Redis had already dropped the record key itself.
_PURGE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local p = ARGV[4]
for _, id in ipairs(ids) do
  local data = redis.call('GET', ARGV[2] .. id)
  if data then
    local record = cjson.decode(data)
    redis.call('ZREM', p .. 'f:' .. record['flow'], id)
    redis.call('ZREM', p .. 'sf:' .. record['status'] .. ':' .. record['flow'], id)
  end
  for _, s in ipairs({'working', 'input_required', 'completed', 'failed', 'cancelled'}) do
    redis.call('ZREM', p .. 's:' .. s, id)
  end
  redis.call('ZREM', p .. 'all', id)
  redis.call('ZREM', p .. 'ids', id)
  redis.call('DEL', ARGV[2] .. id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
return #ids
"""

# One page of a listing index, newest first. KEYS[1] the index. ARGV: 1 the highest score
# ('+inf', or the cursor's), 2 the cursor's id ('' none), 3 how many, 4 now, 5 record key
# prefix, 6 the expiry key, 7 a wait to match (`TaskQuery.waiting` past its status: timer,
# event, callback, nothing; '' any). Ids whose record Redis has expired are dropped from the index.
_LIST = """
local function waits(data, kind)
  if kind == '' or kind == 'input' then return true end
  local marker = kind == 'timer' and '"kind":"timer"' or '"kind":"event"'
  local present = string.find(data, marker, 1, true)
  if kind ~= 'nothing' and not present then return false end
  if kind == 'nothing' and not present and not string.find(data, '"kind":"timer"', 1, true) then return true end
  local w = cjson.decode(data)['waiting']
  if type(w) ~= 'table' then return kind == 'nothing' end
  if kind == 'nothing' then return #w == 0 end
  for _, x in ipairs(w) do
    if kind == 'timer' and x['kind'] == 'timer' then return true end
    if kind == 'callback' and x['via'] == 'callback' then return true end
    if kind == 'event' and x['kind'] == 'event' and x['via'] == nil then return true end
  end
  return false
end
local want, now, out, offset = tonumber(ARGV[3]), tonumber(ARGV[4]), {}, 0
local top = ARGV[1] ~= '+inf' and tonumber(ARGV[1]) or nil
while #out < want do
  local rows = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[1], '-inf', 'WITHSCORES', 'LIMIT', offset, want)
  if #rows == 0 then break end
  for i = 1, #rows, 2 do
    local id, score = rows[i], tonumber(rows[i + 1])
    offset = offset + 1
    if not (top and ARGV[2] ~= '' and score == top and id >= ARGV[2]) then
      local data = redis.call('GET', ARGV[5] .. id)
      if not data then
        redis.call('ZREM', KEYS[1], id)
        offset = offset - 1
      else
        local exp = redis.call('ZSCORE', ARGV[6], id)
        if (not exp or tonumber(exp) > now) and waits(data, ARGV[7]) then
          out[#out + 1] = data
          if #out >= want then break end
        end
      end
    end
  end
end
return out
"""

# Index the records written before the listing indexes existed, a batch of ids at a time, in
# one atomic step each (so a concurrent write's own indexing cannot be undone by a stale read).
# ARGV: 1 record key prefix, 2 the `by:` prefix, 3... ids. Ids already indexed are skipped.
_BACKFILL = """
local p, n = ARGV[2], 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if not redis.call('ZSCORE', p .. 'ids', id) then
    local data = redis.call('GET', ARGV[1] .. id)
    if data then
      local r = cjson.decode(data)
      local c = string.format('%.17g', r['created_at'])
      redis.call('ZADD', p .. 'all', c, id)
      redis.call('ZADD', p .. 's:' .. r['status'], c, id)
      redis.call('ZADD', p .. 'f:' .. r['flow'], c, id)
      redis.call('ZADD', p .. 'sf:' .. r['status'] .. ':' .. r['flow'], c, id)
      redis.call('ZADD', p .. 'ids', 0, id)
      redis.call('SADD', p .. 'flows', r['flow'])
      n = n + 1
    end
  end
end
return n
"""

_PURGE_BATCH = 500
T = TypeVar("T")

# The replay guard's ledger (mrtr._guard): one hash per round (d digest, o owner, l lease
# until, r outcome; n the round its outcome handed out, s "a step finished in it", x "on a
# branch a client left by going Back"), expired by Redis itself. Leases are on the Redis
# server's clock (TIME), so no instance's wall clock matters. A round's key carries its flow's
# id as a hash tag, so that a rewind reaches every round of the flow on one cluster slot.
# KEYS[1] the round. ARGV: digest, owner, lease, expire ms.
_CLAIM_ROUND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local e = redis.call('HMGET', KEYS[1], 'd', 'l', 'r', 'x')
if e[4] then return {'superseded'} end
if not e[1] then
  redis.call('HSET', KEYS[1], 'd', ARGV[1], 'o', ARGV[2], 'l', string.format('%.6f', now + tonumber(ARGV[3])))
  redis.call('PEXPIREAT', KEYS[1], ARGV[4])
  return {'claimed'}
end
if e[1] ~= ARGV[1] then return {'forked'} end
if e[3] then return {'done', e[3]} end
if tonumber(e[2]) < now then
  redis.call('HSET', KEYS[1], 'o', ARGV[2], 'l', string.format('%.6f', now + tonumber(ARGV[3])))
  return {'claimed'}
end
return {'busy'}
"""

# KEYS[1] the round. ARGV: owner, lease (renew) or outcome (finish), mode, next round's key, stepped.
_TOUCH_ROUND = """
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'r') == 1 then return 0 end
if ARGV[3] == 'renew' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  redis.call('HSET', KEYS[1], 'l', string.format('%.6f', now + tonumber(ARGV[2])))
else
  redis.call('HSET', KEYS[1], 'r', ARGV[2])
  if ARGV[4] and ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'n', ARGV[4]) end
  if ARGV[5] == '1' then redis.call('HSET', KEYS[1], 's', '1') end
end
return 1
"""

# A round's outcome and its flow's next claim in one script (the guard holds the outcome of a
# round no step finished in for a moment, so that the next round carries it: one round trip a
# round). KEYS[1] the finished round, KEYS[2] the round to claim: one flow, so one slot.
# ARGV: owner, outcome, next round's key, stepped, then the claim's digest, lease, expire ms.
_FINISH_AND_CLAIM = """
if redis.call('HGET', KEYS[1], 'o') == ARGV[1] and redis.call('HEXISTS', KEYS[1], 'r') == 0 then
  redis.call('HSET', KEYS[1], 'r', ARGV[2])
  if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'n', ARGV[3]) end
  if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 's', '1') end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local e = redis.call('HMGET', KEYS[2], 'd', 'l', 'r', 'x')
if e[4] then return {'superseded'} end
if not e[1] then
  redis.call('HSET', KEYS[2], 'd', ARGV[5], 'o', ARGV[1], 'l', string.format('%.6f', now + tonumber(ARGV[6])))
  redis.call('PEXPIREAT', KEYS[2], ARGV[7])
  return {'claimed'}
end
if e[1] ~= ARGV[5] then return {'forked'} end
if e[3] then return {'done', e[3]} end
if tonumber(e[2]) < now then
  redis.call('HSET', KEYS[2], 'o', ARGV[1], 'l', string.format('%.6f', now + tonumber(ARGV[6])))
  return {'claimed'}
end
return {'busy'}
"""

# "Back": other answers take a finished round over when neither it nor any later round of its
# branch (followed through n, on the flow's slot) finished a step or is unaccounted for; every
# later round is then marked superseded, the one handed out but never claimed included.
# Everything is checked before the first write. KEYS[1] the round. ARGV: digest, owner, lease,
# expire ms.
_REWIND_ROUND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local e = redis.call('HMGET', KEYS[1], 'd', 'l', 'r', 'x', 's', 'n')
if e[4] then return {'superseded'} end
if not e[1] then return {'retry'} end
if e[1] == ARGV[1] then return {'same'} end
if not e[3] then
  if tonumber(e[2]) >= now then return {'busy'} end
  return {'forked'}
end
if e[5] then return {'forked'} end
local later = {}
local n = e[6]
while n do
  if #later > 100000 then return {'forked'} end
  local f = redis.call('HMGET', n, 'd', 'l', 'r', 'x', 's', 'n')
  if f[4] then break end
  later[#later + 1] = n
  if not f[1] then break end
  if not f[3] then
    if tonumber(f[2]) >= now then return {'busy'} end
    return {'forked'}
  end
  if f[5] then return {'forked'} end
  n = f[6]
end
for _, key in ipairs(later) do
  redis.call('HSET', key, 'x', '1')
  redis.call('PEXPIREAT', key, ARGV[4])
end
redis.call('HDEL', KEYS[1], 'r', 'n', 's')
redis.call('HSET', KEYS[1], 'd', ARGV[1], 'o', ARGV[2], 'l', string.format('%.6f', now + tonumber(ARGV[3])))
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return {'claimed'}
"""

# A claimed round's progress (`RoundProgress`): field p of the round's hash, written only by its
# owner while no outcome is recorded; it expires with the round. KEYS[1] the round. ARGV: owner, progress.
_PROGRESS_ROUND = """
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'r') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'p', ARGV[2])
return 1
"""


DEFAULT_SHARDS = 16
"""Shards of a cluster store's indexes (`RedisStore(shards=)`): every instance of a fleet must agree."""

_TRANSIENT = (
    redis_errors.ConnectionError,  # refused, reset, and BusyLoadingError (a restart reloading its AOF)
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,  # a replica, for a moment, during a failover
    redis_errors.TryAgainError,
    # A Redis Cluster during a failover: the slot's primary is gone and no replica is promoted yet.
    redis_errors.ClusterDownError,  # and MasterDownError
    redis_errors.SlotNotCoveredError,
    OSError,
)


def _connection_defaults() -> dict[str, Any]:
    # Bounded well below a client's timeout (30 s for FlowClient): a store that does not answer
    # is an error the client can retry, not a hang. redis-py's own default retries 3 times with
    # up to 10 s of backoff per call; here one quick retry (a dropped connection, reconnected).
    return {
        "socket_connect_timeout": 2.0,
        "socket_timeout": 3.0,
        "retry": Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.05), 1),
    }


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, _TRANSIENT)


_FANOUT = 64
"""Per-shard calls (of every fleet-wide read together) one store object has in flight at most: a
scan asks every shard, and many scans at once must not each take a connection per shard."""


@dataclass(frozen=True)
class _Shard:
    """The keys of one shard: every key a script touches for a task of this shard is in one slot."""

    records: str
    """Prefix of the record keys (`<records><task id>`)."""
    claimable: str
    expiry: str
    index: str
    """Prefix of the listing indexes (`all`, `s:<status>`, ...; see `_INDEX`)."""

    @classmethod
    def under(cls, base: str) -> _Shard:
        return cls(f"{base}task:", f"{base}claimable", f"{base}expiry", f"{base}by:")


@store_boundary("redis", _transient)
class RedisStore(SharedStore, RoundPipelining):
    """A `TaskStore` in Redis, one node or a cluster; several stores (processes) may share one prefix.

    Args:
        url: `redis://host:port/db` (or `rediss://`), or `redis+cluster://host:port[,host:port...]`
            (or `rediss+cluster://`) for a Redis Cluster: one seed node is enough.
        prefix: Namespace of every key (`mrtr:`).
        shards: On a cluster, how many hash slots the indexes are spread over (every store of a
            fleet must use the same number). Ignored on one node.
        redis_kwargs: Passed to redis-py's client (`Redis.from_url` or `RedisCluster`).

    A call made while Redis does not answer raises `mrtr.StoreUnavailable` (after the
    connection's timeouts: 2 s to connect, 3 s for a reply, unless `redis_kwargs` say
    otherwise); the connection pool reconnects by itself once Redis is back.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "mrtr:",
        shards: int = DEFAULT_SHARDS,
        **redis_kwargs: Any,
    ) -> None:
        self.prefix = prefix
        self.url = url
        self.cluster = is_cluster(url)
        self._redis_kwargs = redis_kwargs
        self._redis: Any = client(url, decode_responses=True, **(_connection_defaults() | redis_kwargs))
        if self.cluster:
            if "{" in prefix or "}" in prefix:
                raise ValueError(f"a cluster store's prefix may not hold braces (hash tags): {prefix!r}")
            if not 1 <= shards <= 256:
                raise ValueError(f"shards must be between 1 and 256, not {shards}")
            self._shards = [_Shard.under(f"{tag}:") for tag in shard_tags(prefix, shards)]
        else:
            self._shards = [_Shard.under(prefix)]
        self._fanout = asyncio.Semaphore(_FANOUT)
        self._indexed = self.cluster  # a cluster store was sharded from its first record: nothing to backfill
        self._create = self._redis.register_script(_CREATE)
        self._save = self._redis.register_script(_SAVE)
        self._claimable = self._redis.register_script(_CLAIMABLE)
        self._purge = self._redis.register_script(_PURGE)
        self._list = self._redis.register_script(_LIST)
        self._backfill = self._redis.register_script(_BACKFILL)
        self._claim_round = self._redis.register_script(_CLAIM_ROUND)
        self._touch_round = self._redis.register_script(_TOUCH_ROUND)
        self._rewind_round = self._redis.register_script(_REWIND_ROUND)
        self._finish_and_claim = self._redis.register_script(_FINISH_AND_CLAIM)
        self._progress_round = self._redis.register_script(_PROGRESS_ROUND)

    @property
    def where(self) -> str:
        """This store's URL, password redacted, for logs."""
        return redacted(self.url)

    def fleet_bus(self) -> BrokerBus | None:
        """The fleet bus on this store's Redis: `mrtr.open_bus(url)` with this store's namespace.

        None when the store was given connection options beyond its URL (the bus connects
        from the URL alone, so it could not reach the same server the same way).
        """
        if self._redis_kwargs:
            return None
        from mrtr.buses._redis import RedisBus

        return RedisBus(self.url, prefix=self.prefix)

    async def _each_shard(self, call: Callable[[_Shard], Awaitable[T]]) -> list[T]:
        """`call` on every shard, concurrently, at most `_FANOUT` at a time for this store object."""
        if len(self._shards) == 1:
            return [await call(self._shards[0])]

        async def bounded(shard: _Shard) -> T:
            async with self._fanout:
                return await call(shard)

        return list(await asyncio.gather(*(bounded(shard) for shard in self._shards)))

    async def _ready(self) -> None:
        """On a cluster, learn the slot map once before any command: redis-py's cluster client,
        initialised lazily by several commands at once, can break its connections for good."""
        if self.cluster:
            await self._redis.initialize()

    def shard_of(self, task_id: str) -> _Shard:
        """The shard holding `task_id`'s record and index entries (the only one on one node)."""
        if len(self._shards) == 1:
            return self._shards[0]
        return self._shards[zlib.crc32(task_id.encode("utf-8", "surrogatepass")) % len(self._shards)]

    def hot_keys(self) -> list[str]:
        """The fleet-wide keys every scan reads (`claimable` of each shard): for key-distribution reports."""
        return [shard.claimable for shard in self._shards]

    def _keys(self, task_id: str) -> list[str]:
        shard = self.shard_of(task_id)
        return [shard.records + task_id, shard.claimable, shard.expiry]

    def _write_args(self, record: TaskRecord, data: str, now: float) -> list[str]:
        expires_at = record.expires_at
        # Round the key's own expiry up: Redis must never drop a record the contract still
        # calls live; the scripts and `load` apply the exact `expires_at` themselves.
        expire_ms = "" if expires_at is None else str(math.ceil(expires_at * 1000))
        return [
            record.task_id,
            data,
            repr(now),
            "1" if record.claimable else "0",
            repr(float(record.lease_until)),
            "" if expires_at is None else repr(float(expires_at)),
            expire_ms,
            self.shard_of(record.task_id).index,
            record.status,
            record.flow,
            repr(float(record.created_at)),
        ]

    async def create(self, record: TaskRecord) -> None:
        await self._ready()
        args = self._write_args(record, record.to_json(), time.time())
        if not await self._create(keys=self._keys(record.task_id), args=args):
            raise TaskExists(record.task_id)

    async def load(self, task_id: str, now: float) -> TaskRecord | None:
        await self._ready()
        data = await self._redis.get(self.shard_of(task_id).records + task_id)
        if data is None:
            return None
        record = TaskRecord.from_json(data)
        expires_at = record.expires_at
        return None if expires_at is not None and expires_at <= now else record

    async def load_many(self, task_ids: list[str], now: float) -> list[TaskRecord | None]:
        """`load` of each id in one round trip (`MGET`; on a cluster, one per node)."""
        await self._ready()
        if not task_ids:
            return []
        keys = [self.shard_of(task_id).records + task_id for task_id in task_ids]
        values = await (self._redis.mget_nonatomic(keys) if self.cluster else self._redis.mget(keys))
        found: list[TaskRecord | None] = []
        for data in values:
            record = None if data is None else TaskRecord.from_json(data)
            expires_at = None if record is None else record.expires_at
            found.append(None if record is None or (expires_at is not None and expires_at <= now) else record)
        return found

    async def save(self, record: TaskRecord) -> bool:
        await self._ready()
        expected = record.version
        args = self._write_args(record, record.copy(version=expected + 1).to_json(), time.time())
        if not await self._save(keys=self._keys(record.task_id), args=[*args, str(expected)]):
            return False
        record.version = expected + 1
        return True

    async def claimable(self, now: float, limit: int) -> list[str]:
        """Each shard's due ids (one range read per shard, concurrently), taken in turns up to `limit`,
        so a shard full of due work does not hide the others'."""
        if limit <= 0:
            return []
        await self._ready()
        found = await self._each_shard(
            lambda s: self._claimable(keys=[s.claimable, s.expiry], args=[repr(float(now)), str(limit), s.records])
        )
        if len(found) == 1:
            return list(found[0])
        out: list[str] = []
        for row in range(limit):
            for ids in found:
                if row < len(ids):
                    out.append(str(ids[row]))
            if len(out) >= limit or not any(row + 1 < len(ids) for ids in found):
                break
        return out[:limit]

    async def next_wake(self, now: float) -> float | None:
        """The earliest `lease_until` after `now` of a `working` task (one range read per shard)."""
        await self._ready()
        found = await self._each_shard(
            lambda s: self._redis.zrangebyscore(s.claimable, f"({now!r}", "+inf", start=0, num=1, withscores=True)
        )
        wakes = [float(rows[0][1]) for rows in found if rows]
        return min(wakes) if wakes else None

    # -- listing ----------------------------------------------------------------------------

    async def list_tasks(self, query: TaskQuery, now: float) -> TaskPage:
        await self._ready()
        await self._index_old_records()
        if query.id_prefix:  # a search: ids by ZRANGEBYLEX, in id order, one page
            return await self._search(query, now)
        after = read_cursor(query.cursor)
        chosen = wait_statuses(query)
        if chosen is None:
            return TaskPage([], None)
        statuses = chosen or (None,)
        top, after_id = (repr(after[0]), after[1]) if after is not None else ("+inf", "")
        before = query.created_before
        if before is not None and (after is None or before <= after[0]):
            top, after_id = repr(before), ""  # a score range: ties at `before` itself are dropped below
        wait = query.waiting or ""
        pages = [
            page
            for status in statuses
            for page in await self._each_shard(
                lambda shard, status=status: self._list(  # type: ignore[misc]
                    keys=[self._index_key(shard, status, query.flow)],
                    args=[top, after_id, str(query.limit + 1), repr(now), shard.records, shard.expiry, wait],
                )
            )
        ]
        records = [TaskRecord.from_json(data) for page in pages for data in page]
        if before is not None:
            records = [r for r in records if r.created_at < before]
        records.sort(key=lambda r: (r.created_at, r.task_id), reverse=True)
        shown = records[: query.limit]
        return TaskPage(shown, page_cursor(shown[-1]) if len(records) > query.limit else None)

    @staticmethod
    def _index_key(shard: _Shard, status: str | None, flow: str | None) -> str:
        if status is None:
            return f"{shard.index}all" if flow is None else f"{shard.index}f:{flow}"
        return f"{shard.index}s:{status}" if flow is None else f"{shard.index}sf:{status}:{flow}"

    async def _search(self, query: TaskQuery, now: float) -> TaskPage:
        prefix = query.id_prefix or ""
        per_shard = await self._each_shard(
            lambda shard: self._redis.zrangebylex(
                f"{shard.index}ids", f"[{prefix}", f"({prefix}\U0010ffff", start=0, num=query.limit * 4
            )
        )
        ids = list(heapq.merge(*(map(str, found) for found in per_shard)))[: query.limit * 4]
        found = []
        for record in await asyncio.gather(*(self.load(task_id, now) for task_id in ids)):
            if record is None or (query.statuses and record.status not in query.statuses):
                continue
            if query.waiting is not None and query.waiting not in waits_for(record):
                continue
            if query.created_before is not None and record.created_at >= query.created_before:
                continue
            if query.flow is None or record.flow == query.flow:
                found.append(record)
        return TaskPage(found[: query.limit], None)

    async def count_by_status(self, now: float) -> dict[str, int]:
        """Counts from the status indexes: tasks past their TTL count until the next purge (a minute at most)."""
        await self._ready()
        await self._index_old_records()
        pipe = self._redis.pipeline(transaction=False)
        for shard in self._shards:
            for status in STATUSES:
                pipe.zcard(self._index_key(shard, status, None))
        counts = await pipe.execute()
        totals: dict[str, int] = dict.fromkeys(STATUSES, 0)
        for i, n in enumerate(counts):
            totals[STATUSES[i % len(STATUSES)]] += int(n)
        return totals

    async def flows(self, now: float) -> list[str]:
        await self._ready()
        await self._index_old_records()
        found = await self._each_shard(lambda shard: self._redis.smembers(f"{shard.index}flows"))
        return sorted({str(flow) for flows in found for flow in flows})

    async def count_expired(self, now: float) -> int:
        await self._ready()
        found = await self._each_shard(lambda shard: self._redis.zcount(shard.expiry, "-inf", repr(float(now))))
        return sum(int(n) for n in found)

    async def _index_old_records(self) -> None:
        """Once per store object: index records written before the listing indexes existed (one node).

        A marker key says it was done for this prefix; until then one SCAN over the record keys,
        indexed a thousand at a time by a script that skips what writes already indexed.
        """
        if self._indexed:
            return
        (shard,) = self._shards
        marker = f"{shard.index}v1"
        if not await self._redis.exists(marker):
            batch: list[str] = []
            skip = len(shard.records)
            pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in shard.records) + "*"
            async for key in self._redis.scan_iter(match=pattern, count=1000):
                batch.append(str(key)[skip:])
                if len(batch) >= 1000:
                    await self._backfill(keys=[], args=[shard.records, shard.index, *batch])
                    batch = []
            if batch:
                await self._backfill(keys=[], args=[shard.records, shard.index, *batch])
            await self._redis.set(marker, "1")
        self._indexed = True

    async def purge_expired(self, now: float) -> int:
        await self._ready()

        # Batches keep each script short: a script blocks every other client of its node while it runs.
        async def purge(shard: _Shard) -> int:
            total = 0
            while True:
                args = [repr(float(now)), shard.records, str(_PURGE_BATCH), shard.index]
                n = int(await self._purge(keys=[shard.claimable, shard.expiry], args=args))
                total += n
                if n < _PURGE_BATCH:
                    return total

        return sum(await self._each_shard(purge))

    # -- the replay guard's ledger (see mrtr.stores._abilities.RoundLedger); Redis's clock ---------------

    async def clock(self) -> float:
        """Epoch seconds on the Redis server's clock (`TIME`), shared by every instance.

        On a cluster, the clock of the primary serving the first shard (the lease of a replay
        guard round is taken on its own node's clock, inside its script).
        """
        await self._ready()
        if self.cluster:
            node = self._redis.get_node_from_key(self._shards[0].claimable)
            seconds, micros = await self._redis.time(target_nodes=node)
        else:
            seconds, micros = await self._redis.time()
        return float(seconds) + float(micros) / 1_000_000

    def _round_key(self, round_id: str) -> str:
        # One key per round, its flow's id (what precedes the first ':') as the hash tag: the
        # rounds of one flow share a slot (a rewind follows them in one script), flows spread.
        flow, sep, rest = round_id.partition(":")
        return f"{self.prefix}round:{{{flow}}}{sep}{rest}"

    async def claim_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        await self._ready()
        args = [digest, owner, repr(float(lease)), str(math.ceil(expires_at * 1000))]
        reply = await self._claim_round(keys=[self._round_key(round_id)], args=args)
        return str(reply[0]), (str(reply[1]) if len(reply) > 1 else None)

    async def renew_round(self, round_id: str, owner: str, lease: float) -> bool:
        await self._ready()
        keys = [self._round_key(round_id)]
        return bool(await self._touch_round(keys=keys, args=[owner, repr(float(lease)), "renew"]))

    async def finish_round(self, round_id: str, owner: str, outcome: str) -> bool:
        await self._ready()
        keys = [self._round_key(round_id)]
        return bool(await self._touch_round(keys=keys, args=[owner, outcome, "finish"]))

    async def finish_round_linked(
        self, round_id: str, owner: str, outcome: str, next_round: str | None, stepped: bool
    ) -> bool:
        await self._ready()
        keys = [self._round_key(round_id)]
        link = "" if next_round is None else self._round_key(next_round)
        args = [owner, outcome, "finish", link, "1" if stepped else "0"]
        return bool(await self._touch_round(keys=keys, args=args))

    async def finish_and_claim(
        self,
        finished: str,
        outcome: str,
        next_round: str | None,
        stepped: bool,
        round_id: str,
        digest: str,
        owner: str,
        lease: float,
        expires_at: float,
    ) -> tuple[str, str | None]:
        """`finish_round_linked(finished, ...)` then `claim_round(round_id, ...)`, in one round trip.

        Both rounds must be of one flow (their keys share its slot on a cluster).
        """
        await self._ready()
        if finished.partition(":")[0] != round_id.partition(":")[0]:
            raise ValueError("finish_and_claim takes two rounds of one flow")
        link = "" if next_round is None else self._round_key(next_round)
        keys = [self._round_key(finished), self._round_key(round_id)]
        args = [owner, outcome, link, "1" if stepped else "0", digest, repr(float(lease))]
        reply = await self._finish_and_claim(keys=keys, args=[*args, str(math.ceil(expires_at * 1000))])
        return str(reply[0]), (str(reply[1]) if len(reply) > 1 else None)

    async def rewind_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        await self._ready()
        args = [digest, owner, repr(float(lease)), str(math.ceil(expires_at * 1000))]
        reply = await self._rewind_round(keys=[self._round_key(round_id)], args=args)
        return str(reply[0]), None

    async def save_round_progress(self, round_id: str, owner: str, progress: str) -> bool:
        await self._ready()
        keys = [self._round_key(round_id)]
        return bool(await self._progress_round(keys=keys, args=[owner, progress]))

    async def round_progress(self, round_id: str) -> str | None:
        await self._ready()
        value = await self._redis.hget(self._round_key(round_id), "p")
        return None if value is None else str(value)

    async def purge_rounds(self) -> int:
        return 0  # Redis expires each round's key itself

    async def close(self) -> None:
        await self._redis.aclose()


__all__ = [
    "DEFAULT_SHARDS",
    "RedisStore",
]
