"""One execution of a flow against its journal: the heart of mrtr.

Each round runs the flow function from the top. Asks already answered, and steps already
finished, return their journaled values instantly; a new answer in `inputResponses` is
checked against the question it claims to answer and journaled; an ask with no answer
*parks* the branch that made it. When no task of the flow can move without the client
(`quiescence`) and no step is running, the round *settles*: from then on the flow is
*suspended* — every `ctx` call raises `FlowSuspended` — and every task it started is
cancelled and awaited, so its `finally` blocks unwind without asking, stepping or
journaling anything. The parked asks go out together in one `InputRequiredResult`.

Settling (rather than stopping at the first unanswered ask) is what lets `ctx.gather`
and plain `asyncio.gather` batch their asks into one round, and guarantees that a step
running when another branch parked finishes, and is journaled, rather than lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from mcp_types import ClientCapabilities

from mrtr._engine import journal as journal_codec
from mrtr._engine import quiescence
from mrtr._engine.asks import Ask, BadAnswer
from mrtr._engine.branches import Branch, current_branch, outside_branch
from mrtr._engine.journal import Journal, embedded_length, entry_size
from mrtr._engine.questions import question_of
from mrtr._errors import FlowDefinitionError, FlowSuspended, NondeterminismError, StateTooLarge
from mrtr._telemetry import tracing
from mrtr._wire import Wait

logger = tracing.get_logger("mrtr.replay")

# Passes with nothing runnable before the round settles: a finished task's callbacks (a
# gather's or TaskGroup's completion) reach its waiting parent one or two passes later.
_CONFIRM_PASSES = 3
# How long teardown keeps cancelling a task that refuses to end (it swallowed the cancel).
_TEARDOWN_TRIES = 50

_RESERVED = re.compile(r"[#/@]")
_DERIVED_KEY = re.compile(r"^(elicit|elicit_url|sample|roots)_[A-Za-z0-9_-]{10}(_\d+)?(@[\d.]+)?$")


def step_key(branch: Branch, name: str) -> str:
    """`name`, `name#2`... within a branch; a concurrent branch's keys carry its path."""
    n = branch.step_counts.get(name, 0) + 1
    branch.step_counts[name] = n
    key = name if n == 1 else f"{name}#{n}"
    return f"{branch.path}/{key}" if branch.path else key


def _step_path(key: str) -> str:
    return key.rpartition("/")[0]


def _ask_path(key: str) -> str:
    match = _BRANCH_SUFFIX.search(key)
    return match.group(1) if match else ""


_BRANCH_SUFFIX = re.compile(r"@([\d.]+)$")


def check_step_name(flow: str, name: str) -> None:
    if name in _good_names:  # every replay of a step checks its name again: remember the good ones
        return
    if not name or _RESERVED.search(name):
        raise FlowDefinitionError(
            f"flow {flow!r}: step name {name!r} is not allowed: names must be non-empty and free of '#', '/' and '@', "
            "which mrtr uses to number repeated and concurrent steps"
        )
    if len(name) <= 256:  # names made from data (f"fetch-{id}") must not grow it without bound
        if len(_good_names) >= 4096:
            _good_names.clear()
        _good_names.add(name)


_good_names: set[str] = set()


