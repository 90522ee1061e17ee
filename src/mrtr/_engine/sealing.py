"""How big a round's sealed `requestState` will be, before the SDK seals it.

The request-state boundary seals the journal after the flow's round ends; a state over
the flow's cap must fail in the round (with the flow's name and the fix), not as an
opaque transport error later. Only near the cap is the size worth estimating.
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING

from mrtr import _sdk as sdk
from mrtr._engine import journal as journal_codec
from mrtr._errors import StateTooLarge

if TYPE_CHECKING:
    from mrtr._engine.journal import Journal
    from mrtr._engine.round import Round


def sealed_size(state: str, round: Round, *, target: str | None = None) -> int:
    """Upper estimate of the token the boundary will mint around `state` for this round.

    The claims envelope mirrors `RequestStateBoundary._seal` (times, method, target,
    argument digest, audience, principal tag); the codec's cost is measured on the
    server's real codec.
    """
    target = round.target if target is None else target
    now = time.time()
    claims = {"v": 1, "iat": now, "exp": now, "m": round.method, "t": target, "a": "x" * 22, "s": state}
    claims |= {"aud": round.spec.audience, "p": "x" * 32}
    payload = len(json.dumps(claims, separators=(",", ":"))) + 8
    if round.state_security is None:
        fixed, per_byte = sdk.codec_cost(round.request)
    else:
        fixed, per_byte = sdk.security_cost(round.state_security())
    return math.ceil(fixed + per_byte * payload) + 4


def state_within_cap(journal: Journal, round: Round) -> str:
    """The journal as the `requestState` the boundary will seal; `StateTooLarge` past the flow's cap.

    Sealing costs at most ~2.7x the state plus a fixed envelope, so only near the cap is
    the size estimated.
    """
    state = journal_codec.encode(journal)
    cap, flow = round.spec.limits.max_state_bytes, round.spec.name
    if 3 * len(state) + 512 >= cap and (sealed := sealed_size(state, round)) > cap:
        raise StateTooLarge(
            f"flow {flow!r} would carry a {sealed:,}-byte requestState, over its {cap:,}-byte cap; "
            "keep step results small (journal an id, not a payload)"
        )
    return state


__all__ = ["sealed_size", "state_within_cap"]
