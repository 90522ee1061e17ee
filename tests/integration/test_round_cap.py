"""Past the round cap, a call continues as a task (issue 46): a loop of 13 asks on clients capped at 10.

The official `mcp.Client` stops after `input_required_max_rounds=10` rounds, and so does mrtr's
inline default (`max_rounds=10`). A client that declared the tasks extension is not stopped: a
tool that can be a task continues as one where another inline round would pass the cap, with
every answer kept, and its later questions go through `tasks/get` and `tasks/update`, which no
client caps. A task's own cap is `task_max_rounds` (1000), not the inline 10. A client that
did not declare the extension gets an error naming the cap, the rounds used and the way out.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import anyio
import mcp_types as t
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

import mrtr
from mrtr.client import FlowClient, TasksClient
from mrtr.stores._sqlite import SQLiteStore
from tests.support.flowkit import accept, new_server

pytestmark = pytest.mark.anyio

ITEMS = 13


class Amount(BaseModel):
    euros: int


def loop_server(runs: Counter[str]) -> Any:
    """One loop of 13 asks, three ways: inline first (then a task), a task from the start, never a task."""
    server = new_server("round-cap")
    flows = mrtr.Flows(server, store=SQLiteStore(":memory:"), task_poll_interval=0.02)

    async def expenses(ctx: mrtr.FlowContext) -> str:
        amounts = [(await ctx.elicit(f"Item {i}: how many euros?", Amount)).euros for i in range(ITEMS)]
        total = sum(amounts)
        await ctx.step("book", lambda: runs.update(["book"]))
        return f"{len(amounts)} items, {total} euros"

    flows.tool(name="inline_first", task="optional", mrtr_first=True)(expenses)
    flows.tool(name="as_task", task="optional")(expenses)
    flows.tool(name="never_task")(expenses)
    return server


class Asker:
    """Answers item i with i euros and counts every question it is asked."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()

    async def elicit(self, params: t.ElicitRequestParams) -> t.ElicitResult:
        self.asked[params.message] += 1
        return accept(euros=int(params.message.split()[1].rstrip(":")))

    async def callback(self, context: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        return await self.elicit(params)

    def each_once(self) -> bool:
        return self.asked == Counter({f"Item {i}: how many euros?": 1 for i in range(ITEMS)})


EXPECTED = f"{ITEMS} items, {sum(range(ITEMS))} euros"


@pytest.mark.parametrize("tool", ["inline_first", "as_task"])
async def test_a_13_ask_loop_completes_for_flowclient_with_tasks(tool: str) -> None:
    runs: Counter[str] = Counter()
    asker = Asker()
    statuses: list[str] = []
    async with FlowClient(
        loop_server(runs), elicit=asker.elicit, tasks=True, on_task=lambda s: statuses.append(s.status)
    ) as flows:
        result = await flows.call_tool(tool, {})
    assert not result.is_error and result.content[0].text == EXPECTED, result  # type: ignore[union-attr]
    assert asker.each_once(), asker.asked
    assert runs["book"] == 1
    assert statuses[-1] == "completed"


async def test_a_13_ask_loop_completes_for_flowclient_over_http() -> None:
    """The same over a real socket (mrtr's own per-request transport, a listen stream for the task)."""
    from tests.support.flowkit import served

    runs: Counter[str] = Counter()
    asker = Asker()
    async with served(loop_server(runs)) as url, FlowClient(url, elicit=asker.elicit, tasks=True) as flows:
        result = await flows.call_tool("inline_first", {})
    assert not result.is_error and result.content[0].text == EXPECTED, result  # type: ignore[union-attr]
    assert asker.each_once(), asker.asked
    assert runs["book"] == 1


@pytest.mark.parametrize("tool", ["inline_first", "as_task"])
async def test_a_13_ask_loop_completes_for_the_official_client_at_its_default_cap(tool: str) -> None:
    """`mcp.Client` (its `input_required_max_rounds` left at 10) with mrtr's `TasksClient` extension."""
    runs: Counter[str] = Counter()
    asker = Asker()
    extension = TasksClient(elicitation_callback=asker.callback)
    async with Client(loop_server(runs), extensions=[extension], elicitation_callback=asker.callback) as client:
        assert client.input_required_max_rounds == 10
        result = await client.call_tool(tool, {})
    assert not result.is_error and result.content[0].text == EXPECTED, result  # type: ignore[union-attr]
    assert asker.each_once(), asker.asked
    assert runs["book"] == 1


async def test_the_call_becomes_a_task_exactly_where_another_inline_round_would_pass_the_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ten inline rounds, then the eleventh question is the task's: the client never sees an eleventh round."""
    rounds: list[int] = []
    asker = Asker()
    with caplog.at_level(logging.INFO, logger="mrtr.engine"):
        async with FlowClient(
            loop_server(Counter()), elicit=asker.elicit, tasks=True, on_round=lambda r: rounds.append(r.number)
        ) as flows:
            result = await flows.call_tool("inline_first", {})
    assert result.content[0].text == EXPECTED  # type: ignore[union-attr]
    assert rounds == list(range(1, 11)), "ten inline rounds, the most max_rounds=10 allows"
    assert asker.each_once()
    switched = "reached its round cap (max_rounds=10) inline; continues as a durable task"
    assert any(switched in m for m in caplog.messages)


async def test_without_the_tasks_extension_the_error_names_the_cap_the_rounds_and_the_way_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    asker = Asker()
    with caplog.at_level(logging.DEBUG, logger="mrtr.engine"):
        async with Client(loop_server(Counter()), elicitation_callback=asker.callback) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("inline_first", {})
    error = caught.value.error
    assert error.code == -32602
    assert error.data == {"reason": "too_many_rounds", "flow": "inline_first", "maxRounds": 10, "roundsUsed": 10}
    assert "asked for client input in 10 rounds, the most max_rounds=10 allows" in error.message
    assert "declare the io.modelcontextprotocol/tasks extension" in error.message
    assert "input_required_max_rounds=10" in error.message
    assert sum(asker.asked.values()) == 10, "each of the ten rounds asked one question, none twice"
    # The optional task ran inline, and the debug log says so, once per call.
    inline = [m for m in caplog.messages if "task='optional' runs inline" in m]
    assert len(inline) == 1 and "did not declare the io.modelcontextprotocol/tasks extension" in inline[0], inline


async def test_a_tool_that_is_never_a_task_says_how_to_let_it_continue_as_one() -> None:
    asker = Asker()
    async with FlowClient(loop_server(Counter()), elicit=asker.elicit, tasks=True) as flows:
        with pytest.raises(MCPError) as caught:
            await flows.call_tool("never_task", {})
    error = caught.value.error
    assert error.data == {"reason": "too_many_rounds", "flow": "never_task", "maxRounds": 10, "roundsUsed": 10}
    assert "raise max_rounds= (Flows or the decorator) and the client's own cap with it" in error.message
    assert "task='optional'" in error.message


async def test_a_13_ask_loop_completes_for_fastmcp_client_at_its_default_cap_on_the_fastmcp_host() -> None:
    """`fastmcp.Client` (also capped at `input_required_max_rounds=10`) with `TasksClient`, on `mrtr.fastmcp.Flows`."""
    from fastmcp import Client as FastMCPClient
    from fastmcp import FastMCP
    from mcp.server.request_state import RequestStateSecurity

    import mrtr.fastmcp
    from tests.support.flowkit import SHARED_KEY

    mcp: FastMCP[Any] = FastMCP("round-cap-fm", request_state_security=RequestStateSecurity(keys=[SHARED_KEY]))
    flows = mrtr.fastmcp.Flows(mcp, store=SQLiteStore(":memory:"), task_poll_interval=0.02)
    runs: Counter[str] = Counter()

    @flows.tool(task="optional", mrtr_first=True)
    async def expenses(ctx: mrtr.FlowContext) -> str:
        amounts = [(await ctx.elicit(f"Item {i}: how many euros?", Amount)).euros for i in range(ITEMS)]
        await ctx.step("book", lambda: runs.update(["book"]))
        return f"{len(amounts)} items, {sum(amounts)} euros"

    asker = Asker()

    async def inline(message: str, response_type: Any, params: t.ElicitRequestParams, context: Any) -> Any:
        return (await asker.elicit(params)).content

    async def in_task(request: t.InputRequest) -> t.ElicitResult:
        assert isinstance(request, t.ElicitRequest)
        return await asker.elicit(request.params)  # type: ignore[arg-type]

    async with FastMCPClient(mcp, elicitation_handler=inline, extensions=[TasksClient(in_task)]) as client:
        assert client.input_required_max_rounds == 10
        result = await client.call_tool("expenses", {})
    assert result.data == EXPECTED
    assert asker.each_once(), asker.asked
    assert runs["book"] == 1


async def test_the_round_that_switches_to_a_task_resent_gets_the_same_task() -> None:
    """With the replay guard on, a resend of the round that became a task (its answer lost) gets
    the same task, not a second one; the task then asks the eleventh question, once."""
    from mrtr._guard import ReplayGuard
    from mrtr.client import CreatedTask
    from tests.support.flowkit import task_state

    server = new_server("round-cap-guarded")
    flows = mrtr.Flows(
        server,
        store=SQLiteStore(":memory:"),
        replay_guard=ReplayGuard(SQLiteStore(":memory:")),
        task_poll_interval=0.02,
    )

    @flows.tool(task="optional", mrtr_first=True)
    async def expenses(ctx: mrtr.FlowContext) -> str:
        amounts = [(await ctx.elicit(f"Item {i}: how many euros?", Amount)).euros for i in range(ITEMS)]
        return f"{len(amounts)} items, {sum(amounts)} euros"

    async def unused(*args: Any) -> Any:
        raise AssertionError("answered by hand")

    async with Client(server, extensions=[TasksClient(unused)], elicitation_callback=unused) as client:
        state: str | None = None
        answers: dict[str, Any] | None = None
        for i in range(11):
            result = await client.session.call_tool(
                "expenses",
                {},
                input_responses=answers,
                request_state=state,
                allow_input_required=True,
                allow_claimed=True,
            )
            if i < 10:
                assert isinstance(result, t.InputRequiredResult), (i, result)
                (key,) = result.input_requests or {}
                answers, state = {key: accept(euros=i)}, result.request_state
        assert isinstance(result, CreatedTask), result
        again = await client.session.call_tool(
            "expenses", {}, input_responses=answers, request_state=state, allow_input_required=True, allow_claimed=True
        )
        assert isinstance(again, CreatedTask) and again.task_id == result.task_id
        while (task := await task_state(client.session, result.task_id))["status"] != "input_required":
            await anyio.sleep(0.01)
        (asked,) = task["inputRequests"].values()
        assert asked["params"]["message"] == "Item 10: how many euros?"
