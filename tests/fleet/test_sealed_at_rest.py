"""Sealed at rest (#36): what a task carries never lies in plain text in SQLite, Redis or PostgreSQL.

Each test runs real tasks on a real store (a SQLite file, the local Redis under a random prefix,
the local PostgreSQL in a random table) through `mrtr.Flows` and the official client, with
arguments, answers, step results, event payloads and results that carry distinctive strings;
then it dumps the store raw (the SQLite file with its WAL, every Redis key of the namespace, the
PostgreSQL table as text) and looks for them. Tools read the same store with and without the key
(`TaskAdmin`, the real `mrtr tasks` process). A control record written in plain text proves each
dump reaches the records' data.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from mrtr._engine import journal as journal_codec
from mrtr.client import CreatedTask, TasksClient, update_task
from mrtr.stores import RecordSeal, RecordSealed, SealedStore, TaskRecord, TaskStore, open_store
from mrtr.tasks import TaskAdmin, TaskSealed
from tests.support.flowkit import task_state
from tests.support.markers import backends
from tests.support.storekit import POSTGRES_DSN, REDIS_URL, cluster_url, drop_namespace, service_problem

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]  # the real `mrtr tasks` process


class Hotel(BaseModel):
    name: str


@dataclass
class Backend:
    kind: str
    url: str
    namespace: str | None
    path: Path | None = None

    def store(self) -> TaskStore:
        return open_store(self.url, namespace=self.namespace)

    def cli_args(self) -> list[str]:
        return ["--store", self.url, *(["--namespace", self.namespace] if self.namespace else [])]

    async def dump(self) -> bytes:
        """Everything the store holds, raw: what a backup, a replica or a stolen disk hands over."""
        if self.kind == "sqlite":
            assert self.path is not None
            files = [self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")]
            return b"".join(f.read_bytes() for f in files if f.exists())
        if self.kind in ("redis", "redis-cluster"):
            from mrtr._redisclient import client as redis_client

            client: Any = redis_client(self.url)
            parts: list[bytes] = []
            keys = [
                key
                for pattern in (f"{self.namespace}:*", f"{{{self.namespace}:*")
                async for key in client.scan_iter(match=pattern)
            ]
            try:
                for key in keys:
                    kind = (await client.type(key)).decode()
                    if kind == "string":
                        parts.append(await client.get(key) or b"")
                    elif kind == "zset":
                        parts.extend(m for m, _ in await client.zrange(key, 0, -1, withscores=True))
                    elif kind == "set":
                        parts.extend(await client.smembers(key))
                    elif kind == "hash":
                        for k, v in (await client.hgetall(key)).items():
                            parts.extend((k, v))
                    else:
                        parts.append(await client.dump(key) or b"")
                    parts.append(key)
            finally:
                await client.aclose()
            return b"\n".join(parts)
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            parts = []
            for table in (self.namespace, f"{self.namespace}_rounds"):
                cur = await conn.execute(f'SELECT t::text FROM "{table}" t')
                parts.extend(row[0].encode() for row in await cur.fetchall())
            return b"\n".join(parts)


@pytest.fixture(params=backends("sqlite", "redis", "redis-cluster", "postgres"))
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    kind: str = request.param
    if kind == "sqlite":
        path = tmp_path / "tasks.db"
        yield Backend("sqlite", f"sqlite:///{path}", None, path)
        return
    cluster = cluster_url(kind, request)
    if cluster is not None:
        namespace = f"mrtr_seal_{uuid.uuid4().hex[:10]}"
        try:
            yield Backend(kind, cluster, namespace)
        finally:
            await drop_namespace(kind, namespace, url=cluster)
        return
    problem = await service_problem(kind)
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{kind} is required under CI: {problem}")
        pytest.skip(f"{kind} not reachable: {problem}")
    namespace = f"mrtr_seal_{uuid.uuid4().hex[:10]}"
    try:
        yield Backend(kind, REDIS_URL if kind == "redis" else POSTGRES_DSN, namespace)
    finally:
        await drop_namespace(kind, namespace)


@dataclass
class Marks:
    """The distinctive strings one task run carries, each in another part of the record."""

    argument: str
    answer: str
    step: str
    event: str

    @classmethod
    def fresh(cls) -> Marks:
        tag = secrets.token_hex(6)
        return cls(f"ARG{tag}", f"ANSWER{tag}", f"STEP{tag}", f"EVENT{tag}")

    @property
    def result(self) -> str:
        return f"{self.answer}+{self.step}+{self.event}"

    def all(self) -> dict[str, str]:
        return {"argument": self.argument, "answer": self.answer, "step": self.step, "event": self.event}


def booking_flows(store: TaskStore, keys: bytes | list[bytes], **options: Any) -> mrtr.Flows:
    """A server sealing with `keys` (newest first): a flow that asks, steps and waits for an event."""
    ring = keys if isinstance(keys, list) else [keys]
    server = MCPServer("sealed-under-test", request_state_security=RequestStateSecurity(keys=ring))
    flows = mrtr.Flows(server, store=store, task_poll_interval=0.05, task_scan_interval=0.1, **options)

    @flows.tool(task="required")
    async def book(city: str, ctx: mrtr.FlowContext) -> str:
        hotel = await ctx.elicit(f"Which hotel in {city}?", Hotel)
        found = await ctx.step("lookup", lambda: f"STEP{city.removeprefix('ARG')}")
        paid = await ctx.wait_for_event("paid")
        return f"{hotel.name}+{found}+{paid['ref']}"

    return flows


async def _never(*args: Any) -> Any:
    raise AssertionError("task inputs go through tasks/update here")


def client_of(flows: mrtr.Flows) -> Client:
    """The official client, declaring elicitation (answered through `tasks/update` here) and tasks."""
    return Client(flows.server, extensions=[TasksClient(_never)], elicitation_callback=_never)


async def until(session: Any, task_id: str, status: str, timeout: float = 15.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            task = await task_state(session, task_id)
            if task["status"] == status:
                return task
            await asyncio.sleep(0.05)


async def run_booking(flows: mrtr.Flows, marks: Marks) -> str:
    """One task from creation to its result: an answer, a step, an event."""
    async with client_of(flows) as client:
        created = await client.session.call_tool("book", {"city": marks.argument}, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        asking = await until(client.session, created.task_id, "input_required")
        ((key, _),) = asking["inputRequests"].items()
        answer = {"action": "accept", "content": {"name": marks.answer}}
        await update_task(client.session, created.task_id, {key: answer})
        async with asyncio.timeout(15):
            while True:
                record = await flows.runtime.get(created.task_id)
                assert record is not None
                if record.waiting:
                    break
                await asyncio.sleep(0.05)
        assert await flows.send_event(created.task_id, "paid", {"ref": marks.event})
        done = await until(client.session, created.task_id, "completed")
        assert done["result"]["content"][0]["text"] == marks.result, "tasks/get opens what the store seals"
    await flows.runtime.close()
    return created.task_id


def cli(backend: Backend, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MRTR_STATE_KEY"}
    if key is not None:
        env["MRTR_STATE_KEY"] = key
    command = [sys.executable, "-m", "mrtr.cli", "tasks", *args, *backend.cli_args()]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)


def plain_record(task_id: str, argument: str) -> TaskRecord:
    now = time.time()
    return TaskRecord(
        task_id=task_id,
        flow="book",
        arguments={"city": argument},
        capabilities={},
        status="completed",
        created_at=now - 3600,
        updated_at=now - 3600,
        ttl_ms=None,
        poll_interval_ms=500,
        journal=journal_codec.encode(journal_codec.Journal.start()),
        result={"content": [{"type": "text", "text": argument}]},
    )


async def test_a_task_leaves_no_plaintext_in_the_store_and_tools_open_it_with_the_key(
    backend: Backend, tmp_path: Path
) -> None:
    key, marks = os.urandom(32), Marks.fresh()
    store = backend.store()
    try:
        task_id = await run_booking(booking_flows(store, key), marks)
        control = f"CONTROL{secrets.token_hex(6)}"
        await store.create(plain_record(f"plain-{uuid.uuid4().hex[:8]}", control))  # written as before #36
        dump = await backend.dump()
        assert control.encode() in dump, "the dump reaches the records' data"
        assert task_id.encode() in dump and b"book" in dump, "ids and flow names stay clear, for indexes"
        leaked = [name for name, text in marks.all().items() if text.encode() in dump]
        assert leaked == [], f"plain text at rest: {leaked}"

        keyed = TaskAdmin(store, seal=RecordSeal.from_keys([key]))
        record = await keyed.get(task_id)
        assert record is not None and not record.sealed
        assert record.arguments == {"city": marks.argument} and record.result is not None
        assert record.result["content"][0]["text"] == marks.result
        journal = journal_codec.decode(record.journal)
        assert [answer["content"] for _, answer in journal.answers.values()] == [{"name": marks.answer}]
        # the step's start (recorded before it runs: where and under which key) and its end
        assert [(e["kind"], e.get("phase")) for e in record.history] == [("step", "start"), ("step", "end")]

        keyless = await TaskAdmin(store).get(task_id)
        assert keyless is not None and keyless.sealed and keyless.status == "completed"
        assert keyless.arguments == {} and keyless.result is None and keyless.journal == ""
        page = await TaskAdmin(store).list_tasks()
        assert {r.task_id: r.sealed for r in page.records} == {task_id: True, f"{page.records[-1].task_id}": False}
    finally:
        await store.close()

    shown = await asyncio.to_thread(cli, backend, "show", task_id, key=key.hex())
    assert shown.returncode == 0, shown.stderr
    for text in (marks.argument, marks.answer, marks.step, marks.result):
        assert text in shown.stdout, (text, shown.stdout)
    blind = await asyncio.to_thread(cli, backend, "show", task_id, "--json")
    assert blind.returncode == 0, blind.stderr
    assert '"sealed": true' in blind.stdout and '"arguments": "sealed"' in blind.stdout
    assert "v1." not in blind.stdout, "never the ciphertext as if it were data"
    assert not [text for text in marks.all().values() if text in blind.stdout]
    listed = await asyncio.to_thread(cli, backend, "ls", "--json")
    assert listed.returncode == 0 and task_id in listed.stdout, listed.stderr
    key_file = tmp_path / "ring"
    key_file.write_text(f"{os.urandom(32).hex()}\n{key.hex()}\n")  # a ring in a file: one key a line, newest first
    filed = await asyncio.to_thread(cli, backend, "show", task_id, "--key-file", str(key_file))
    assert filed.returncode == 0 and marks.result in filed.stdout, filed.stdout + filed.stderr
    wrong = await asyncio.to_thread(cli, backend, "show", task_id, key=os.urandom(32).hex())
    assert wrong.returncode == 0 and "sealed at rest" in wrong.stdout and marks.argument not in wrong.stdout


async def test_a_store_written_before_sealing_completes_its_tasks_after_the_upgrade(backend: Backend) -> None:
    key, marks = os.urandom(32), Marks.fresh()
    store = backend.store()
    try:
        before = booking_flows(store, key, seal_at_rest=False)  # an mrtr without sealing: plain records
        async with client_of(before) as client:
            created = await client.session.call_tool("book", {"city": marks.argument}, allow_claimed=True)
            asking = await until(client.session, created.task_id, "input_required")
        await before.runtime.close()
        assert marks.argument.encode() in await backend.dump(), "the old instance wrote it plain"

        after = booking_flows(store, key)  # upgraded: sealed by default
        async with client_of(after) as client:
            ((ask, _),) = asking["inputRequests"].items()
            answer = {"action": "accept", "content": {"name": marks.answer}}
            await update_task(client.session, created.task_id, {ask: answer})
            async with asyncio.timeout(15):
                while not (record := await after.runtime.get(created.task_id)) or not record.waiting:
                    await asyncio.sleep(0.05)
            await after.send_event(created.task_id, "paid", {"ref": marks.event})
            done = await until(client.session, created.task_id, "completed")
        assert done["result"]["content"][0]["text"] == marks.result
        await after.runtime.close()
        dump = await backend.dump()
        leaked = [name for name, text in marks.all().items() if text.encode() in dump]
        assert backend.kind == "sqlite" or leaked == [], f"rewritten sealed: {leaked}"
        stored = await store.load(created.task_id, time.time())
        assert stored is not None and stored.sealed, "its next write sealed it"
    finally:
        await store.close()


async def test_a_rotation_reads_every_record_and_after_reseal_the_old_key_can_leave(backend: Backend) -> None:
    old, new = os.urandom(32), os.urandom(32)
    first, second = Marks.fresh(), Marks.fresh()
    store = backend.store()
    try:
        old_task = await run_booking(booking_flows(store, old), first)
        plain_id = f"plain-{uuid.uuid4().hex[:8]}"
        await store.create(plain_record(plain_id, f"CONTROL{secrets.token_hex(4)}"))
        rotated = booking_flows(store, [new, old])  # the new key seals, the old one still opens
        new_task = await run_booking(rotated, second)
        ring = TaskAdmin(store, seal=RecordSeal.from_keys([new, old]))
        for task_id in (old_task, new_task, plain_id):
            record = await ring.get(task_id)
            assert record is not None and not record.sealed, task_id
        only_new = TaskAdmin(store, seal=RecordSeal.from_keys([new]))
        assert (await only_new.get(old_task)).sealed, "before the reseal, the old key is still needed"  # type: ignore[union-attr]
    finally:
        await store.close()

    keyless = await asyncio.to_thread(cli, backend, "reseal")
    assert keyless.returncode == 2 and "needs the key ring" in keyless.stderr, keyless.stdout + keyless.stderr
    resealed = await asyncio.to_thread(cli, backend, "reseal", "--batch", "1", key=f"{new.hex()},{old.hex()}")
    assert resealed.returncode == 0, resealed.stdout + resealed.stderr
    assert "2 rewritten" in resealed.stdout and "1 already were" in resealed.stdout, resealed.stdout

    store = backend.store()
    try:
        only_new = TaskAdmin(store, seal=RecordSeal.from_keys([new]))
        for task_id, marks in ((old_task, first), (new_task, second)):
            record = await only_new.get(task_id)
            assert record is not None and not record.sealed and record.arguments == {"city": marks.argument}
        plain = await store.load(plain_id, time.time())
        assert plain is not None and plain.sealed, "reseal seals plain records too"
        with pytest.raises(TaskSealed):
            await TaskAdmin(store).rerun(old_task)
    finally:
        await store.close()


async def test_a_sealed_payload_copied_onto_another_task_does_not_open() -> None:
    key = os.urandom(32)
    seal = RecordSeal.from_keys([key])
    store = SealedStore(open_store("sqlite:///:memory:"), seal)
    try:
        a, b = plain_record("task-a", "ARGa"), plain_record("task-b", "ARGb")
        await store.create(a)
        await store.create(b)
        raw_a = await store.inner.load("task-a", time.time())
        raw_b = await store.inner.load("task-b", time.time())
        assert raw_a is not None and raw_b is not None
        forged = raw_b.copy(extras=dict(raw_a.extras))
        with pytest.raises(RecordSealed, match="another task"):
            seal.open(forged)
    finally:
        await store.close()


async def test_an_instance_whose_ring_cannot_open_a_task_leaves_it_for_one_that_can(tmp_path: Path) -> None:
    """Never a flow run from an empty journal: the task waits, untouched, for an instance with the key."""
    old, other = os.urandom(32), os.urandom(32)
    path = tmp_path / "tasks.db"
    writer = SealedStore(open_store(f"sqlite:///{path}"), RecordSeal.from_keys([old]))
    orphan = plain_record("orphan", "ARGorphan").copy(
        status="working", result=None, capabilities={"elicitation": {"form": {}}}, lease_until=0.0
    )
    await writer.create(orphan)
    await writer.close()

    store = open_store(f"sqlite:///{path}")
    blind = booking_flows(store, [other])
    try:
        with pytest.raises(MCPError) as refused:
            await blind.runtime.get("orphan")
        assert refused.value.error.data == {"reason": "task_sealed"}, "retryable, never an empty task"
        with pytest.raises(RecordSealed, match="no key of the ring opens it"):
            await blind.runtime.store.load("orphan", time.time())
        assert await blind.runtime.worker.scan_once() == 0, "not claimed, not failed"
        untouched = await store.load("orphan", time.time())
        assert untouched is not None and untouched.version == 0 and untouched.sealed
    finally:
        await blind.runtime.close()
        await store.close()

    store = open_store(f"sqlite:///{path}")
    keyed = booking_flows(store, [other, old])  # a ring with the key it was sealed under
    try:
        assert await keyed.runtime.worker.scan_once() == 1
        async with asyncio.timeout(10):
            while (record := await keyed.runtime.get("orphan")) is None or record.status != "input_required":
                await asyncio.sleep(0.05)
        ((ask, _),) = record.input_requests.items()
        assert "ARGorphan" in record.input_requests[ask]["params"]["message"]
    finally:
        await keyed.runtime.close()
        await store.close()
