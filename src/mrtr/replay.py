"""One execution of a flow against its journal: the heart of mrtr.

Each round runs the flow function from the top. Asks already answered, and steps already
finished, return their journaled values instantly; a new answer in `inputResponses` is
checked against the question it claims to answer and journaled; the first asks with no
answer *park* the branches that made them. When every branch of the flow is parked or
done and no step is still running, the round *settles*: the flow is cancelled and the
parked asks go out together in one `InputRequiredResult`.

Settling (rather than stopping at the first unanswered ask) is what lets `ctx.gather`
and plain `asyncio.gather` batch their asks into one round, and guarantees a step that
was running when another branch parked finishes and is journaled rather than lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from mcp_types import ClientCapabilities

from mrtr import tracing
from mrtr.asks import Ask, BadAnswer
from mrtr.errors import FlowDefinitionError, NondeterminismError
from mrtr.journal import Journal

logger = tracing.get_logger(__name__)

# Event-loop passes with no new activity before a round counts as settled. Ready
# branches run within one pass; three leaves margin for chained task wake-ups.
_QUIET_PASSES = 3


def numbered(counts: dict[str, int], name: str) -> str:
    """`name` the first time, then `name#2`, `name#3`...: stable step keys for repeated names."""
    n = counts.get(name, 0) + 1
    counts[name] = n
    return name if n == 1 else f"{name}#{n}"


class Replay:
    """Bookkeeping for one round: what the flow asked, what it may use, what to keep."""

    def __init__(
        self,
        journal: Journal,
        answers: Mapping[str, Any],
        capabilities: ClientCapabilities | None,
    ) -> None:
        self.journal = journal
        self.capabilities = capabilities
        self._incoming = answers
        self._ask_counts: dict[str, int] = {}
        self._explicit_keys: set[str] = set()
        self._step_counts: dict[str, int] = {}
        self.parked: dict[str, Ask] = {}
        self._activity = 0
        self._running_steps = 0
        self._steps_idle = asyncio.Event()
        self._steps_idle.set()
        self._park_forever: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._settle_task: asyncio.Task[None] | None = None
        self.settled = False

    # -- asks ---------------------------------------------------------------------------

    def key_for(self, ask: Ask) -> str:
        if ask.explicit_key is not None:
            if ask.explicit_key in self._explicit_keys:
                raise FlowDefinitionError(
                    f"key {ask.explicit_key!r} was asked twice in one run; explicit keys name one question "
                    f"each (in a loop, make the key unique, e.g. key=f'{ask.explicit_key}_{{i}}')"
                )
            self._explicit_keys.add(ask.explicit_key)
            return ask.explicit_key
        n = self._ask_counts.get(ask.digest, 0) + 1
        self._ask_counts[ask.digest] = n
        return ask.derived_key(n)

    def answer_for(self, key: str, ask: Ask) -> Any | None:
        """The journaled or newly arrived answer to `ask`, or None when it must be asked."""
        self._activity += 1
        recorded = self.journal.answers.get(key)
        if recorded is not None:
            if recorded[0] == ask.digest:
                return recorded[1]
            # Same key, different question (new code, new wording): ask again.
            del self.journal.answers[key]
        if key not in self._incoming:
            return None
        asked = self.journal.pending.get(key) == ask.digest
        if not asked and not ask.allow_preanswer:
            logger.info("ignoring an answer to %r: that question was not asked", key)
            return None
        try:
            accepted = ask.accept(self._incoming[key])
        except BadAnswer as exc:
            logger.info("re-asking %r: %s", key, exc)
            return None
        self.journal.answers[key] = (ask.digest, accepted)
        return accepted

    def pending(self) -> dict[str, str]:
        """The parked asks as the journal remembers them: wire key -> question digest."""
        return {key: ask.digest for key, ask in self.parked.items()}

    async def park(self, key: str, ask: Ask) -> Any:
        """Hold this branch until the round settles; it never resumes (the flow is cancelled)."""
        self.parked[key] = ask
        self._activity += 1
        if self._settle_task is None:
            self._settle_task = asyncio.get_running_loop().create_task(self._settle())
        return await asyncio.shield(self._park_forever)

    # -- steps --------------------------------------------------------------------------

    def step_key(self, name: str) -> str:
        return numbered(self._step_counts, name)

    def recorded_step(self, key: str, arg_digest: str) -> tuple[bool, Any]:
        self._activity += 1
        recorded = self.journal.steps.get(key)
        if recorded is None:
            return False, None
        if arg_digest and recorded[0] and recorded[0] != arg_digest:
            raise NondeterminismError(
                f"step {key!r} was called with different arguments than when it ran; code before it "
                "is not deterministic (move clocks, randomness and I/O into ctx.step)"
            )
        return True, recorded[1]

    def step_started(self) -> None:
        self._running_steps += 1
        self._steps_idle.clear()

    def step_finished(self, key: str | None, arg_digest: str, value: Any) -> None:
        if key is not None:
            self.journal.steps[key] = (arg_digest, value)
        self._running_steps -= 1
        self._activity += 1
        if self._running_steps == 0:
            self._steps_idle.set()

    # -- settling -----------------------------------------------------------------------

    async def _settle(self) -> None:
        while True:
            await self._steps_idle.wait()
            mark = self._activity
            for _ in range(_QUIET_PASSES):
                await asyncio.sleep(0)
            if self._running_steps == 0 and self._activity == mark:
                break
        self.settled = True
        self.flow_task.cancel()

    flow_task: asyncio.Task[Any]

    def close(self) -> None:
        if self._settle_task is not None and not self._settle_task.done():
            self._settle_task.cancel()
        if not self._park_forever.done():
            self._park_forever.cancel()
