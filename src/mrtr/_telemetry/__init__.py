"""Telemetry (private; see `mrtr.metrics` and `mrtr.tracing`): the metrics and spans of rounds, steps,
tasks, buses and stores, below everything that records them.

- `metrics`: mrtr's instruments on the `mrtr` meter, recorded once a `MeterProvider` is configured;
- `tracing`: the tracer, the step span, events, and the `flow_id` / `task_id` log context.

It knows no engine, host, task runtime, store or bus: whoever records passes plain values (a
flow's name, a reason, a count). The engine's round span, which reads a round and its journal,
is the engine's own (`mrtr._engine.spans`).
"""

__all__: list[str] = []
