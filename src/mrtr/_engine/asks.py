"""Asks: the questions a flow puts to the client, rendered once for both protocol eras.

An ask knows its wire request (`elicitation/create`, `sampling/createMessage`,
`roots/list`), a digest of exactly what the client was shown, the wire key it goes out
under, which client capability it needs, and how to turn the client's answer into the
value the flow receives. Keys are derived from the question itself, so a question keeps
its key across rounds, instances and redeploys, and a reworded question gets a new one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal, NotRequired, TypedDict, cast

from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    ClientCapabilities,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitationCapability,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    FormElicitationCapability,
    InputRequest,
    ListRootsRequest,
    ListRootsResult,
    RootsCapability,
    SamplingCapability,
    SamplingToolsCapability,
    UrlElicitationCapability,
)
from mcp_types.version import LATEST_MODERN_VERSION
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from mrtr._errors import FlowDefinitionError
from mrtr._sdk import FORM_FIELD, client_result_schema
from mrtr._wire import JSONObject

AskKind = Literal["elicit", "elicit_url", "sample", "roots"]

Capability = Literal["elicitation", "elicitation.form", "elicitation.url", "sampling", "sampling.tools", "roots"]
"""A client capability a flow can test (`ctx.client_supports`) or require (`@flows.tool(requires=[...])`)."""


class FormAnswer(TypedDict):
    """A form's answer as journaled (`Ask.accept`): what `ctx.ask_form` returns to an adapter."""

    action: Literal["accept", "decline", "cancel"]
    content: NotRequired[JSONObject]
    """The form's fields (only those it asked for), when accepted."""


class BadAnswer(Exception):
    """A person's form answer does not fit the question; the question is asked again.

    Only forms are re-asked: a person can read why and answer again. A sampling or roots
    answer comes from the client's code, which would send the same thing again, so one
    that does not fit is a `MalformedAnswer` instead.
    """


class MalformedAnswer(MCPError):
    """A client answered a sampling or roots request with something its protocol version does not allow.

    -32602 naming the `inputResponses` key, the field and what the field must hold (in the
    message, and as `data`), so the client's author can fix the client. Never re-asked: a
    client sends the same answer again, and the flow would only reach its round cap.
    """

    def __init__(self, key: str, method: str, version: str, field: str, expected: str, got: str) -> None:
        where = f"inputResponses[{key!r}] is not" if key else "the answer is not"
        super().__init__(
            code=INVALID_PARAMS,
            message=f"{where} a valid {method} result under {version}: {field} must be {expected}{got}",
            data={"inputKey": key, "method": method, "field": field, "expected": expected},
        )
        self.key = key
        self.field = field


MAX_REJECTED = 3
"""Answers in a row a form may refuse before the call stops (`AnswerRejected`): a client that
cannot see a field's constraint (a host that drops schema keywords, an automated answerer)
sends the same kind of answer again, and would otherwise be asked until the round cap."""


class AnswerRejected(MCPError):
    """A form's answer was refused `MAX_REJECTED` times in a row: -32602 naming the question and why.

    The reason names the field and its constraint ("Code must match pattern '^[A-Z]{3}$'"),
    as each re-ask did; `data` carries the `inputKey`, the reason and the count.
    """

    def __init__(self, key: str, reason: str, attempts: int) -> None:
        super().__init__(
            code=INVALID_PARAMS,
            message=f"the answer to {key!r} was refused {attempts} times in a row: {reason}",
            data={"reason": "answer_refused", "inputKey": key, "why": reason, "attempts": attempts},
        )
        self.key = key


_EXPECTED: dict[str, str] = {
    "content": (
        "a text, image, audio, tool_use or tool_result content block, or a list of them "
        "(a list is valid since 2025-11-25)"
    ),
    "role": '"user" or "assistant"',
    "model": "a string naming the model",
    "stopReason": "a string",
    "roots": "a list of roots, each {uri, name?} with a file:// uri",
}

