"""Metrics for flows and tasks, beside the spans of `mrtr._telemetry.tracing`.

Recorded through `opentelemetry-api` only, on the meter named `mrtr`: nothing is recorded
(and a round pays one attribute lookup) until an application configures a `MeterProvider`,
globally (`opentelemetry.metrics.set_meter_provider`, or `OTEL_PYTHON_METER_PROVIDER`) or
for mrtr alone (`use_meter_provider`). The instruments (attribute names as on the spans):

Instrument (kind, unit): attributes. What it counts.

- `mrtr.rounds` (counter, `{round}`): `mrtr.flow`, `mrtr.outcome`, `mrtr.task`, `error.type`.
  Runs of a flow against its journal: an MRTR round, or one run of a durable task.
- `mrtr.round.duration` (histogram, `s`): `mrtr.flow`, `mrtr.outcome`, `mrtr.task`.
  How long each of those runs took.
- `mrtr.state.size` (histogram, `By`): `mrtr.flow`.
  The sealed `requestState` of each round that ends `input_required`.
- `mrtr.steps` (counter, `{step}`): `mrtr.flow`, `mrtr.step.replayed`.
  Steps reached: run (`false`) or returned from the journal (`true`).
- `mrtr.shed` (counter, `{round}`): `mrtr.flow`, `mrtr.reason`.
  Rounds shed to protect an overloaded instance (`mrtr.reason`: `overloaded`).
- `mrtr.replay_refused` (counter, `{round}`): `mrtr.flow`, `mrtr.reason`.
  Replayed `requestState`s the replay guard refused (`mrtr.reason`: `request_state_forked`,
  `request_state_consumed`, `request_state_in_flight`).
- `mrtr.task.transitions` (counter, `{transition}`): `mrtr.flow`, `mrtr.task.status`.
  Durable tasks entering a status (the one they enter).
- `mrtr.tasks` (gauge, `{task}`): `mrtr.task.status`.
  Tasks in the store, by status.
- `mrtr.listen.streams` (up-down counter, `{stream}`): no attributes.
  `subscriptions/listen` streams this process serves now.
- `mrtr.bus.dropped` (counter, `{event}`): `mrtr.reason`.
  Events a fleet bus dropped from its outbox before the broker had them (`mrtr.reason`:
  `broker_unreachable`, the last send failed; `publisher_behind`, the broker answers but the
  outbox outgrew its bound in count or age). Listeners elsewhere are told to refetch.
- `mrtr.bus.lag` (histogram, `s`): no attributes.
  From `publish` on another instance to delivery to this instance's listeners, by the two
  hosts' wall clocks (on one host exact; across hosts their skew is in it).
- `mrtr.bus.gaps` (counter, `{gap}`): `mrtr.reason`.
  Times a fleet bus told this instance's listeners that events may be missing (`mrtr.reason`:
  `resubscribed`, it reconnected to the broker; `dropped`, a sender's loss notice arrived;
  `lost`, a sender's sequence numbers skipped without a notice).
- `mrtr.store.errors` (counter, `{call}`): `mrtr.store`, `error.type`.
  Calls to the task store (or replay guard's ledger) that failed because the store did not
  answer (`mrtr.store`: `redis`, `postgresql`, `sqlite`; `error.type`: the driver's exception,
  e.g. `ConnectionError`, `PoolTimeout`, `OperationalError`). Each became a retryable
  `StoreUnavailable` error; a burst of them is logged as one line with its count.

Details:

- `mrtr.outcome`: `completed`, `input_required` (asks parked for the client; the spans say
  `parked`), `waiting` (a durable task parked on timers or events only), `suspended` (a run
  cut at its step limit, as on Temporal), `became_task`, `shed`, `cancelled`, or `error`
  (then `error.type` names the exception). `mrtr.task` is true for a durable task's run.
- `mrtr.round.duration` is the flow's run (journal replay and new work), not the transport
  or the boundary's sealing; `mrtr.state.size` is the sealed size as the state cap
  estimates it (`mrtr._engine.sealing.sealed_size`): an upper estimate, over the real token
  by at most what a principal claim and the longest timestamps add (~70 bytes by default).
- `mrtr.steps` counts every `ctx.step` a run reaches once: a replayed step in each round
  that replays it, a new one when it starts (also when it then fails).
- `mrtr.task.transitions` is counted by the instance that commits the change (mrtr's own
  task runtime; the Temporal engine reports creation only, its workflow runs elsewhere).
- `mrtr.tasks` is a per-process cache: each task runtime's scanner refreshes it from its
  store (`TaskStore.count_by_status`, if the store has it) at most every
  `TASK_COUNT_INTERVAL` seconds while a `MeterProvider` is configured; every instance of a
  fleet reports the same store-wide numbers, so aggregate them with `max`, not `sum`.
- `mrtr.listen.streams` is this process's open streams (all `ListenHandler`s).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, NoOpMeterProvider, Observation

from mrtr._errors import StoreUnavailable

logger = logging.getLogger("mrtr.metrics")

METER_NAME = "mrtr"
"""The OpenTelemetry meter mrtr's instruments are created on (select or drop them by it)."""

