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
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from mcp.server.elicitation import render_elicitation_schema
from mcp_types import (
    ClientCapabilities,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
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
    UrlElicitationCapability,
)
from pydantic import BaseModel, ValidationError

AskKind = Literal["elicit", "elicit_url", "sample", "roots"]

Capability = Literal["elicitation", "elicitation.form", "elicitation.url", "sampling", "sampling.tools", "roots"]


class BadAnswer(Exception):
    """The client's answer does not fit the question; the question is asked again."""


@dataclass(frozen=True, slots=True)
class Ask:
    kind: AskKind
    request: InputRequest
    digest: str
    explicit_key: str | None
    allow_preanswer: bool
    schema: type[BaseModel] | None = None

    @property
    def capability(self) -> Capability:
        return _CAPABILITY[self.kind]

    def derived_key(self, occurrence: int) -> str:
        """Stable wire key: kind + question digest, + a counter when asked again in one run."""
        base = f"{self.kind}_{self.digest[:10]}"
        return base if occurrence == 1 else f"{base}_{occurrence}"

    def wire_request(self) -> dict[str, Any]:
        return self.request.model_dump(mode="json", by_alias=True, exclude_none=True)

    def accept(self, answer: Any) -> Any:
        """Validate a wire answer and return the JSON to journal (exactly what passed).

        Raises:
            BadAnswer: The answer is of the wrong kind or fails the requested schema.
        """
        if self.kind in ("elicit", "elicit_url"):
            try:
                result = ElicitResult.model_validate(answer)
            except ValidationError:
                raise BadAnswer("not an elicitation result") from None
            if result.action != "accept" or self.kind == "elicit_url":
                return {"action": result.action}
            if result.content is None:
                raise BadAnswer("accepted without content")
            assert self.schema is not None
            try:
                self.schema.model_validate(result.content)
            except ValidationError:
                raise BadAnswer("content does not match the requested schema") from None
            return {"action": "accept", "content": result.content}
        model = CreateMessageResult if self.kind == "sample" else ListRootsResult
        try:
            parsed = model.model_validate(answer)
        except ValidationError:
            raise BadAnswer(f"not a {model.__name__}") from None
        return parsed.model_dump(mode="json", by_alias=True, exclude_none=True)


_CAPABILITY: dict[AskKind, Capability] = {
    "elicit": "elicitation.form",
    "elicit_url": "elicitation.url",
    "sample": "sampling",
    "roots": "roots",
}


# Every round replays every ask: rendering and digesting a question once per process, not
# once per replay, is most of what a round costs. Asks are immutable, so sharing is safe.
@lru_cache(maxsize=4096)
def elicit_ask(message: str, schema: type[BaseModel], key: str | None, allow_preanswer: bool) -> Ask:
    params = ElicitRequestFormParams(message=message, requested_schema=_schema_of(schema))
    return _ask("elicit", ElicitRequest(params=params), key, allow_preanswer, schema)


@lru_cache(maxsize=1024)
def elicit_url_ask(message: str, url: str, key: str | None) -> Ask:
    # The 2026-07-28 wire correlates through requestState; the id stays for older peers.
    elicitation_id = key or hashlib.sha256(f"{message}\0{url}".encode()).hexdigest()[:16]
    params = ElicitRequestURLParams(message=message, url=url, elicitation_id=elicitation_id)
    return _ask("elicit_url", ElicitRequest(params=params), key, False, None)


def sample_ask(params: CreateMessageRequestParams, key: str | None, allow_preanswer: bool) -> Ask:
    return _ask("sample", CreateMessageRequest(params=params), key, allow_preanswer, None)


@lru_cache(maxsize=256)
def roots_ask(key: str | None, allow_preanswer: bool) -> Ask:
    return _ask("roots", ListRootsRequest(), key, allow_preanswer, None)


def _ask(
    kind: AskKind, request: InputRequest, key: str | None, allow_preanswer: bool, schema: type[BaseModel] | None
) -> Ask:
    if allow_preanswer and key is None:
        raise TypeError("allow_preanswer=True needs an explicit key=: a client can only pre-answer a key it knows")
    rendered = json.dumps(
        request.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True, separators=(",", ":")
    )
    digest = base64.urlsafe_b64encode(hashlib.sha256(rendered.encode()).digest()[:12]).decode()
    return Ask(kind, request, digest, key, allow_preanswer, schema)


@lru_cache(maxsize=512)
def _schema_of(schema: type[BaseModel]) -> dict[str, Any]:
    return render_elicitation_schema(schema)


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


def required_capability(capability: Capability) -> dict[str, Any]:
    """The `requiredCapabilities` payload of a -32021 error for `capability`."""
    required = {
        "elicitation": ClientCapabilities(elicitation=ElicitationCapability()),
        "elicitation.form": ClientCapabilities(elicitation=ElicitationCapability(form=FormElicitationCapability())),
        "elicitation.url": ClientCapabilities(elicitation=ElicitationCapability(url=UrlElicitationCapability())),
        "sampling": ClientCapabilities(sampling=SamplingCapability()),
        "sampling.tools": ClientCapabilities(sampling=SamplingCapability()),
        "roots": ClientCapabilities(roots=RootsCapability()),
    }[capability]
    return required.model_dump(mode="json", by_alias=True, exclude_none=True)