_ELICIT_EXPECTED: dict[str, str] = {
    "action": '"accept", "decline" or "cancel"',
    "content": "an object of the form's fields (strings, numbers, booleans or lists of strings)",
}

_SAMPLING_RESULT = TypeAdapter[Any](cast(Any, CreateMessageResult | CreateMessageResultWithTools))
"""The SDK's own model for a sampling answer: one block, else the array-capable form (arm order matters)."""


class Ask:
    """One question, identified by a digest of exactly what the client is shown.

    The wire request is built only when the question actually goes out (most replays
    find it answered), from parts that are cheap to hash on every replay.
    """

    __slots__ = (
        "_build",
        "_capability",
        "_fields",
        "_request",
        "allow_preanswer",
        "digest",
        "explicit_key",
        "key_base",
        "kind",
        "plain_schema",
        "schema",
        "validator",
    )

    def __init__(
        self,
        kind: AskKind,
        build: Callable[[], InputRequest],
        digest: str,
        explicit_key: str | None,
        allow_preanswer: bool,
        schema: type[BaseModel] | None = None,
        validator: Callable[[JSONObject], object] | None = None,
        fields: frozenset[str] | None = None,
        capability: Capability | None = None,
    ) -> None:
        if allow_preanswer and explicit_key is None:
            raise TypeError("allow_preanswer=True needs an explicit key=: a client can only pre-answer a key it knows")
        self.kind = kind
        self._build = build
        self._request: InputRequest | None = None
        self.digest = digest
        self.explicit_key = explicit_key
        self.allow_preanswer = allow_preanswer
        self.schema = schema
        self.validator = validator
        """Validates a form's content when the form is a rendered JSON schema, not a model."""
        self._fields = fields if fields is not None else _field_names(schema) if schema is not None else frozenset()
        self._capability = capability
        self.key_base = f"{kind}_{digest[:10]}"
        """The derived wire key's stem: computed once, as every replay of the ask needs it."""
        self.plain_schema = schema is not None and _plain_model_validate(schema)
        """`schema` keeps pydantic's own `model_validate` (see `Ask.parse`)."""

    @property
    def request(self) -> InputRequest:
        """Built on first use and kept: asks are immutable, and cached ones are shared."""
        if self._request is None:
            self._request = self._build()
        return self._request

    @property
    def capability(self) -> Capability:
        return self._capability or _CAPABILITY[self.kind]

    def derived_key(self, occurrence: int) -> str:
        """Stable wire key: kind + question digest, + a counter when asked again in one run."""
        return self.key_base if occurrence == 1 else f"{self.key_base}_{occurrence}"

    def parse(self, content: Any) -> Any:
        """`schema.model_validate(content)`: the model a form's journaled content stands for.

        Every replay of an answered form validates its content again, so this calls the
        model's validator directly, which is all `BaseModel.model_validate` does with its
        defaults (its keyword checks cost as much as the validation of a small form); a
        model that overrides `model_validate` gets its override.
        """
        schema = self.schema
        assert schema is not None
        if self.plain_schema:
            return schema.__pydantic_validator__.validate_python(content)
        return schema.model_validate(content)

    def wire_request(self) -> JSONObject:
        return self.request.model_dump(mode="json", by_alias=True, exclude_none=True)

    def accept(self, answer: Any, *, key: str = "", version: str | None = None) -> Any:
        """Validate a wire answer and return the JSON to journal: what the question asked for, no more.

        `key` is the answer's `inputResponses` key and `version` the protocol version in use
        (the newest when not given: journaled rounds are 2026-07-28), for sampling and roots.

        Raises:
            BadAnswer: A form answer is of the wrong kind or fails the requested schema (re-asked).
            MalformedAnswer: A sampling or roots answer that its protocol version does not allow.
        """
        if self.kind in ("sample", "roots"):
            return _client_result(self.kind, answer, key, version or LATEST_MODERN_VERSION)
        if self.kind == "elicit" and type(answer) is dict and answer.get("action") == "accept":
            # The usual answer: a form accepted with just the form's fields. The form's own
            # schema admits only values the wire's ElicitResult admits, so one validation does.
            content = answer.get("content")
            if type(content) is dict and content.keys() <= self._fields:
                self._validate_form(content)
                return {"action": "accept", "content": content}
        if self.kind in ("elicit", "elicit_url"):
            try:
                result = ElicitResult.model_validate(answer)
            except ValidationError:
                raise BadAnswer("not an elicitation result") from None
            if result.action != "accept" or self.kind == "elicit_url":
                return {"action": result.action}
            if result.content is None:
                if self.kind == "elicit" and not self._fields and self.validator is not None:
                    return {"action": "accept", "content": {}}  # an empty form (a bare confirmation)
                raise BadAnswer("accepted without content")
            validated = self._validate_form(result.content)
            # Journal the fields the form asked for: junk the client added stays out. Content
            # with no field beyond the form's (the usual case) is journaled as it came.
            content = result.content
            # An adapter's empty form (FastMCP's `response_type=None`) keeps what came: the adapter
            # judges a non-empty answer itself, as FastMCP 3.x did ("expected an empty response").
            if not content.keys() <= self._fields and (self._fields or self.validator is None):
                if isinstance(validated, BaseModel):
                    content = validated.model_dump(mode="json", by_alias=True, exclude_unset=True)
                else:
                    content = {k: v for k, v in content.items() if k in self._fields}
            return {"action": "accept", "content": content}
        raise AssertionError(f"unknown ask kind {self.kind!r}")  # pragma: no cover

    def _validate_form(self, content: JSONObject) -> object:
        try:
            if self.validator is not None:
                return self.validator(content)
            return self.parse(content)
        except (ValidationError, ValueError, TypeError) as exc:
            raise BadAnswer(human_reason(exc, self._form_fields())) from None

    def _form_fields(self) -> JSONObject:
        params = getattr(self.request, "params", None)
        schema = getattr(params, "requested_schema", None) or {}
        properties: JSONObject = schema.get("properties") or {}
        return properties


