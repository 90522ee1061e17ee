"""`RedisStore`: tasks for a fleet that already runs Redis.

Layout under `prefix`: one string key per task (`task:<id>`, the record's JSON including
its version) that Redis itself expires at the record's `expires_at`; a sorted set
`claimable` of `working` task ids scored by `lease_until`, so finding work is one range
scan; and a sorted set `expiry` of ids scored by `expires_at`, so the TTL check inside a
script and `purge_expired` need neither the clock of the Redis server nor a JSON parse.

Every write is one Lua script: the version check, the record write and both index
updates happen as one atomic step, and each script checks everything before its first
write (Redis does not roll back a script that fails halfway). The scripts build record
keys from the prefix, so this store needs a single Redis (or one cluster slot), not a
sharded cluster.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

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

if TYPE_CHECKING:
    from mrtr.buses._base import BrokerBus

# The listing indexes (the console, `mrtr tasks`), all sorted sets scored by `created_at`
# under `<prefix>by:`: `all`; `s:<status>`; `f:<flow>`; `sf:<status>:<flow>`; plus `ids`
# (every id at score 0, for prefix search by ZRANGEBYLEX) and the set `flows`. ARGV: 1 id,
# 8 the `by:` prefix, 9 status, 10 flow, 11 created_at.
_INDEX = """
local p = ARGV[8]
for _, s in ipairs({'working', 'input_required', 'completed', 'failed', 'cancelled'}) do
  if s ~= ARGV[9] then
    redis.call('ZREM', p .. 's:' .. s, ARGV[1])
    redis.call('ZREM', p .. 'sf:' .. s .. ':' .. ARGV[10], ARGV[1])
  end
end
redis.call('ZADD', p .. 'all', ARGV[11], ARGV[1])
redis.call('ZADD', p .. 's:' .. ARGV[9], ARGV[11], ARGV[1])
redis.call('ZADD', p .. 'f:' .. ARGV[10], ARGV[11], ARGV[1])
redis.call('ZADD', p .. 'sf:' .. ARGV[9] .. ':' .. ARGV[10], ARGV[11], ARGV[1])
redis.call('ZADD', p .. 'ids', 0, ARGV[1])
redis.call('SADD', p .. 'flows', ARGV[10])
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
if cjson.decode(cur)['version'] ~= tonumber(ARGV[12]) then return 0 end
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

# The replay guard's ledger (mrtr._guard): one hash per round (d digest, o owner, l lease
# until, r outcome), expired by Redis itself. Leases are on the Redis server's clock (TIME),
# so no instance's wall clock matters. KEYS[1] the round. ARGV: digest, owner, lease, expire ms.
_CLAIM_ROUND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local e = redis.call('HMGET', KEYS[1], 'd', 'l', 'r')
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

# KEYS[1] the round. ARGV: owner, lease (renew) or outcome (finish), mode.
_TOUCH_ROUND = """
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], 'r') == 1 then return 0 end
if ARGV[3] == 'renew' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  redis.call('HSET', KEYS[1], 'l', string.format('%.6f', now + tonumber(ARGV[2])))
else
  redis.call('HSET', KEYS[1], 'r', ARGV[2])
end
return 1
"""


