"""Asks: a question's identity (digest, key), the form it renders to, and what an answer must be to be kept."""

from __future__ import annotations

import enum
from datetime import date
from typing import Any, Literal

import pytest
from mcp_types import ClientCapabilities, CreateMessageRequestParams, SamplingMessage, TextContent
from pydantic import BaseModel, Field

from mrtr import FlowDefinitionError
from mrtr._engine import asks
from mrtr._engine.asks import BadAnswer
from tests.support.enginekit import accept, roots, sampled


class Target(BaseModel):
    env: str


class Other(BaseModel):
    region: str


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


class Rich(BaseModel):
    name: str
    when: date | None = None
    color: Color = Color.RED
    size: Literal["s", "m", "l"] = "m"
    tags: list[Color] = Field(default_factory=list)
    count: int = 0


class Aliased(BaseModel):
    user_name: str = Field(alias="userName")


def sample_params(text: str) -> CreateMessageRequestParams:
    content = TextContent(type="text", text=text)
    return CreateMessageRequestParams(messages=[SamplingMessage(role="user", content=content)], max_tokens=10)


# -- identity -------------------------------------------------------------------------------


def test_a_question_is_identified_by_exactly_what_the_client_is_shown() -> None:
    base = asks.elicit_ask("Where?", Target, None, False)
    assert asks.elicit_ask("Where?", Target, None, False).digest == base.digest
    assert asks.elicit_ask("Where ?", Target, None, False).digest != base.digest  # other words
    assert asks.elicit_ask("Where?", Other, None, False).digest != base.digest  # other form
    assert asks.elicit_ask("Where?", Target, "k", False).digest == base.digest  # the key is not shown
    long = "x" * 1000  # long questions are not cached: same identity all the same
    assert asks.elicit_ask(long, Target, None, False).digest == asks.elicit_ask(long, Target, None, False).digest


def test_digests_of_different_kinds_never_collide() -> None:
    digests = {
        asks.elicit_ask("Where?", Target, None, False).digest,
        asks.elicit_url_ask("Where?", "https://example.com/", None).digest,
        asks.sample_ask(sample_params("Where?"), None, False).digest,
        asks.roots_ask(None, False).digest,
    }
    assert len(digests) == 4


def test_derived_keys_name_the_kind_and_the_question_and_count_repeats() -> None:
    ask = asks.elicit_ask("Where?", Target, None, False)
    assert ask.derived_key(1) == f"elicit_{ask.digest[:10]}"
    assert ask.derived_key(3) == f"elicit_{ask.digest[:10]}_3"
    assert asks.sample_ask(sample_params("x"), None, False).derived_key(1).startswith("sample_")
    assert asks.roots_ask(None, False).derived_key(1).startswith("roots_")


def test_a_url_elicitation_id_is_stable_and_the_key_overrides_it() -> None:
    a = asks.elicit_url_ask("Sign in", "https://example.com/a", None)
    b = asks.elicit_url_ask("Sign in", "https://example.com/a", None)
    c = asks.elicit_url_ask("Sign in", "https://example.com/b", None)
    ids = [ask.wire_request()["params"]["elicitationId"] for ask in (a, b, c)]
    assert ids[0] == ids[1] != ids[2]
    assert asks.elicit_url_ask("Sign in", "https://example.com/a", "login").wire_request()["params"][
        "elicitationId"
    ] == ("login")


# -- forms ----------------------------------------------------------------------------------


def test_a_form_renders_optionals_plainly_and_enums_inline() -> None:
    schema = asks.render_form_schema(Rich)
    props = schema["properties"]
    assert "$defs" not in schema and schema["required"] == ["name"]
    assert props["when"] == {"format": "date", "title": "When", "type": "string"}  # no anyOf/null
    assert props["color"]["enum"] == ["red", "blue"] and props["color"]["type"] == "string"
    assert props["size"]["enum"] == ["s", "m", "l"]
    assert props["tags"]["items"]["enum"] == ["red", "blue"]


class Nested(BaseModel):
    target: Target


class Mapping_(BaseModel):
    extra: dict[str, str]


@pytest.mark.parametrize("schema", [Nested, Mapping_])
def test_a_field_no_form_can_show_is_a_definition_error_that_says_what_can(schema: type[BaseModel]) -> None:
    with pytest.raises(FlowDefinitionError, match="form fields may be str"):
        asks.elicit_ask(f"Q for {schema.__name__}?", schema, None, False)