def human_reason(exc: Exception, fields: Mapping[str, Any]) -> str:
    """Why a form answer was not taken, for the person who answers it again: short, in the form's words.

    The re-asked question carries it (`(Asked again: ...)`), so it names fields by the titles
    the form showed and says what each needs ("Age must be a whole number"), not pydantic's
    report (model names, error codes, URLs). FastMCP's wrapped scalar (`value`) is "the answer".
    """
    if not isinstance(exc, ValidationError):  # a validator's own words (FastMCP's: a missing value)
        return str(exc).rstrip(".") or "The answer does not fit the form"
    reasons: list[str] = []
    for error in exc.errors()[:3]:
        name = next((str(part) for part in error["loc"] if isinstance(part, str) and part in fields), None)
        if name is None and error["loc"]:
            name = str(error["loc"][0])
        field = fields.get(name or "") or {}
        # FastMCP wraps a scalar answer in one `value` field: that one is just "the answer".
        wrapped = name == "value" and len(fields) == 1
        title = "" if wrapped else str(field.get("title") or (name or "").replace("_", " ").capitalize())
        reason = _needs(error, field)
        reasons.append(f"{title or 'The answer'} {reason}")
    more = exc.error_count() - len(reasons)
    return "; ".join(reasons) + (f" (and {more} more)" if more > 0 else "")


