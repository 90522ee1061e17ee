"""The operating guide's examples: mrtr's metrics in an in-memory reader, log records with flow ids.

Run by `tests/integration/test_docs_examples.py` (needs `opentelemetry-sdk`, in the `dev` extra).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets

os.environ.setdefault("MRTR_STATE_KEY", secrets.token_hex(32))

# isort: split
from quickstart import flows  # the landing page's deploy flow

from mrtr.testing import run_rounds


async def main() -> None:
    # --8<-- [start:metrics]
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    import mrtr.metrics

    reader = InMemoryMetricReader()
    mrtr.metrics.use_meter_provider(MeterProvider(metric_readers=[reader]))  # or set the global provider
    # --8<-- [end:metrics]

    # --8<-- [start:logs]
    import mrtr.tracing

    handler = logging.StreamHandler()
    handler.addFilter(mrtr.tracing.LogContextFilter())  # stamps flow_id / task_id on every record
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s flow=%(flow_id)s task=%(task_id)s %(message)s"))
    logging.getLogger("mrtr").addHandler(handler)
    logging.getLogger("mrtr").setLevel(logging.DEBUG)  # each step run or replayed, each round's end
    # --8<-- [end:logs]

    answers = {"where?": {"env": "staging"}, "Apply": {"yes": True}, "sampling/createMessage": "none"}
    await run_rounds(flows, "deploy", {"service": "api"}, answers=answers)
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"mrtr.rounds", "mrtr.steps"} <= names, names
    mrtr.metrics.use_meter_provider(None)


if __name__ == "__main__":
    asyncio.run(main())
