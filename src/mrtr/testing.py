"""Replay testing: does new flow code still replay the journals the old code recorded?

A rolling upgrade runs old and new code side by side, and flows started by the old code
finish on the new. Before deploying, replay journals recorded in production (a task
record's `journal`, or a `requestState` opened with your key) against the new code:

    from mrtr.testing import check_replay, journal_from_state

    report = await check_replay(flows, "deploy", journal_from_state(token, security), {"service": "api"})
    assert report.ok, report.explain()

The replay runs no step and asks nothing: it reads the journal as far as it goes and
stops where new work would begin. Divergence is what would go wrong in production: a
step the journal holds that the new code never reaches (its work would be redone or
lost), new steps run while recorded ones are still ahead, or an outright error
(`NondeterminismError`, `FlowDefinitionError`). Questions asked differently are only
reported (`reasked`): a changed question is simply asked again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp.server.request_state import RequestStateSecurity
from mcp_types import (
    ClientCapabilities,
    ElicitationCapability,
    FormElicitationCapability,
    RootsCapability,
    SamplingCapability,
    UrlElicitationCapability,
)

from mrtr._engine import journal as journal_codec
from mrtr._engine.engine import RunOptions, execute
from mrtr._engine.journal import Journal
from mrtr._flows import Flows

_EVERYTHING = ClientCapabilities(
    elicitation=ElicitationCapability(form=FormElicitationCapability(), url=UrlElicitationCapability()),
    sampling=SamplingCapability(),
    roots=RootsCapability(),
)


@dataclass
class ReplayReport:
    """What replaying one recorded journal against the current code found."""

    flow: str
    divergence: list[str] = field(default_factory=list)
    would_run: list[str] = field(default_factory=list)
    """Steps the new code would run next (new work: fine once the journal is used up)."""
    would_ask: list[str] = field(default_factory=list)
    """Wire keys the new code would ask next."""
    reasked: list[str] = field(default_factory=list)
    """Recorded answers whose question the new code no longer asks (they would be asked again)."""
    finished: bool = False
    """The flow would complete from the journal alone."""

    @property
    def ok(self) -> bool:
        return not self.divergence

    def explain(self) -> str:
        if self.ok:
            return f"flow {self.flow!r} replays its journal"
        return f"flow {self.flow!r} diverges from its journal: " + "; ".join(self.divergence)


def journal_from_state(token: str, security: RequestStateSecurity) -> Journal:
    """Open a sealed `requestState` with your key ring (for debugging and replay tests only)."""
    claims = json.loads(security.codec.unseal(token))
    return journal_codec.decode(claims["s"])


async def check_replay(
    flows: Flows,
    name: str,
    journal: Journal | str,
    arguments: Mapping[str, Any] | None = None,
) -> ReplayReport:
    """Replay `journal` (a `Journal`, or its encoded form as a task record stores it) against flow `name`."""
    spec = flows.specs.get(name)
    if spec is None:
        raise KeyError(f"no flow {name!r} is registered on these Flows (known: {sorted(flows.specs)})")
    recorded = journal_codec.decode(journal) if isinstance(journal, str) else journal
    # Work on a copy: the replay consumes and may prune it.
    copy = journal_codec.decode(journal_codec.encode(recorded))
    outcome = await execute(spec, copy, {}, _EVERYTHING, dict(arguments or {}), RunOptions(dry_run=True))
    replay = outcome.replay
    report = ReplayReport(flow=name, would_run=outcome.would_run, would_ask=list(replay.parked))
    report.reasked = [key for key in recorded.answers if key not in copy.answers]
    if outcome.error is not None:
        report.divergence.append(f"{type(outcome.error).__name__}: {outcome.error}")
    unreached_steps = [entry for entry in replay.unconsumed() if entry.startswith("step ")]
    if unreached_steps:
        where = f" (it would run {', '.join(map(repr, outcome.would_run))} instead)" if outcome.would_run else ""
        report.divergence.append(f"recorded {', '.join(unreached_steps)} never reached{where}")
    report.finished = not outcome.parked and outcome.error is None
    return report


__all__ = ["ReplayReport", "check_replay", "journal_from_state"]