def _needs(error: Any, field: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is required"
    if kind.startswith("int_"):
        return "must be a whole number"
    if kind.startswith(("float_", "decimal_")):
        return "must be a number"
    if kind.startswith("bool_"):
        return "must be yes or no"
    if kind in ("literal_error", "enum"):
        choices = (
            field.get("enum")
            or field.get("items", {}).get("enum")
            or [option.get("const") for option in field.get("oneOf") or field.get("anyOf") or [] if "const" in option]
        )
        return f"must be one of: {', '.join(map(str, choices))}" if choices else "must be one of the choices"
    if kind.startswith(("string_", "str_")) and "pattern" not in kind:
        return "must be text" if kind == "string_type" else _plain(error["msg"])
    if kind in ("list_type", "set_type"):
        return "must be a list of choices"
    return _plain(error["msg"])


def _plain(message: str) -> str:
    """Pydantic's message for the rest ("Input should be ..."), as the rest of the sentence."""
    message = message.removeprefix("Value error, ")
    message = message.replace("Input should be", "must be").replace("String should", "must")
    return message[0].lower() + message[1:] if message else "does not fit"


_CAPABILITY: dict[AskKind, Capability] = {
    "elicit": "elicitation.form",
    "elicit_url": "elicitation.url",
    "sample": "sampling",
    "roots": "roots",
}


# Every round replays every ask, so what an ask costs to build matters. Questions often
# carry client text, so caches are bounded in bytes, not just entries: schemas by class,
# held weakly (only code creates classes), and asks only for short questions.
_schemas: weakref.WeakKeyDictionary[type[BaseModel], tuple[JSONObject, bytes]] = weakref.WeakKeyDictionary()


def elicit_ask(message: str, schema: type[BaseModel], key: str | None, allow_preanswer: bool) -> Ask:
    # Short questions (most are) are cached: at most _CACHED asks of at most _SHORT characters.
    # Only a model class is ever cached, so a hit (every replay of a short question) needs no
    # check of `schema`.
    ident = (message, schema, key, allow_preanswer)
    try:
        ask = _recent.get(ident)
    except TypeError:  # an unhashable "schema" (a dict, say): refused below
        ask = None
    if ask is not None:
        return ask
    _check_model(schema)
    if len(message) > _SHORT:
        return _elicit_ask(message, schema, key, allow_preanswer)
    ask = _recent[ident] = _elicit_ask(message, schema, key, allow_preanswer)
    if len(_recent) > _CACHED:
        del _recent[next(iter(_recent))]
    return ask


def _check_model(schema: object) -> None:
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise FlowDefinitionError(not_a_model(schema))


_SHORT = 256
_CACHED = 4096
_recent: dict[tuple[str, type[BaseModel], str | None, bool], Ask] = {}


def _elicit_ask(message: str, schema: type[BaseModel], key: str | None, allow_preanswer: bool) -> Ask:
    rendered, canonical = _schema_of(schema)

    def build() -> InputRequest:
        return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=rendered))

    return Ask("elicit", build, _digest(b"elicit", canonical, message.encode()), key, allow_preanswer, schema)


def form_ask(
    message: str,
    schema: JSONObject,
    validate: Callable[[JSONObject], object],
    key: str | None,
    allow_preanswer: bool = False,
) -> Ask:
    """A form whose JSON schema is already rendered (e.g. from FastMCP's `response_type`s).

    `validate(content)` raises (`ValidationError`, `ValueError` or `TypeError`) for content
    that does not fit: the question is asked again, as for a model's form.
    """
    canonical = json.dumps(schema, sort_keys=True, separators=(",", ":")).encode()

    def build() -> InputRequest:
        return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))

    digest = _digest(b"elicit", canonical, message.encode())
    fields = frozenset(schema.get("properties") or ())
    return Ask("elicit", build, digest, key, allow_preanswer, None, validator=validate, fields=fields)


def elicit_url_ask(message: str, url: str, key: str | None) -> Ask:
    # The 2026-07-28 wire correlates through requestState; the id stays for older peers.
    elicitation_id = key or hashlib.sha256(f"{message}\0{url}".encode()).hexdigest()[:16]

    def build() -> InputRequest:
        params = ElicitRequestURLParams(message=message, url=url, elicitation_id=elicitation_id)
        return ElicitRequest(params=params)

    digest = _digest(b"elicit_url", message.encode(), url.encode(), elicitation_id.encode())
    return Ask("elicit_url", build, digest, key, False, None)


