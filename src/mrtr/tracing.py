"""Traces and log context for flows (OpenTelemetry spans and `logging` attributes).

mrtr nests its spans under the SDK's request span through `opentelemetry-api` only:
`mrtr.round <flow>` (one run of a flow against its journal), `mrtr.step <name>` (a step
that really runs), and events for a replay refused, a round shed and a task's status
change. Configure an OpenTelemetry SDK to export them; without one they cost nothing.
Metrics, counted beside these spans, are described in `mrtr.metrics`.

Log records of mrtr's loggers (`mrtr.engine`, `mrtr.replay`, `mrtr.tasks.runtime`,
`mrtr.fleet`, ...) carry `flow_id` and `task_id`; add `LogContextFilter()` to a handler to
stamp them on every record, for a `%(flow_id)s` format shared with other libraries.
"""

from mrtr._telemetry.tracing import TRACER_NAME, LogContextFilter, current_ids, get_logger

__all__ = ["TRACER_NAME", "LogContextFilter", "current_ids", "get_logger"]
