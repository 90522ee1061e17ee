"""How big a round's sealed `requestState` will be, before the SDK seals it.

The request-state boundary seals the journal after the flow's round ends; a state over
the flow's cap must fail in the round (with the flow's name and the fix), not as an
opaque transport error later. Only near the cap is the size worth estimating.
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

from mrtr import _sdk as sdk
from mrtr._engine import journal as journal_codec
from mrtr._errors import StateTooLarge

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context

    from mrtr._engine.journal import Journal


def sealed_size(state: str, request: Context[Any, Any], audience: str, *, target: str | None = None) -> int:
    """Upper estimate of the token the boundary will mint around `state`.

    The claims envelope mirrors `RequestStateBoundary._seal` (times, method, target,
    argument digest, audience, principal tag); the codec's cost is measured on the
    server's real codec.
    """
    wire = sdk.request_wire(request)
    if target is None:
        params = wire.params or {}
        target = str(params.get("uri" if wire.method == "resources/read" else "name", ""))
    now = time.time()
    claims = {"v": 1, "iat": now, "exp": now, "m": wire.method, "t": target, "a": "x" * 22, "s": state}
    claims |= {"aud": audience, "p": "x" * 32}
    payload = len(json.dumps(claims, separators=(",", ":"))) + 8
    fixed, per_byte = sdk.codec_cost(request)
    return math.ceil(fixed + per_byte * payload) + 4


def state_within_cap(journal: Journal, request: Context[Any, Any], audience: str, cap: int, flow: str) -> str:
    """The journal as the `requestState` the boundary will seal; `StateTooLarge` past `cap`.

    Sealing costs at most ~2.7x the state plus a fixed envelope, so only near the cap is
    the size estimated.
    """
    state = journal_codec.encode(journal)
    if 3 * len(state) + 512 >= cap and (sealed := sealed_size(state, request, audience)) > cap:
        raise StateTooLarge(
            f"flow {flow!r} would carry a {sealed:,}-byte requestState, over its {cap:,}-byte cap; "
            "keep step results small (journal an id, not a payload)"
        )
    return state


__all__ = ["sealed_size", "state_within_cap"]