def sample_ask(params: CreateMessageRequestParams, key: str | None, allow_preanswer: bool) -> Ask:
    request = CreateMessageRequest(params=params)
    rendered = json.dumps(
        request.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True, separators=(",", ":")
    )
    capability: Capability = "sampling.tools" if params.tools or params.tool_choice else "sampling"
    digest = _digest(b"sample", rendered.encode())
    return Ask("sample", lambda: request, digest, key, allow_preanswer, None, capability=capability)


def _client_result(kind: AskKind, answer: Any, key: str, version: str) -> Any:
    """A sampling or roots answer checked against its version's wire schema, as the SDK's model dumps it."""
    method = "sampling/createMessage" if kind == "sample" else "roots/list"
    try:
        client_result_schema(method, version).validate_python(answer, by_name=False)
        parsed = (_SAMPLING_RESULT if kind == "sample" else _ROOTS_RESULT).validate_python(answer, by_name=False)
    except ValidationError as exc:
        raise malformed(kind, exc, answer, key, version) from None
    dumped: Any = parsed.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


_ROOTS_RESULT = TypeAdapter[Any](ListRootsResult)


def client_result(key: str, method: str, answer: Any, version: str = LATEST_MODERN_VERSION) -> Any:
    """A sampling or roots answer outside a round (a task's `tasks/update`), checked as `Ask.accept` checks it."""
    return _client_result("sample" if method == "sampling/createMessage" else "roots", answer, key, version)


def malformed(kind: AskKind, exc: ValidationError, answer: Any, key: str, version: str) -> MalformedAnswer:
    """The `MalformedAnswer` for an answer that failed its wire schema with `exc`."""
    method = {"sample": "sampling/createMessage", "roots": "roots/list"}.get(kind, "elicitation/create")
    field, got = _first_problem(exc, answer)
    expected = (_ELICIT_EXPECTED if kind == "elicit" else _EXPECTED).get(field) or exc.errors()[0]["msg"].lower()
    return MalformedAnswer(key, method, version, field, expected, got)


def _first_problem(exc: ValidationError, answer: Any) -> tuple[str, str]:
    """The top-level field the first error is in, and a short view of what came instead."""
    error = exc.errors()[0]
    loc = [part for part in error["loc"] if isinstance(part, str | int)]
    if not loc:
        return "the answer", f" (got {type(answer).__name__})"
    field = str(loc[0])
    if not isinstance(answer, dict):
        return field, ""
    if field not in answer:
        return field, " (missing)"
    value = repr(answer[field])
    return field, f" (got {value if len(value) <= 60 else value[:57] + '...'})"


_ROOTS = ListRootsRequest()


def roots_ask(key: str | None, allow_preanswer: bool) -> Ask:
    return Ask("roots", lambda: _ROOTS, _ROOTS_DIGEST, key, allow_preanswer, None)


def _digest(*parts: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(b"\0".join(parts)).digest()[:12]).decode()


_ROOTS_DIGEST = _digest(b"roots")


_fields: weakref.WeakKeyDictionary[type[BaseModel], frozenset[str]] = weakref.WeakKeyDictionary()
_MODEL_VALIDATE = BaseModel.model_validate.__func__  # type: ignore[attr-defined]


def _plain_model_validate(schema: type[BaseModel]) -> bool:
    return getattr(schema.model_validate, "__func__", None) is _MODEL_VALIDATE


def _field_names(schema: type[BaseModel]) -> frozenset[str]:
    """Every name a form field may arrive under (its name and its alias)."""
    names = _fields.get(schema)
    if names is None:
        fields = schema.model_fields
        names = _fields[schema] = frozenset(fields) | {f.alias for f in fields.values() if f.alias}
    return names