TASK_COUNT_INTERVAL = 10.0
"""Seconds between two refreshes of the `mrtr.tasks` gauge's counts by one scanner."""

_STALE_COUNTS = 120.0  # seconds after which a store's counts (its runtime stopped) are no longer reported

_DURATION_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
_SIZE_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)


class Instruments:
    """Every mrtr instrument, made once from one meter (see the module docstring).

    The two counters every round adds to (`mrtr.rounds`, `mrtr.steps`) are kept here as
    plain totals and observed at collection: an SDK counter's `add` costs a round several
    microseconds, a dict update a fraction of one. The rest are the SDK's own instruments.
    """

    def __init__(self, meter: Meter) -> None:
        self.round_totals: dict[tuple[str, str, bool, str | None], int] = {}
        """(flow, outcome, task, error type) -> runs, since this provider was taken up."""
        self.step_totals: dict[tuple[str, bool], int] = {}
        """(flow, replayed) -> steps."""
        meter.create_observable_counter(
            "mrtr.rounds", [self._observe_rounds], "{round}", "Runs of a flow against its journal"
        )
        self.round_duration = meter.create_histogram(
            "mrtr.round.duration",
            "s",
            "Duration of a flow's run against its journal",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.state_size = meter.create_histogram(
            "mrtr.state.size",
            "By",
            "Sealed requestState of a round ending input_required",
            explicit_bucket_boundaries_advisory=_SIZE_BUCKETS,
        )
        meter.create_observable_counter(
            "mrtr.steps", [self._observe_steps], "{step}", "Steps reached: run, or replayed from the journal"
        )
        self.shed = meter.create_counter("mrtr.shed", "{round}", "Rounds shed to protect an overloaded instance")
        self.replay_refused = meter.create_counter(
            "mrtr.replay_refused", "{round}", "Replayed requestStates refused by the replay guard"
        )
        self.task_transitions = meter.create_counter(
            "mrtr.task.transitions", "{transition}", "Durable tasks entering a status"
        )
        meter.create_observable_gauge("mrtr.tasks", [_observe_tasks], "{task}", "Tasks in the store, by status")
        meter.create_observable_up_down_counter(
            "mrtr.listen.streams", [_observe_listens], "{stream}", "subscriptions/listen streams open"
        )
        self.bus_dropped = meter.create_counter(
            "mrtr.bus.dropped", "{event}", "Events a fleet bus dropped before the broker had them"
        )
        self.bus_lag = meter.create_histogram(
            "mrtr.bus.lag",
            "s",
            "From publish on another instance to delivery here",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.bus_gaps = meter.create_counter(
            "mrtr.bus.gaps", "{gap}", "Times a fleet bus told its listeners that events may be missing"
        )
        self.store_errors = meter.create_counter(
            "mrtr.store.errors", "{call}", "Task store calls that failed because the store did not answer"
        )

    def round_ran(self, flow: str, replay: Any, task: bool, seconds: float, replayed: int, ran: int) -> None:
        """One run of `flow` ended (`replay`: its `mrtr._engine.replay.Replay`, read for the outcome)."""
        outcome, error = round_outcome(replay)
        self.round_duration.record(seconds, {"mrtr.flow": flow, "mrtr.outcome": outcome, "mrtr.task": task})
        rounds, steps = self.round_totals, self.step_totals
        key = (flow, outcome, task, error)
        rounds[key] = rounds.get(key, 0) + 1
        if replayed:
            steps[flow, True] = steps.get((flow, True), 0) + replayed
        if ran:
            steps[flow, False] = steps.get((flow, False), 0) + ran

    def _observe_rounds(self, options: CallbackOptions) -> Iterable[Observation]:
        # list(): a snapshot taken at once (collection may run in the exporter's thread)
        observed = []
        for (flow, outcome, task, error), n in list(self.round_totals.items()):
            attributes: dict[str, Any] = {"mrtr.flow": flow, "mrtr.outcome": outcome, "mrtr.task": task}
            if error is not None:
                attributes["error.type"] = error
            observed.append(Observation(n, attributes))
        return observed

    def _observe_steps(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {"mrtr.flow": flow, "mrtr.step.replayed": replayed})
            for (flow, replayed), n in list(self.step_totals.items())
        ]


def round_outcome(replay: Any) -> tuple[str, str | None]:
    """`mrtr.outcome` of a finished run, and `error.type` for an error (duck-typed: the engine's
    `BecomeTask` and the shedder's `ShedRound` are told apart by name, as in the spans)."""
    if replay.settled:
        if replay.parked:
            return "input_required", None
        return ("waiting" if replay.waits else "suspended"), None
    ending = replay.ending
    if not isinstance(ending, BaseException):
        return "completed", None
    name = type(ending).__name__
    if name == "CancelledError":
        return "cancelled", None
    if name == "BecomeTask":
        return "became_task", None
    if name == "ShedRound":
        return "shed", None
    return "error", name


# -- the meter provider --------------------------------------------------------------------

_injected: MeterProvider | None = None
_source: MeterProvider | None = None
_current: Instruments | None = None
_api: Any = getattr(otel_metrics, "_internal", None)
_HAS_GLOBAL = _api is not None and hasattr(_api, "_METER_PROVIDER")


def use_meter_provider(provider: MeterProvider | None) -> None:
    """Record mrtr's metrics through `provider` instead of OpenTelemetry's global one.

    For an application that keeps mrtr's metrics apart, and for tests: OpenTelemetry's
    global provider can be set once per process. `None` goes back to the global provider.
    """
    global _injected, _source, _current
    _injected = provider
    _source = _current = None


def instruments() -> Instruments | None:
    """mrtr's instruments, or None while no `MeterProvider` is configured (nothing would record).

    The hot path of every round: one global read when nothing is configured. The instruments
    are made once per provider, when it is first seen.
    """
    provider = _injected
    if provider is None:
        provider = _api._METER_PROVIDER if _HAS_GLOBAL else _global_provider()
        if provider is None:
            if _ENV_PROVIDER is None:
                return None
            provider = _global_provider()  # named by the environment: the API loads it on first use
            if provider is None:
                return None
    if provider is not _source:
        return _switch(provider)
    return _current


_ENV_PROVIDER = os.environ.get("OTEL_PYTHON_METER_PROVIDER")


def _global_provider() -> MeterProvider | None:
    global _ENV_PROVIDER
    try:
        provider = otel_metrics.get_meter_provider()
    except Exception:  # OTEL_PYTHON_METER_PROVIDER names nothing loadable: said once, then ignored
        logger.exception("OTEL_PYTHON_METER_PROVIDER=%r could not be loaded; mrtr records no metrics", _ENV_PROVIDER)
        _ENV_PROVIDER = None
        return None
    if type(provider).__name__ == "_ProxyMeterProvider":
        return None
    return provider


def _switch(provider: MeterProvider) -> Instruments | None:
    global _source, _current
    _source = provider
    _current = None if isinstance(provider, NoOpMeterProvider) else Instruments(provider.get_meter(METER_NAME))
    return _current


def enabled() -> bool:
    """Whether a `MeterProvider` records mrtr's metrics (callers skip measuring work otherwise)."""
    return instruments() is not None


# -- events recorded outside a round -------------------------------------------------------


def shed(flow: str, reason: str) -> None:
    if (found := instruments()) is not None:
        found.shed.add(1, {"mrtr.flow": flow, "mrtr.reason": reason})


def replay_refused(flow: str, reason: str) -> None:
    if (found := instruments()) is not None:
        found.replay_refused.add(1, {"mrtr.flow": flow, "mrtr.reason": reason})


def task_status(flow: str, status: str) -> None:
    if (found := instruments()) is not None:
        found.task_transitions.add(1, {"mrtr.flow": flow, "mrtr.task.status": status})


def state_size(flow: str, size: int) -> None:
    if (found := instruments()) is not None:
        found.state_size.record(size, {"mrtr.flow": flow})


def bus_dropped(reason: str, count: int = 1) -> None:
    if (found := instruments()) is not None:
        found.bus_dropped.add(count, {"mrtr.reason": reason})


def bus_lag(seconds: float) -> None:
    if (found := instruments()) is not None:
        found.bus_lag.record(seconds)


def bus_gap(reason: str) -> None:
    if (found := instruments()) is not None:
        found.bus_gaps.add(1, {"mrtr.reason": reason})


def store_error(store: str, error_type: str) -> None:
    if (found := instruments()) is not None:
        found.store_errors.add(1, {"mrtr.store": store, "error.type": error_type})


# -- observed: tasks by status, listen streams ---------------------------------------------

_task_counts: weakref.WeakKeyDictionary[Any, tuple[float, dict[str, int]]] = weakref.WeakKeyDictionary()
_count_attempts: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
_listeners: weakref.WeakSet[Any] = weakref.WeakSet()


async def refresh_task_counts(store: object, now: float, *, force: bool = False) -> None:
    """Re-read the store's task counts for the `mrtr.tasks` gauge (called by a task runtime's scanner).

    Skipped while no `MeterProvider` is configured, for stores without `count_by_status`
    (or that cannot be weakly referenced), and within `TASK_COUNT_INTERVAL` of the last
    attempt (unless `force`). A failed count is logged; the scan it rides on goes on.
    """
    count = getattr(store, "count_by_status", None)
    if count is None or instruments() is None:
        return
    started = time.monotonic()
    try:
        if not force and started - _count_attempts.get(store, -TASK_COUNT_INTERVAL) < TASK_COUNT_INTERVAL:
            return
        _count_attempts[store] = started
    except TypeError:  # not hashable or not weakly referenceable: not counted
        return
    try:
        counts: Mapping[str, int] = await count(now)
    except StoreUnavailable:  # logged once per burst by the store (`mrtr.store`)
        return
    except Exception:  # the gauge goes stale, then silent (`_STALE_COUNTS`)
        logger.warning("counting tasks by status for the mrtr.tasks gauge failed", exc_info=True)
        return
    _task_counts[store] = (started, {str(status): int(n) for status, n in counts.items()})


def _observe_tasks(options: CallbackOptions) -> Iterable[Observation]:
    """Counts by status, summed over the distinct stores this process's runtimes watch."""
    horizon = time.monotonic() - _STALE_COUNTS
    totals: dict[str, int] = {}
    for refreshed, counts in list(_task_counts.values()):
        if refreshed >= horizon:
            for status, n in counts.items():
                totals[status] = totals.get(status, 0) + n
    return [Observation(n, {"mrtr.task.status": status}) for status, n in sorted(totals.items())]


def watch_listens(handler: Any) -> None:
    """Count `handler`'s open streams (its `open_streams` property) in `mrtr.listen.streams`."""
    _listeners.add(handler)


def _observe_listens(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(sum(handler.open_streams for handler in list(_listeners)))]


__all__ = [
    "METER_NAME",
    "TASK_COUNT_INTERVAL",
    "Instruments",
    "bus_dropped",
    "bus_gap",
    "bus_lag",
    "enabled",
    "instruments",
    "refresh_task_counts",
    "replay_refused",
    "round_outcome",
    "shed",
    "state_size",
    "store_error",
    "task_status",
    "use_meter_provider",
    "watch_listens",
]
