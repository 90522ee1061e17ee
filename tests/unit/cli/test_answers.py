"""`mrtr call`'s answers files: the prompt's own spellings, and whole sampling results with `tool_use`."""

from __future__ import annotations

import json

import mcp_types as t
import pytest

from mrtr.cli._answers import command_answer, elicit_result, structured_sampling_result
from mrtr.cli._errors import UsageError


@pytest.mark.parametrize(("value", "action"), [(":decline", "decline"), (":cancel", "cancel"), ("decline", "decline")])
def test_an_answers_file_takes_the_prompts_refusal_spellings(value: str, action: str) -> None:
    assert elicit_result(value, "'q'").action == action


def test_a_sampling_answer_may_be_a_whole_result_with_tool_use() -> None:
    call = {"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "cars"}}
    result = structured_sampling_result({"content": [call], "stopReason": "toolUse"}, "'plan'")
    assert isinstance(result, t.CreateMessageResultWithTools) and result.stop_reason == "toolUse"
    assert command_answer(json.dumps({"content": [call], "stopReason": "toolUse"}), "k").stop_reason == "toolUse"
    assert command_answer("just text", "k") == t.CreateMessageResult(
        role="assistant", content=t.TextContent(type="text", text="just text"), model="mrtr-cli"
    )
    with pytest.raises(UsageError, match="not a sampling result"):
        structured_sampling_result({"content": [{"type": "nope"}]}, "'plan'")