def _schema_of(schema: type[BaseModel]) -> tuple[JSONObject, bytes]:
    cached = _schemas.get(schema)
    if cached is None:
        try:
            rendered = render_form_schema(schema)
        except TypeError as exc:
            raise FlowDefinitionError(str(exc)) from None
        canonical = json.dumps(rendered, sort_keys=True, separators=(",", ":")).encode()
        cached = _schemas[schema] = (rendered, canonical)
    return cached


SUPPORTED_FIELDS = (
    "form fields may be str (also date, datetime, EmailStr, AnyUrl: string formats), int, float, bool, "
    "a Literal or Enum/StrEnum of strings (a choice), or a list of those (several choices); "
    "any of them optional with a default"
)


def not_a_model(schema: object) -> str:
    return (
        f"ctx.elicit takes a pydantic model class as its schema, not {type(schema).__name__} {schema!r:.80}; "
        "declare `class Answer(BaseModel): ...` and pass Answer"
    )


class _FormJsonSchema(GenerateJsonSchema):
    """The spec's form fields have no `anyOf` or null type: `T | None` renders as `T`, optional by its default.

    The same rule as the SDK's `render_elicitation_schema`.
    """

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        result = super().default_schema(schema)
        if result.get("default") is None:
            result.pop("default", None)
        return result


def render_form_schema(schema: type[BaseModel]) -> JSONObject:
    """`requestedSchema` for a model, with Enum fields inlined as the spec's string enums.

    Pydantic renders an `Enum` as a `$ref` into `$defs`, which a form cannot hold; its
    values are copied into the field (the SDK's renderer rejects them). Every field is
    then checked against the spec's `PrimitiveSchemaDefinition`, as the SDK does.

    Raises:
        TypeError: A field no elicitation form can show; the message lists what can.
    """
    rendered = schema.model_json_schema(schema_generator=_FormJsonSchema)
    definitions = rendered.pop("$defs", {})
    properties: JSONObject = rendered.get("properties", {})
    fields = {field.alias or name: field for name, field in schema.model_fields.items()}  # properties are by alias
    for name, prop in properties.items():
        prop = properties[name] = _inline(prop, definitions)
        if "items" in prop:
            prop["items"] = _inline(prop["items"], definitions)
        field = fields.get(name)
        prop.setdefault("title", (field.title if field is not None else None) or name.replace("_", " ").title())
        try:
            FORM_FIELD.validate_python(prop)
            if "enum" in prop.get("items", prop) and prop.get("items", prop).get("type") != "string":
                raise ValueError("forms offer choices of strings only")
        except (ValidationError, ValueError):
            raise TypeError(
                f"{schema.__name__}.{name} renders as {prop!r}, which no elicitation form can show; {SUPPORTED_FIELDS}"
            ) from None
    return described_form(rendered, schema.__name__)


_CONSTRAINT_WORDS: dict[str, str] = {
    "pattern": "must match the pattern {}",
    "minLength": "at least {} characters",
    "maxLength": "at most {} characters",
    "minimum": "at least {}",
    "maximum": "at most {}",
    "exclusiveMinimum": "more than {}",
    "exclusiveMaximum": "less than {}",
    "multipleOf": "a multiple of {}",
    "minItems": "choose at least {}",
    "maxItems": "choose at most {}",
}
"""Constraints a form field may carry, and how its description says them to the person."""

_FORM_KEYWORDS = frozenset(
    {"type", "title", "description", "default", "format", "enum", "enumNames", "oneOf", "anyOf", "const", "items"}
    | {"examples", "uniqueItems", "deprecated", "readOnly", "writeOnly", "$comment"}
    | set(_CONSTRAINT_WORDS)
)
"""Every keyword a form field may hold: the spec's own, constraints said in words, and annotations."""


