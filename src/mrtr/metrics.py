"""Metrics for flows and tasks (OpenTelemetry, through `opentelemetry-api` only).

mrtr records on the meter named `mrtr` (`METER_NAME`) once an application configures a
`MeterProvider` — globally with `opentelemetry.metrics.set_meter_provider`, or for mrtr
alone with `use_meter_provider` — and costs a round one attribute lookup until then. The
instruments, their units and attributes are listed in `mrtr._telemetry.metrics` and the
docs/guides/operating.md ("Metrics"): rounds by outcome (`mrtr.rounds`), round duration (`mrtr.round.duration`),
sealed state size (`mrtr.state.size`), steps run and replayed (`mrtr.steps`), shed rounds
(`mrtr.shed`), replay guard refusals (`mrtr.replay_refused`), task status transitions
(`mrtr.task.transitions`), tasks by status (`mrtr.tasks`), open listen streams
(`mrtr.listen.streams`), and a fleet bus's dropped events, gaps and lag (`mrtr.bus.dropped`,
`mrtr.bus.gaps`, by `mrtr.reason`; `mrtr.bus.lag`).
"""

from mrtr._telemetry.metrics import METER_NAME, TASK_COUNT_INTERVAL, use_meter_provider

__all__ = ["METER_NAME", "TASK_COUNT_INTERVAL", "use_meter_provider"]
