"""A web console for durable tasks: what is stuck, what each task waits for, and acting on it.

`mrtr console --store URL` serves it on 127.0.0.1:8765; `app(store)` is the same Starlette app,
to mount behind your own auth. It reads and writes only through the store's own API
(`TaskStore.list_tasks` and friends, `mrtr.tasks.TaskAdmin`), so it works on every store.
"""

from __future__ import annotations

from mrtr.console._app import app

__all__ = ["app"]