class RedisStore:
    """A `TaskStore` in Redis; several stores (processes) may share one prefix."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, prefix: str = "mrtr:", **redis_kwargs: Any) -> None:
        self.prefix = prefix
        self.url = url
        self._redis_kwargs = redis_kwargs
        self._redis = aioredis.Redis.from_url(url, decode_responses=True, **redis_kwargs)
        self._record_prefix = f"{prefix}task:"
        self._claim_key = f"{prefix}claimable"
        self._expiry_key = f"{prefix}expiry"
        self._index_prefix = f"{prefix}by:"
        self._indexed = False
        self._create = self._redis.register_script(_CREATE)
        self._save = self._redis.register_script(_SAVE)
        self._claimable = self._redis.register_script(_CLAIMABLE)
        self._purge = self._redis.register_script(_PURGE)
        self._list = self._redis.register_script(_LIST)
        self._backfill = self._redis.register_script(_BACKFILL)
        self._claim_round = self._redis.register_script(_CLAIM_ROUND)
        self._touch_round = self._redis.register_script(_TOUCH_ROUND)

    def fleet_bus(self) -> BrokerBus | None:
        """The fleet bus on this store's Redis: `mrtr.open_bus(url)` with this store's namespace.

        None when the store was given connection options beyond its URL (the bus connects
        from the URL alone, so it could not reach the same server the same way).
        """
        if self._redis_kwargs:
            return None
        from mrtr.buses._redis import RedisBus

        return RedisBus(self.url, prefix=self.prefix)

    def _keys(self, task_id: str) -> list[str]:
        return [self._record_prefix + task_id, self._claim_key, self._expiry_key]

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
            self._index_prefix,
            record.status,
            record.flow,
            repr(float(record.created_at)),
        ]

    async def create(self, record: TaskRecord) -> None:
        args = self._write_args(record, record.to_json(), time.time())
        if not await self._create(keys=self._keys(record.task_id), args=args):
            raise TaskExists(record.task_id)

    async def load(self, task_id: str, now: float) -> TaskRecord | None:
        data = await self._redis.get(self._record_prefix + task_id)
        if data is None:
            return None
        record = TaskRecord.from_json(data)
        expires_at = record.expires_at
        return None if expires_at is not None and expires_at <= now else record

    async def save(self, record: TaskRecord) -> bool:
        expected = record.version
        args = self._write_args(record, record.copy(version=expected + 1).to_json(), time.time())
        if not await self._save(keys=self._keys(record.task_id), args=[*args, str(expected)]):
            return False
        record.version = expected + 1
        return True

    async def claimable(self, now: float, limit: int) -> list[str]:
        if limit <= 0:
            return []
        args = [repr(float(now)), str(limit), self._record_prefix]
        return list(await self._claimable(keys=[self._claim_key, self._expiry_key], args=args))

    async def next_wake(self, now: float) -> float | None:
        """The earliest `lease_until` after `now` of a `working` task (one sorted-set range read)."""
        found = await self._redis.zrangebyscore(self._claim_key, f"({now!r}", "+inf", start=0, num=1, withscores=True)
        return float(found[0][1]) if found else None

    # -- listing ----------------------------------------------------------------------------

    async def list_tasks(self, query: TaskQuery, now: float) -> TaskPage:
        await self._index_old_records()
        if query.id_prefix:  # a search: ids by ZRANGEBYLEX, in id order, one page
            return await self._search(query, now)
        after = read_cursor(query.cursor)
        chosen = wait_statuses(query)
        if chosen is None:
            return TaskPage([], None)
        statuses = chosen or (None,)
        keys = [self._index_key(status, query.flow) for status in statuses]
        top, after_id = (repr(after[0]), after[1]) if after is not None else ("+inf", "")
        before = query.created_before
        if before is not None and (after is None or before <= after[0]):
            top, after_id = repr(before), ""  # a score range: ties at `before` itself are dropped below
        wait = query.waiting or ""
        pages = await asyncio.gather(
            *(
                self._list(
                    keys=[key],
                    args=[top, after_id, str(query.limit + 1), repr(now), self._record_prefix, self._expiry_key, wait],
                )
                for key in keys
            )
        )
        records = [TaskRecord.from_json(data) for page in pages for data in page]
        if before is not None:
            records = [r for r in records if r.created_at < before]
        records.sort(key=lambda r: (r.created_at, r.task_id), reverse=True)
        shown = records[: query.limit]
        return TaskPage(shown, page_cursor(shown[-1]) if len(records) > query.limit else None)

    def _index_key(self, status: str | None, flow: str | None) -> str:
        if status is None:
            return f"{self._index_prefix}all" if flow is None else f"{self._index_prefix}f:{flow}"
        return f"{self._index_prefix}s:{status}" if flow is None else f"{self._index_prefix}sf:{status}:{flow}"

    async def _search(self, query: TaskQuery, now: float) -> TaskPage:
        prefix = query.id_prefix or ""
        ids = await self._redis.zrangebylex(
            f"{self._index_prefix}ids", f"[{prefix}", f"({prefix}\U0010ffff", start=0, num=query.limit * 4
        )
        found = []
        for record in await asyncio.gather(*(self.load(str(task_id), now) for task_id in ids)):
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
        await self._index_old_records()
        pipe = self._redis.pipeline(transaction=False)
        for status in STATUSES:
            pipe.zcard(self._index_key(status, None))
        counts = await pipe.execute()
        return {status: int(n) for status, n in zip(STATUSES, counts, strict=True)}

    async def flows(self, now: float) -> list[str]:
        await self._index_old_records()
        return sorted(str(flow) for flow in await self._redis.smembers(f"{self._index_prefix}flows"))

    async def count_expired(self, now: float) -> int:
        return int(await self._redis.zcount(self._expiry_key, "-inf", repr(float(now))))

    async def _index_old_records(self) -> None:
        """Once per store object: index records written before the listing indexes existed.

        A marker key says it was done for this prefix; until then one SCAN over the record keys,
        indexed a thousand at a time by a script that skips what writes already indexed.
        """
        if self._indexed:
            return
        marker = f"{self._index_prefix}v1"
        if not await self._redis.exists(marker):
            batch: list[str] = []
            skip = len(self._record_prefix)
            pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in self._record_prefix) + "*"
            async for key in self._redis.scan_iter(match=pattern, count=1000):
                batch.append(str(key)[skip:])
                if len(batch) >= 1000:
                    await self._backfill(keys=[], args=[self._record_prefix, self._index_prefix, *batch])
                    batch = []
            if batch:
                await self._backfill(keys=[], args=[self._record_prefix, self._index_prefix, *batch])
            await self._redis.set(marker, "1")
        self._indexed = True

    async def purge_expired(self, now: float) -> int:
        # Batches keep each script short: a script blocks every other Redis client while it runs.
        total = 0
        while True:
            args = [repr(float(now)), self._record_prefix, str(_PURGE_BATCH), self._index_prefix]
            n = int(await self._purge(keys=[self._claim_key, self._expiry_key], args=args))
            total += n
            if n < _PURGE_BATCH:
                return total

    # -- the replay guard's ledger (see mrtr._guard.RoundLedger); Redis's clock ---------------

    async def clock(self) -> float:
        """Epoch seconds on the Redis server's clock (`TIME`), shared by every instance."""
        seconds, micros = await self._redis.time()
        return seconds + micros / 1_000_000

    async def claim_round(
        self, round_id: str, digest: str, owner: str, lease: float, expires_at: float
    ) -> tuple[str, str | None]:
        args = [digest, owner, repr(float(lease)), str(math.ceil(expires_at * 1000))]
        reply = await self._claim_round(keys=[f"{self.prefix}round:{round_id}"], args=args)
        return str(reply[0]), (str(reply[1]) if len(reply) > 1 else None)

    async def renew_round(self, round_id: str, owner: str, lease: float) -> bool:
        keys = [f"{self.prefix}round:{round_id}"]
        return bool(await self._touch_round(keys=keys, args=[owner, repr(float(lease)), "renew"]))

    async def finish_round(self, round_id: str, owner: str, outcome: str) -> bool:
        keys = [f"{self.prefix}round:{round_id}"]
        return bool(await self._touch_round(keys=keys, args=[owner, outcome, "finish"]))

    async def purge_rounds(self) -> int:
        return 0  # Redis expires each round's key itself

    async def close(self) -> None:
        await self._redis.aclose()


__all__ = [
    "RedisStore",
]