class Replay:
    """Bookkeeping for one round: what the flow asked, what it may use, what to keep.

    Args:
        flow: The flow's name, for error messages.
        budget: Bytes the journal may grow to (ephemeral flows: what fits in the sealed
            `requestState`); `None` for durable tasks, whose journal lives in a store.
        state_cap: The sealed-state cap the budget derives from, for error messages.
        base_size: An upper bound of the journal's encoded size as it arrived (else measured).
    """

    def __init__(
        self,
        journal: Journal,
        answers: Mapping[str, Any],
        capabilities: ClientCapabilities | None,
        *,
        flow: str = "flow",
        budget: int | None = None,
        state_cap: int | None = None,
        base_size: int | None = None,
    ) -> None:
        self.journal = journal
        self.capabilities = capabilities
        self.flow = flow
        self.budget = budget
        self.state_cap = state_cap
        self._incoming = answers
        self._explicit_keys: set[str] = set()
        # What this run reached, by table: journaled answers and steps it used, and pending
        # asks of the last round it asked again.
        self._used_answers: set[str] = set()
        self._used_steps: set[str] = set()
        self._used_pending: set[str] = set()
        self._size: int | None = base_size
        self.parked: dict[str, Ask] = {}
        self.waits: dict[str, Wait] = {}
        """wait key -> what a parked `ctx.sleep` / `ctx.wait_for_event` waits for (`{"kind", "name", "until"}`)."""
        self._wakers: dict[str, tuple[asyncio.Future[Any], Callable[[], Any]]] = {}
        self.reasked: dict[str, str] = {}
        """wire key -> why the client's answer to it was not used (shown with the re-ask)."""
        self._reworded: set[str] = set()
        self.tasks: list[asyncio.Task[Any]] = []
        self._branches: list[Branch] = []
        self._parked_tasks: set[asyncio.Task[Any]] = set()
        self._running_steps = 0
        self._steps_idle: asyncio.Event | None = None  # made by the first step: most rounds run none
        self._watcher: asyncio.Task[None] | None = None
        self._activity = 0
        self.suspended = False
        """No ctx call may act any more: the round has settled, or the run is being torn down."""
        self.settled = False
        """The round ended on its own, with the flow waiting for the client."""
        self.flow_ended = False
        self.ending: Any = None
        """What the flow function returned, or the exception it ended with."""
        self.root = Branch(self, "")

    # -- the flow's tasks ---------------------------------------------------------------

    def adopt(self, task: asyncio.Task[Any], branch: Branch) -> None:
        """Count `task` as the flow's: it must be quiet for the round to settle, and it is
        cancelled and awaited before the round returns."""
        self.tasks.append(task)
        self._branches.append(branch)

    def branch(self) -> Branch:
        """The calling task's branch, checked to belong to this run."""
        if self.suspended:
            raise FlowSuspended(self.flow)
        branch = current_branch.get()
        if branch is None or branch.replay is not self or branch.detached:
            raise FlowDefinitionError(
                f"flow {self.flow!r}: ctx was used outside the flow's own tasks (inside a step's function, a "
                "thread, or a task started elsewhere); call ctx only from the flow body and the tasks it starts"
            )
        return branch

    # -- asks ---------------------------------------------------------------------------

    def key_for(self, branch: Branch, ask: Ask) -> str:
        explicit = ask.explicit_key
        if explicit is not None:
            if _DERIVED_KEY.match(explicit):
                raise FlowDefinitionError(
                    f"flow {self.flow!r}: key {explicit!r} has the shape of a key mrtr derives itself; "
                    "choose another name"
                )
            if explicit in self._explicit_keys:
                raise FlowDefinitionError(
                    f"flow {self.flow!r}: key {explicit!r} was asked twice in one run; explicit keys name one "
                    f"question each (in a loop, make the key unique, e.g. key=f'{explicit}_{{i}}')"
                )
            self._explicit_keys.add(explicit)
            if branch.path and explicit not in self.journal.origins:
                self.journal.origins[explicit] = branch.path
            return explicit
        counts = branch.ask_counts
        n = counts[ask.digest] = counts.get(ask.digest, 0) + 1
        key = ask.key_base if n == 1 else ask.derived_key(n)
        return f"{key}@{branch.path}" if branch.path else key

    def answer_for(self, key: str, ask: Ask) -> Any | None:
        """The journaled or newly arrived answer to `ask`, or None when it must be asked."""
        self._activity += 1
        journal = self.journal
        if key in journal.pending:
            self._used_pending.add(key)
        recorded = journal.answers.get(key)
        if recorded is not None:
            if recorded[0] == ask.digest:
                self._used_answers.add(key)
                return recorded[1]
            # Same key, different question (new code, new wording): ask again.
            del journal.answers[key]
            journal.questions.pop(key, None)
            self._size = None
        if key not in self._incoming:
            return None
        asked = self.journal.pending.get(key) == ask.digest
        if not asked and key in self.journal.pending:
            self._reworded.add(key)  # the key was asked, but as another question
        if not asked and not ask.allow_preanswer:
            logger.info("flow %s: ignoring an answer to %r: that question was not asked", self.flow, key)
            return None
        try:
            accepted = ask.accept(self._incoming[key], key=key)  # a malformed sampling/roots answer raises
        except BadAnswer as exc:
            logger.info("flow %s: re-asking %r: %s", self.flow, key, exc)
            self.reasked[key] = str(exc)
            return None
        if not self._admit(self.journal.answers, key, (ask.digest, accepted)):
            reason = "the answer is too large to carry to the next round"
            logger.info("flow %s: re-asking %r: %s", self.flow, key, reason)
            self.reasked[key] = reason
            return None
        self._used_answers.add(key)
        if self.budget is None:
            self._note(key, ask, answered=True)
        logger.debug("flow %s: the answer to %r was accepted and journaled", self.flow, key)
        return accepted

    def unused_answers(self) -> list[str]:
        """Keys the last round asked and the client answered, whose answer this run did not use
        because the flow never asked that question again (it asked a reworded one instead)."""
        journal = self.journal
        return [
            key
            for key in journal.pending
            if key in self._incoming and (key not in self._used_pending or key in self._reworded)
        ]

    def pending(self) -> dict[str, str]:
        """The parked asks as the journal remembers them: wire key -> question digest."""
        return {key: ask.digest for key, ask in self.parked.items()}

    async def park(self, key: str, ask: Ask | None) -> Any:
        """Hold this branch until the round settles; it never resumes (the flow is suspended).

        `ask=None` holds a branch without asking anything (a replay test reaching new work).
        """
        task = asyncio.current_task()
        assert task is not None
        if ask is not None:
            self.parked[key] = ask
            if self.budget is None:
                self._note(key, ask, answered=False)
        self._activity += 1
        if self._watcher is None:
            if not self._running_steps and all(t is task or t.done() for t in self.tasks):
                # The only task of the flow still alive is this one, and it waits for the
                # client: nothing else can move, so the round is over now (the common case
                # of a flow without concurrent branches needs no watcher at all). It unwinds
                # from here, as it would on being cancelled.
                self.settled = self.suspended = True
                raise asyncio.CancelledError
            with outside_branch():  # the watcher is mrtr's, not one of the flow's tasks
                self._watcher = asyncio.get_running_loop().create_task(self._watch())
        self._parked_tasks.add(task)
        try:
            # Never resolved: the branch waits here until the round's teardown cancels it.
            return await asyncio.get_running_loop().create_future()
        finally:
            self._parked_tasks.discard(task)

    async def park_wait(self, key: str, info: Wait, resolve: Callable[[], Any]) -> Any:
        """Hold this branch on a durable wait until `resolve()` (tried only while the flow is
        quiescent, see `mrtr._engine.waits`) gives its outcome, or the round settles.

        `resolve` journals and returns the wait's outcome, or returns None while it cannot resolve.
        """
        task = asyncio.current_task()
        assert task is not None
        self._activity += 1
        if self._watcher is None:
            if not self._running_steps and all(t is task or t.done() for t in self.tasks):
                # Quiescent already (the one live task is this one): resolve now, or settle.
                outcome = resolve()
                if outcome is not None:
                    return outcome
                self.waits[key] = info
                self.settled = self.suspended = True
                raise asyncio.CancelledError
            with outside_branch():
                self._watcher = asyncio.get_running_loop().create_task(self._watch())
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waits[key] = info
        self._wakers[key] = (future, resolve)
        self._parked_tasks.add(task)
        try:
            return await future
        finally:
            self._parked_tasks.discard(task)
            self._wakers.pop(key, None)
            if future.done() and not future.cancelled():
                self.waits.pop(key, None)

    def _wake_waits(self) -> bool:
        """At quiescence: resolve every parked wait that can resolve now; whether any did."""
        woke = False
        for future, resolve in list(self._wakers.values()):
            if not future.done():
                outcome = resolve()
                if outcome is not None:
                    future.set_result(outcome)
                    woke = True
        return woke

    # -- steps --------------------------------------------------------------------------

    def recorded_step(self, key: str, arg_digest: str) -> tuple[bool, Any]:
        self._activity += 1
        if key == self.journal.fork_from:
            self._forked()
        recorded = self.journal.steps.get(key)
        if recorded is None:
            return False, None
        if arg_digest and recorded[0] and recorded[0] != arg_digest:
            raise NondeterminismError(
                f"flow {self.flow!r}: step {key!r} was called with different arguments than when it ran; code "
                "before it is not deterministic (move clocks, randomness and I/O into ctx.step)"
            )
        self._used_steps.add(key)
        return True, recorded[1]

    def _forked(self) -> None:
        """The run reached the step an operator forked the task from: that step and everything
        after it run again. The steps after it are gone from the journal already (`TaskAdmin`
        cut them); the answers this run has not used were given after it, so they go too."""
        journal = self.journal
        journal.fork_from = None
        for key in [k for k in journal.answers if k not in self._used_answers]:
            del journal.answers[key]
            journal.origins.pop(key, None)
        self._size = None

    @property
    def running_steps(self) -> int:
        return self._running_steps

    def step_started(self) -> None:
        self._running_steps += 1
        if self._steps_idle is None:
            self._steps_idle = asyncio.Event()
        self._steps_idle.clear()

    def record_step(self, key: str, arg_digest: str, value: Any) -> None:
        """Journal a finished step's value, or refuse it if it cannot travel (`StateTooLarge`)."""
        if not self._admit(self.journal.steps, key, (arg_digest, value)):
            raise StateTooLarge(
                f"flow {self.flow!r}: step {key!r} returned a value too large to journal within the "
                f"{self.state_cap or self.budget:,}-byte cap on the sealed requestState; journal an id or a "
                "summary, not the payload (or raise max_state_bytes)"
            )
        self._used_steps.add(key)

    def step_ended(self) -> None:
        """The step (and its checkpoint write) is over, however it ended."""
        self._running_steps -= 1
        self._activity += 1
        if self._running_steps == 0 and self._steps_idle is not None:
            self._steps_idle.set()

    # -- versioning ---------------------------------------------------------------------

    def patched(self, branch: Branch, patch_id: str) -> bool:
        """Temporal's `patched`: true for new progress, true on replay only if recorded."""
        if patch_id in self.journal.markers:
            return True
        if self._at_frontier(branch):
            self.journal.markers.add(patch_id)
            return True
        return False

    def at_frontier(self, branch: Branch) -> bool:
        """`_at_frontier`, with a fast answer for the common case: every journal entry already reached.

        `ctx.report_progress` asks this on every report (a replay does not report again what
        the flow reported before), so a flow reporting in a tight loop must not pay for a
        walk of the journal each time once it is past everything the journal holds.
        """
        journal = self.journal
        if (
            self._used_steps.issuperset(journal.steps)
            and self._used_answers.issuperset(journal.answers)
            and self._used_pending.issuperset(journal.pending)
        ):
            return True
        return self._at_frontier(branch)

    def _at_frontier(self, branch: Branch) -> bool:
        """Has this branch reached everything the journal holds for it — answers, steps and
        the asks the last round sent out — so that no earlier code ran past this point?

        Evidence that old code ran past this point is what the branch itself recorded, what
        the branches it started *after* this point recorded, and what its ancestors recorded
        (they may have waited for it). Branches it started before this point run alongside
        it, and so do its siblings: what they recorded says nothing about this point.
        """
        journal = self.journal
        entries = [_step_path(k) for k in journal.steps if k not in self._used_steps]
        entries += [journal.origins.get(k) or _ask_path(k) for k in journal.answers if k not in self._used_answers]
        entries += [journal.origins.get(k) or _ask_path(k) for k in journal.pending if k not in self._used_pending]
        here = branch.path
        below = here + "." if here else ""
        started = branch.children
        for path in entries:
            if path == here or (here and (not path or here.startswith(path + "."))):
                return False  # the branch's own, or an ancestor's
            if path.startswith(below) and int(path[len(below) :].partition(".")[0]) >= started:
                return False  # a branch it starts later
        return True

    def unconsumed(self) -> list[str]:
        """Journal entries this run never reached (a replay test reports them as divergence)."""
        answers = [f"answer {k!r}" for k in self.journal.answers if k not in self._used_answers]
        steps = [f"step {k!r}" for k in self.journal.steps if k not in self._used_steps]
        return steps + answers

    # -- size ---------------------------------------------------------------------------

    def _note(self, key: str, ask: Ask, *, answered: bool) -> None:
        """Keep what `ask` asked beside its key (see `mrtr._engine.questions`): first asked, then answered."""
        notes = self.journal.questions
        note = notes.get(key)
        now = round(time.time(), 3)
        if note is None or note.get("d") != ask.digest:
            note = notes[key] = question_of(ask) | {"d": ask.digest, "a": now}
        if answered and "r" not in note:
            note["r"] = now

    def _admit(self, table: dict[str, tuple[str, Any]], key: str, entry: tuple[str, Any]) -> bool:
        """Journal `entry` unless the journal would outgrow its budget (then leave it out)."""
        table[key] = entry
        if self.budget is None:
            return True
        if self._size is None:
            self._size = self.journal.size()
        else:
            self._size += entry_size(key, *entry)
        # Plain JSON is an upper bound; only near the budget does the encoded form decide.
        if self._size <= self.budget or embedded_length(journal_codec.encode(self.journal)) <= self.budget:
            return True
        del table[key]
        self._size = None
        return False

    # -- settling -----------------------------------------------------------------------

    async def _watch(self) -> None:
        quiet = 0
        mark = -1
        while not self.flow_ended:
            if self._running_steps:
                quiet = 0
                assert self._steps_idle is not None
                await self._steps_idle.wait()
                continue
            busy = quiescence.classify(self.tasks, self._parked_tasks)
            if busy is quiescence.Busy.UNKNOWN:  # no insight into this loop: watch for activity
                active: Literal[quiescence.Busy.RUNNABLE] | None = (
                    quiescence.Busy.RUNNABLE if self._activity != mark else None
                )
                busy = active  # typed so: UNKNOWN is settled here, and what is left below is a future
                mark = self._activity
            if busy is quiescence.Busy.RUNNABLE:
                quiet = 0
                await asyncio.sleep(0)
            elif busy is not None:
                quiet = 0
                await asyncio.wait({busy})
            else:
                quiet += 1
                if quiet >= _CONFIRM_PASSES:
                    if self._wakers and self._wake_waits():
                        quiet = 0
                        self._activity += 1
                        await asyncio.sleep(0)
                        continue
                    self._suspend()
                    return
                await asyncio.sleep(0)

    def _suspend(self) -> None:
        self.settled = True
        self.suspended = True
        for task in self.tasks:
            task.cancel()

    root_task: asyncio.Task[Any]
    """The task the flow function itself runs in (the request's: see `mrtr._engine.run._run`)."""

    def alone(self) -> bool:
        """The flow started no task and no watcher: closing the run only marks it suspended.

        Most rounds run one branch; they skip awaiting `close` (a coroutine per round).
        """
        return self._watcher is None and len(self.tasks) == 1

    async def close(self) -> None:
        """Cancel and await everything the flow started: nothing of it runs after the round."""
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        self.suspended = True
        root = self.root_task
        for _ in range(_TEARDOWN_TRIES):
            alive = [t for t in self.tasks if not t.done() and t is not root]
            if not alive:
                break
            for task in alive:
                task.cancel()
            await asyncio.wait(alive, timeout=0.02)
        else:
            logger.error("flow %s: a task of the flow ignored cancellation and is still running", self.flow)
        for task in self.tasks:  # consume their outcomes: nobody else will
            if task is not root and task.done() and not task.cancelled():
                task.exception()

    def release(self) -> None:
        """Forget the run's tasks once their outcome is read.

        A task's context holds its branch, which holds the run: without this, every round
        would leave a reference cycle (run, tasks, contexts, coroutines) for the cyclic
        garbage collector, whose passes then cost more than the round itself.
        """
        for branch in self._branches:
            branch.task = None
        self._branches.clear()
        self.tasks.clear()
        self._parked_tasks.clear()
        self._wakers.clear()
        self._watcher = None
        self.ending = None  # an exception's traceback holds frames that hold this run
        del self.root_task, self.root


__all__ = [
    "Replay",
    "check_step_name",
    "step_key",
]
