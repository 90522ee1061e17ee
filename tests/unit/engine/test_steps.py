"""Steps in isolation: the fingerprint of their arguments, their journal form, the typed value a replay returns."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime
from typing import Any

import pytest
from pydantic import BaseModel

from mrtr import FlowDefinitionError, StepResultError
from mrtr._engine import steps
from mrtr._engine.steps import StepInfo


class Plan(BaseModel):
    id: str
    size: int


def test_the_argument_digest_is_stable_and_tells_arguments_apart() -> None:
    digest = steps.arg_digest(("api", 3), {"env": "prod"})
    assert digest == steps.arg_digest(("api", 3), {"env": "prod"}) and len(digest) == 12
    assert digest != steps.arg_digest(("api", 4), {"env": "prod"})
    assert digest != steps.arg_digest(("api", 3), {"env": "dev"})
    assert digest != steps.arg_digest(("api",), {"env": "prod", "n": 3})
    plan = Plan(id="p", size=1)
    assert steps.arg_digest((plan,), {}) == steps.arg_digest((Plan(id="p", size=1),), {})  # by value


def test_an_argument_without_a_json_form_is_fingerprinted_by_its_type() -> None:
    class Handle:
        pass

    assert steps.arg_digest((Handle(),), {}) == steps.arg_digest((Handle(),), {})
    assert steps.arg_digest((Handle(),), {}) != steps.arg_digest((threading.Lock(),), {})


def test_the_journal_form_is_plain_json() -> None:
    assert steps.to_journal("s", Plan(id="p", size=2)) == {"id": "p", "size": 2}
    assert steps.to_journal("s", datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05"
    assert steps.to_journal("s", {"a": (1, 2)}) == {"a": [1, 2]}
    with pytest.raises(FlowDefinitionError, match="step 's' returned a object"):
        steps.to_journal("s", object())


def test_an_unannotated_step_whose_value_changes_shape_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    def unannotated():  # type: ignore[no-untyped-def]
        return Plan(id="p", size=1)

    def annotated() -> Plan:
        return Plan(id="p", size=1)

    with caplog.at_level(logging.WARNING, logger="mrtr.steps"):
        steps.to_journal("plan", Plan(id="p", size=1), annotated)
        assert caplog.records == []
        steps.to_journal("plan", Plan(id="p", size=1), unannotated)
    assert "annotate the step function's return type" in caplog.text


def test_a_replayed_value_comes_back_as_the_annotated_type() -> None:
    def plan() -> Plan:
        raise AssertionError("not called")

    def stamp() -> datetime:
        raise AssertionError("not called")

    def raw():  # type: ignore[no-untyped-def]
        raise AssertionError("not called")

    assert steps.typed_result("plan", plan, {"id": "p", "size": 2}) == Plan(id="p", size=2)
    assert steps.typed_result("stamp", stamp, "2026-01-02T03:04:05") == datetime(2026, 1, 2, 3, 4, 5)
    assert steps.typed_result("raw", raw, {"id": "p"}) == {"id": "p"}


def test_a_value_that_does_not_match_the_annotation_names_the_step_and_the_problem() -> None:
    def plan() -> Plan:
        raise AssertionError("not called")

    with pytest.raises(StepResultError) as caught:
        steps.typed_result("plan", plan, {"id": "p", "size": "big"})
    assert caught.value.step == "plan"
    assert "step 'plan'" in str(caught.value) and "Plan" in str(caught.value) and "size" in str(caught.value)


def test_the_return_adapter_of_a_bound_method_is_its_functions() -> None:
    class Service:
        def plan(self) -> Plan:
            raise AssertionError("not called")

    a, b = Service(), Service()
    adapter = steps.return_adapter(a.plan)
    assert adapter is not None and steps.return_adapter(b.plan) is adapter


def test_current_step_is_known_inside_a_step_only() -> None:
    with pytest.raises(RuntimeError, match=r"outside ctx\.step"):
        steps.current_step()

    info = StepInfo("charge", "flow1", "flow1:charge")

    def sync_step(x: int) -> tuple[int, StepInfo]:
        return x, steps.current_step()  # runs in a worker thread, with the step's context

    async def async_step() -> StepInfo:
        return steps.current_step()

    async def both() -> tuple[Any, Any]:
        return await steps.call_step(info, sync_step, (1,), {}), await steps.call_step(info, async_step, (), {})

    sync_value, async_value = asyncio.run(both())
    assert sync_value == (1, info) and async_value == info
    with pytest.raises(RuntimeError):
        steps.current_step()  # and reset afterwards
