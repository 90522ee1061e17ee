"""The hot path's shortcuts (issue #34) give exactly what the long way gave.

Each shortcut is checked against the computation it replaces: the model a replayed form
comes back as, the checks a cached ask or a remembered step name skips, the escaped length
of a state, the journal's compression, and a flow driven end to end over real rounds.
"""

from __future__ import annotations

import json
import zlib
from typing import Any, ClassVar

import pydantic_core
import pytest
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, field_validator

import mrtr
from mrtr._engine import journal as codec
from mrtr._engine.asks import elicit_ask
from mrtr._engine.journal import Journal
from mrtr._engine.replay import check_step_name
from mrtr._engine.steps import arg_digest
from mrtr._errors import FlowDefinitionError
from mrtr.testing import run_rounds

pytestmark = pytest.mark.anyio


class Plain(BaseModel):
    env: str

    @field_validator("env")
    @classmethod
    def lower(cls, value: str) -> str:
        return value.lower()


class Counted(BaseModel):
    """Overrides `model_validate`: the engine must keep calling the override."""

    calls: ClassVar[int] = 0
    env: str

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Counted:
        Counted.calls += 1
        return super().model_validate(obj, **kwargs)


def test_a_replayed_form_is_the_model_model_validate_makes() -> None:
    ask = elicit_ask("Where?", Plain, None, False)
    content = {"env": "PROD"}
    assert ask.parse(content) == Plain.model_validate(content) == Plain(env="prod")
    with pytest.raises(pydantic_core.ValidationError) as direct:
        ask.parse({"env": 1})
    with pytest.raises(pydantic_core.ValidationError) as long_way:
        Plain.model_validate({"env": 1})
    assert direct.value.errors() == long_way.value.errors()


def test_a_model_that_overrides_model_validate_gets_its_override() -> None:
    ask = elicit_ask("Where, counted?", Counted, None, False)
    before = Counted.calls
    assert ask.parse({"env": "prod"}) == Counted(env="prod")
    assert Counted.calls == before + 1


@pytest.mark.parametrize("schema", [dict, {"type": "object"}, "Plain", None])
def test_a_schema_that_is_no_model_is_refused_every_time(schema: Any) -> None:
    for _ in range(2):  # the second call would be a cache hit, were anything cached
        with pytest.raises(FlowDefinitionError):
            elicit_ask("Where, really?", schema, None, False)


def test_short_questions_are_cached_long_ones_are_not() -> None:
    assert elicit_ask("Cached?", Plain, None, False) is elicit_ask("Cached?", Plain, None, False)
    long = "x" * 300
    first, again = elicit_ask(long, Plain, None, False), elicit_ask(long, Plain, None, False)
    assert first is not again and first.digest == again.digest
    assert first.derived_key(1) == first.key_base and first.derived_key(3) == f"{first.key_base}_3"


def test_a_step_name_refused_once_is_refused_again_and_good_names_stay_good() -> None:
    check_step_name("f", "plan")
    check_step_name("f", "plan")
    for bad in ("", "a#b", "a/b", "a@b"):
        for _ in range(2):
            with pytest.raises(FlowDefinitionError):
                check_step_name("f", bad)


def test_the_digest_of_no_arguments_is_the_one_computed() -> None:
    import hashlib

    assert arg_digest((), {}) == hashlib.sha256(pydantic_core.to_json([(), {}])).hexdigest()[:12]
    assert arg_digest((1,), {}) != arg_digest((), {})


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain",
        'q"uo"te',
        "back\\slash",
        "tab\tand\nnewline",
        "del\x7f",
        "é漢字",
        "\u2028",
        "\ud800",
        "z" + "A-_" * 900,
    ],
)
def test_embedded_length_is_the_length_inside_a_json_document(text: str) -> None:
    assert codec.embedded_length(text) == len(json.dumps({"s": text}, separators=(",", ":"))) - len('{"s":}')
    if text.isascii() and text.isprintable():  # the formula the shortcut replaced
        assert codec.embedded_length(text) == len(text) + text.count('"') + text.count("\\") + 2


def journal_of(answers: int) -> Journal:
    journal = Journal.start()
    for i in range(answers):
        journal.answers[f"elicit_abcdefghij_{i}"] = (f"q{i:015d}", {"action": "accept", "content": {"value": f"v{i}"}})
    journal.rounds = answers
    return journal


@pytest.mark.parametrize("answers", [1, 5, 10, 30, 100])
def test_journals_round_trip_and_small_ones_encode_as_before(answers: int) -> None:
    journal = journal_of(answers)
    encoded = codec.encode(journal)
    assert codec.decode(encoded).to_wire() == journal.to_wire()
    text = codec._dumps(journal.to_wire())
    if len(text) <= 2048:  # level 6, byte for byte what earlier versions wrote
        packed = "z" + codec._b64u(zlib.compress(text.encode(), 6))
        plain = "j" + text
        short = len(text) < 160  # never worth compressing
        assert encoded == (plain if short or len(packed) >= codec.embedded_length(plain) else packed)
    else:  # any zlib level inflates the same way: an older instance reads it
        assert zlib.decompress(codec.base64.urlsafe_b64decode(encoded[1:] + "=" * (-len(encoded[1:]) % 4))) == (
            text.encode()
        )


async def test_a_long_flow_of_asks_and_steps_replays_to_the_same_result() -> None:
    """End to end over real rounds: every shortcut on the replay path, round after round."""
    server = MCPServer("speed")
    flows = mrtr.Flows(server, max_rounds=40)
    ran: list[int] = []

    def plan(i: int) -> dict[str, int]:
        ran.append(i)
        return {"i": i}

    @flows.tool()
    async def long_flow(ctx: mrtr.FlowContext) -> str:
        seen = []
        for i in range(30):
            seen.append((await ctx.elicit(f"Env {i}?", Plain)).env)
            seen.append(str((await ctx.step("plan", plan, i))["i"]))
            await ctx.step("tick", lambda: 0)
        counted = await ctx.elicit("Counted?", Counted)
        return ",".join(seen) + "|" + counted.env

    report = await run_rounds(flows, "long_flow", answers=lambda key, request: {"env": "PROD"})
    assert report.rounds == 32
    assert report.result.structured_content == {"result": ",".join(f"prod,{i}" for i in range(30)) + "|PROD"}
    assert ran == list(range(30))  # each step ran once, however often it was replayed


@pytest.mark.parametrize("value", ["plain", "é 漢字", "\ud800 lone surrogate", [1, 2.5, None, True], {"n": 10**30}])
def test_the_encoder_writes_the_tables_as_a_copy_of_them_would(value: object) -> None:
    journal = journal_of(3)
    journal.steps["s"] = ("d" * 12, value)
    journal.steps["t#2"] = ("", {"v": value})
    assert codec._dumps(journal.to_wire(copy=False)) == codec._dumps(journal.to_wire())
    assert codec.decode(codec.encode(journal)).to_wire() == journal.to_wire()