def described_form(schema: JSONObject, where: str) -> JSONObject:
    """`schema` with each field's constraints also said in its description ("Code (must match the
    pattern ^[A-Z]{3}$)"), so a person sees them even through a host that drops schema keywords
    (the spec's form fields carry no `pattern`, and some hosts drop the rest); the keywords stay.

    Raises:
        TypeError: A field holds a keyword no form can carry or say (`not`, `allOf`, `if`...):
            the answer could never be checked by the person who gives it.
    """
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return schema
    described: JSONObject = {}
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            described[name] = prop
            continue
        items = prop.get("items")
        field_props: JSONObject = items if isinstance(items, dict) else {}
        keywords = (set(prop) | set(field_props)) - _FORM_KEYWORDS - {"properties", "required"}
        unknown = sorted(k for k in keywords if not k.startswith("x-"))  # `x-...`: a vendor's hint, not a constraint
        if unknown:
            raise TypeError(
                f"{where}: field {name!r} has the constraint {unknown[0]!r}, which no elicitation form can carry "
                f"or show to the person answering; check it after the answer instead ({SUPPORTED_FIELDS})"
            )
        words = [_CONSTRAINT_WORDS[k].format(_shown(prop[k])) for k in _CONSTRAINT_WORDS if k in prop]
        words += [_CONSTRAINT_WORDS[k].format(_shown(field_props[k])) for k in _CONSTRAINT_WORDS if k in field_props]
        if not words:
            described[name] = prop
            continue
        said = "; ".join(words)
        text = prop.get("description")
        if isinstance(text, str) and said in text:
            described[name] = prop
            continue
        described[name] = prop | {"description": f"{text} ({said})" if text else said[0].upper() + said[1:]}
    return schema | {"properties": described}


def _shown(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def _inline(prop: JSONObject, definitions: JSONObject) -> JSONObject:
    ref = prop.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return prop
    target = {k: v for k, v in definitions.get(ref.removeprefix("#/$defs/"), {}).items() if k != "title"}
    return target | {k: v for k, v in prop.items() if k != "$ref"}


def supports(capabilities: ClientCapabilities | None, capability: Capability) -> bool:
    """Whether this request's declared capabilities allow `capability`.

    A bare `elicitation: {}` means form mode only (the spec's rule for pre-mode clients).
    """
    if capabilities is None:
        return False
    if capability.startswith("elicitation"):
        elicitation = capabilities.elicitation
        if elicitation is None:
            return False
        if capability == "elicitation.url":
            return elicitation.url is not None
        if capability == "elicitation.form":
            return elicitation.form is not None or elicitation.url is None
        return True
    if capability.startswith("sampling"):
        sampling = capabilities.sampling
        if sampling is None:
            return False
        return capability == "sampling" or sampling.tools is not None
    return capabilities.roots is not None


def required_capability(capability: Capability) -> JSONObject:
    """The `requiredCapabilities` payload of a -32021 error for `capability`."""
    required = {
        "elicitation": ClientCapabilities(elicitation=ElicitationCapability()),
        "elicitation.form": ClientCapabilities(elicitation=ElicitationCapability(form=FormElicitationCapability())),
        "elicitation.url": ClientCapabilities(elicitation=ElicitationCapability(url=UrlElicitationCapability())),
        "sampling": ClientCapabilities(sampling=SamplingCapability()),
        "sampling.tools": ClientCapabilities(sampling=SamplingCapability(tools=SamplingToolsCapability())),
        "roots": ClientCapabilities(roots=RootsCapability()),
    }[capability]
    return required.model_dump(mode="json", by_alias=True, exclude_none=True)


__all__ = [
    "form_ask",
    "human_reason",
    "SUPPORTED_FIELDS",
    "Ask",
    "AskKind",
    "MAX_REJECTED",
    "AnswerRejected",
    "described_form",
    "BadAnswer",
    "Capability",
    "FormAnswer",
    "MalformedAnswer",
    "client_result",
    "malformed",
    "elicit_ask",
    "elicit_url_ask",
    "not_a_model",
    "render_form_schema",
    "required_capability",
    "roots_ask",
    "sample_ask",
    "supports",
]
