"""The host core over a host with no framework: options, per-flow options, start-up decisions."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from mcp.server.subscriptions import InMemorySubscriptionBus

from mrtr._engine.context import FlowContext
from mrtr._errors import FlowDefinitionError
from mrtr._host.core import HostCore
from mrtr._host.options import FlowOptions, HostOptions, ToolOptions, flow_options
from mrtr.stores import SQLiteStore
from tests.unit.host.fakehost import FakeHost, shared_host

TOOL = sorted(ToolOptions.__optional_keys__)
OTHERS = sorted(FlowOptions.__optional_keys__)


def core(host: FakeHost | None = None, **options: Any) -> HostCore:
    return HostCore(host or shared_host(), HostOptions.of(options))


# -- options -------------------------------------------------------------------------------


def test_a_misspelt_flows_option_names_itself_and_every_option() -> None:
    with pytest.raises(TypeError, match=r"Flows\(\) got unexpected option\(s\) \['max_round'\]"):
        HostOptions.of({"max_round": 3})


def test_the_defaults_are_the_core_limits() -> None:
    limits = core().limits
    assert (limits.max_rounds, limits.deadline, limits.max_state_bytes) == (10, 3600.0, 64 * 1024)


# -- per-flow options ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tool", "prompt", "resource"])
def test_a_misspelt_flow_option_is_a_type_error_naming_mrtrs_options(kind: Any) -> None:
    names = TOOL if kind == "tool" else OTHERS
    with pytest.raises(TypeError) as caught:
        flow_options(kind, {"max_round": 3, "deadline": 1.0})
    assert str(caught.value) == (
        f"flows.{kind}() got unexpected option(s) ['max_round']; mrtr's options for a {kind} are {names}, "
        f"and the server's own {kind}() keywords are accepted too"
    )


@pytest.mark.parametrize("kind", ["prompt", "resource"])
def test_a_tool_only_option_elsewhere_is_refused_even_where_the_framework_has_that_keyword(kind: Any) -> None:
    with pytest.raises(TypeError, match=rf"flows.{kind}\(\) got option\(s\) \['task'\] that a {kind} does not take"):
        flow_options(kind, {"task": "optional"}, framework={"task"})


def test_the_frameworks_keywords_pass_through_and_mrtrs_are_kept() -> None:
    flow, rest = flow_options("tool", {"task": "required", "max_rounds": 2, "tags": {"a"}}, framework={"tags", "task"})
    assert flow == {"task": "required", "max_rounds": 2} and rest == {"tags": {"a"}}


def test_a_task_value_that_is_not_mrtrs_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="task=True is not mrtr's"):
        flow_options("tool", {"task": True})


def test_a_spec_takes_its_own_limits_and_the_core_defaults_for_the_rest() -> None:
    host_core = core(max_rounds=4)

    async def flow(ctx: FlowContext) -> str:
        return "x"

    options, _ = flow_options("tool", {"deadline": 9.0, "requires": ["elicitation"]})
    spec = host_core.spec(flow, None, options)
    assert host_core.specs == {"flow": spec}
    assert (spec.limits.max_rounds, spec.limits.deadline, spec.requires) == (4, 9.0, ("elicitation",))
    assert (spec.task, spec.mrtr_first, spec.ctx_param, spec.audience) == ("never", False, "ctx", "fake")


class HostContext:
    """A framework's own context class (FastMCP's `Context`)."""


def test_a_flow_taking_the_hosts_own_context_is_wrapped() -> None:
    async def flow(ctx: HostContext) -> str:
        return "x"

    def wrap(flow_context: Any) -> Any:
        return flow_context

    spec = core().spec(flow, "named", {}, host_context=HostContext, wrap_host_context=wrap)
    assert (spec.name, spec.ctx_param, spec.wrap_context) == ("named", "ctx", wrap)


# -- start-up decisions ----------------------------------------------------------------------


def test_a_process_local_key_warns_or_with_require_shared_key_refuses(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mrtr.fleet"):
        core(FakeHost())
    assert "server 'fake' has no request_state_security" in caplog.text
    with pytest.raises(FlowDefinitionError, match="require_shared_key=True"):
        core(FakeHost(), require_shared_key=True)


def test_require_shared_store_refuses_no_store_and_a_local_file(tmp_path: Any) -> None:
    with pytest.raises(FlowDefinitionError, match="the default SQLite file"):
        core(require_shared_store=True)
    with pytest.raises(FlowDefinitionError, match="in a SQLiteStore"):
        core(require_shared_store=True, store=SQLiteStore(tmp_path / "t.db"))


def test_the_replay_guard_needs_a_shared_store(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    assert core().replay_guard is None and core(store=SQLiteStore(tmp_path / "t.db")).replay_guard is None
    with pytest.raises(FlowDefinitionError, match=r"replay_guard=True\) records rounds in the shared store"):
        core(replay_guard=True)
    with caplog.at_level(logging.INFO, logger="mrtr.fleet"):
        assert core(replay_guard=False).replay_guard is None
    assert "runs without a replay guard" in caplog.text


def test_shedding_is_a_policy_only_when_asked_for() -> None:
    assert core().services.policies == () and core().shedder is None
    host_core = core(max_inflight_rounds=5)
    assert host_core.services.policies == (host_core.shedder,)


def test_a_store_creates_the_engine_at_start_up_and_installs_tasks_once(tmp_path: Any) -> None:
    host = shared_host()
    host_core = core(host, store=SQLiteStore(tmp_path / "t.db"))
    assert host_core.has_engine and len(host.installed) == 1
    extension, _listen, running = host.installed[0]
    assert extension.engine is host_core.engine() and len(host.installed) == 1
    assert running == host_core.running
    assert isinstance(host_core.bus, InMemorySubscriptionBus), "a local store: an in-process bus"


def test_no_store_no_engine_until_one_is_needed() -> None:
    host = shared_host()
    host_core = core(host)
    assert not host_core.has_engine and host.installed == [] and host_core.bus is None


def test_a_bus_of_the_servers_own_and_another_given_is_refused(tmp_path: Any) -> None:
    host = FakeHost(bus=InMemorySubscriptionBus())
    with pytest.raises(FlowDefinitionError, match="was built with a bus of its own"):
        core(host, store=SQLiteStore(tmp_path / "t.db"), bus=InMemorySubscriptionBus())


def test_the_servers_own_bus_is_the_one_used(tmp_path: Any) -> None:
    bus = InMemorySubscriptionBus()
    host_core = core(FakeHost(bus=bus), store=SQLiteStore(tmp_path / "t.db"))
    assert host_core.bus is bus


def test_public_url_serves_the_callback_route() -> None:
    host = shared_host()
    core(host, public_url="https://fleet.example")
    assert host.routes == ["/mrtr/events/{task_id}/{name}/{token}"]