@pytest.mark.parametrize("schema", [dict, Target(env="x"), "Target"])
def test_a_schema_that_is_not_a_model_class_is_refused(schema: Any) -> None:
    with pytest.raises(FlowDefinitionError, match="pydantic model class"):
        asks.elicit_ask("Where?", schema, None, False)


# -- answers --------------------------------------------------------------------------------


def test_an_accepted_form_is_kept_with_just_its_fields() -> None:
    ask = asks.elicit_ask("Where?", Target, None, False)
    assert ask.accept(accept(env="prod")) == {"action": "accept", "content": {"env": "prod"}}
    assert ask.accept(accept(env="prod", junk="x")) == {"action": "accept", "content": {"env": "prod"}}


def test_a_form_field_may_arrive_under_its_alias() -> None:
    ask = asks.elicit_ask("Who?", Aliased, None, False)
    assert ask.accept(accept(userName="ada")) == {"action": "accept", "content": {"userName": "ada"}}


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_a_refusal_is_kept_without_content(action: str) -> None:
    ask = asks.elicit_ask("Where?", Target, None, False)
    assert ask.accept({"action": action, "content": {"env": "ignored"}}) == {"action": action}


@pytest.mark.parametrize(
    "answer",
    [accept(env=5), accept(), {"action": "accept"}, {"action": "maybe"}, "yes", None, sampled("prod")],
)
def test_an_answer_that_does_not_fit_the_form_is_a_bad_answer(answer: Any) -> None:
    with pytest.raises(BadAnswer):
        asks.elicit_ask("Where?", Target, None, False).accept(answer)


def test_a_url_elicitation_keeps_only_the_users_consent() -> None:
    ask = asks.elicit_url_ask("Sign in", "https://example.com/", None)
    assert ask.accept(accept(token="secret")) == {"action": "accept"}
    assert ask.accept({"action": "decline"}) == {"action": "decline"}


def test_sampling_and_roots_answers_are_validated_and_kept_as_wire_json() -> None:
    sample = asks.sample_ask(sample_params("hi"), None, False)
    assert sample.accept(sampled("hello"))["content"] == {"type": "text", "text": "hello"}
    listed_content = {"role": "assistant", "model": "m", "content": [{"type": "text", "text": "a"}]}
    assert sample.accept(listed_content)["content"] == [{"type": "text", "text": "a"}]  # valid since 2025-11-25
    # Not a BadAnswer (re-asked): a client's code would send it again. An error naming key and field.
    with pytest.raises(asks.MalformedAnswer, match=r"inputResponses\['k'\] is not a valid sampling/createMessage"):
        sample.accept(accept(env="x"), key="k")
    listed = asks.roots_ask(None, False)
    assert listed.accept(roots("file:///a"))["roots"][0]["uri"] == "file:///a"
    with pytest.raises(asks.MalformedAnswer, match="roots must be"):
        listed.accept({"roots": "file:///a"})


def test_a_prerendered_form_is_validated_by_its_own_validator() -> None:
    def validate(content: dict[str, Any]) -> object:
        if not isinstance(content.get("n"), int):
            raise ValueError("n must be an integer")
        return content

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    ask = asks.form_ask("How many?", schema, validate, None)
    assert ask.accept(accept(n=2, other=1)) == {"action": "accept", "content": {"n": 2}}
    with pytest.raises(BadAnswer, match="n must be an integer"):
        ask.accept(accept(n="two"))


# -- capabilities ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "supported"),
    [
        (None, set()),
        ({}, set()),
        ({"elicitation": {}}, {"elicitation", "elicitation.form"}),  # a bare declaration means forms
        ({"elicitation": {"url": {}}}, {"elicitation", "elicitation.url"}),
        ({"elicitation": {"form": {}, "url": {}}}, {"elicitation", "elicitation.form", "elicitation.url"}),
        ({"sampling": {}}, {"sampling"}),
        ({"sampling": {"tools": {}}}, {"sampling", "sampling.tools"}),
        ({"roots": {}}, {"roots"}),
    ],
)
def test_supports_reads_what_the_request_declared(declared: dict[str, Any] | None, supported: set[str]) -> None:
    capabilities = None if declared is None else ClientCapabilities.model_validate(declared)
    every = ("elicitation", "elicitation.form", "elicitation.url", "sampling", "sampling.tools", "roots")
    assert {c for c in every if asks.supports(capabilities, c)} == supported
