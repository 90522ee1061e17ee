"""One request through the host core (`mrtr._host.call`): each way a round ends, as a typed outcome."""

from __future__ import annotations

from typing import Any

import pytest
from mcp_types import InputRequiredResult
from pydantic import BaseModel

from mrtr._engine.context import FlowContext
from mrtr._engine.spec import FlowSpec
from mrtr._errors import Declined
from mrtr._host.call import Refused, Rejected, Value
from mrtr._host.core import HostCore
from mrtr._host.options import HostOptions
from tests.unit.host.fakehost import shared_host, wire

pytestmark = pytest.mark.anyio


class Go(BaseModel):
    go: bool


async def flow(ctx: FlowContext, mode: str) -> str:
    if mode == "value":
        return "done"
    answer = await ctx.elicit("Go?", Go, key="go")
    return "went" if answer.go else "stayed"


def setup(**options: Any) -> tuple[HostCore, FlowSpec]:
    core = HostCore(shared_host(), HostOptions.of(options))
    return core, core.spec(flow, None, {})


async def run(core: HostCore, spec: FlowSpec, mode: str, **request: Any) -> Any:
    return await core.call(spec, None, {"mode": mode}, wire=wire(**request), state_security=core.host.state_security)


async def test_a_value() -> None:
    core, spec = setup()
    assert await run(core, spec, "value") == Value("done")


async def test_input_required_then_the_answer_then_a_refusal() -> None:
    core, spec = setup()
    asked = await run(core, spec, "ask")
    assert isinstance(asked, InputRequiredResult) and list(asked.input_requests or {}) == ["go"]
    state = asked.request_state
    accepted = {"go": {"action": "accept", "content": {"go": True}}}
    assert await run(core, spec, "ask", state=state, answers=accepted) == Value("went")
    refused = await run(core, spec, "ask", state=state, answers={"go": {"action": "decline"}})
    assert isinstance(refused, Refused) and isinstance(refused.error, Declined)


async def test_a_task_only_flow_for_a_client_without_tasks_is_a_protocol_error() -> None:
    core = HostCore(shared_host(), HostOptions())
    spec = core.spec(flow, "job", {"task": "required"})
    rejected = await run(core, spec, "value")
    assert isinstance(rejected, Rejected) and rejected.error.error.code == -32021


async def test_a_foreign_state_is_the_clients_protocol_error() -> None:
    core, spec = setup()
    rejected = await run(core, spec, "ask", state="not a journal")
    assert isinstance(rejected, Rejected) and rejected.error.error.data["reason"] == "incompatible_request_state"


async def test_a_bug_in_the_flow_propagates_as_it_is() -> None:
    core = HostCore(shared_host(), HostOptions())

    async def broken(ctx: FlowContext) -> str:
        raise KeyError("bug")

    spec = core.spec(broken, None, {})
    with pytest.raises(KeyError):
        await core.call(spec, None, {}, wire=wire(), state_security=core.host.state_security)
