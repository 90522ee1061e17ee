"""`X-Mrtr-Instance`: which instance of a fleet answered (`Flows(instance_name=...)`).

Plain ASGI middleware, so it stamps every HTTP response of either host's app: `mrtr call`
shows the name per round, handy behind a load balancer.
"""

from __future__ import annotations

from typing import Any


class InstanceHeader:
    """ASGI middleware: `X-Mrtr-Instance: <name>` on every HTTP response."""

    def __init__(self, app: Any, name: str) -> None:
        self.app = app
        self.header = (b"x-mrtr-instance", name.encode("latin-1", "replace"))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        await self.app(scope, receive, stamped)


__all__ = ["InstanceHeader"]
