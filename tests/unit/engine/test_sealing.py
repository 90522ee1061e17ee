"""Sealing, estimated before the SDK seals: a state over the flow's cap fails in the round, naming the flow.

`sealed_size` must bound what the SDK's `RequestStateSecurity` codec mints around the state
(the claims envelope of `RequestStateBoundary`, built here from the SDK's public
`compact_json` and sealed by the real AES-GCM codec); `state_within_cap` must pass a state
under the cap through as the encoded journal and refuse one over it.
"""

from __future__ import annotations

import os
import time

import pytest
from mcp.server.request_state import RequestStateSecurity, compact_json

from mrtr import StateTooLarge
from mrtr._engine import journal as codec
from mrtr._engine import sealing
from mrtr._engine.journal import Journal
from mrtr._engine.round import Round
from mrtr._engine.spec import Limits
from tests.support.enginekit import spec_of

SECURITY = RequestStateSecurity(keys=[os.urandom(32)])


async def flow() -> None:
    return None


def round_for(cap: int, target: str = "deploy") -> Round:
    return Round(
        spec=spec_of(flow, limits=Limits(max_state_bytes=cap), name="deploy"),
        request=None,
        method="tools/call",
        target=target,
        arguments={},
        protocol_version="2026-07-28",
        capabilities=None,
        client_info=None,
        state=None,
        answers={},
        state_security=lambda: SECURITY,
    )


def journal_with(payload_bytes: int) -> Journal:
    journal = Journal.start()
    journal.steps["blob"] = ("d" * 12, os.urandom(payload_bytes).hex())  # incompressible
    return journal


def real_seal(state: str, round: Round) -> str:
    """What the SDK's boundary seals for this round (its claims, with a principal and an audience)."""
    now = time.time()
    claims = {"v": 1, "iat": now, "exp": now + SECURITY.ttl, "m": round.method, "t": round.target}
    claims |= {"a": "A" * 22, "s": state, "aud": round.spec.audience, "p": "P" * 32}
    return SECURITY.codec.seal(compact_json(claims).encode())


@pytest.mark.parametrize("payload_bytes", [0, 10, 300, 3000, 20_000])
def test_the_estimate_bounds_the_real_sealed_state(payload_bytes: int) -> None:
    round = round_for(1 << 20)
    state = codec.encode(journal_with(payload_bytes))
    sealed = len(real_seal(state, round))
    estimate = sealing.sealed_size(state, round)
    assert sealed <= estimate <= sealed * 1.05 + 64  # an upper bound, and a tight one


def test_the_estimate_counts_the_target_the_state_is_bound_to() -> None:
    state = codec.encode(journal_with(100))
    assert sealing.sealed_size(state, round_for(1 << 20, "x" * 500)) > sealing.sealed_size(state, round_for(1 << 20))


def test_a_state_under_the_cap_is_the_encoded_journal() -> None:
    journal = journal_with(100)
    assert sealing.state_within_cap(journal, round_for(64 * 1024)) == codec.encode(journal)
    big = journal_with(4000)  # near the cap: measured, and still under it
    round = round_for(len(real_seal(codec.encode(big), round_for(1 << 20))) + 200)
    assert sealing.state_within_cap(big, round) == codec.encode(big)


def test_a_state_over_the_cap_fails_naming_the_flow_and_the_fix() -> None:
    with pytest.raises(StateTooLarge, match=r"flow 'deploy' would carry a [\d,]+-byte requestState, over its 4,096"):
        sealing.state_within_cap(journal_with(3000), round_for(4096))
