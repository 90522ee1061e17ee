"""The console as a Starlette app: pages, live updates, and operator actions through `TaskAdmin`.

Security, in the order a request meets it: with a `token`, every request must carry it (an
`Authorization: Bearer` header, or the cookie the login form sets: a digest of the token,
HttpOnly, SameSite=Strict); every POST must come from the console's own pages (`Sec-Fetch-Site`
not `cross-site`, an `Origin` naming this host if present, and the page's CSRF field).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, TypedDict
from urllib.parse import parse_qs, urlencode, urlsplit

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import Journal, JournalFormatError, QuestionNote
from mrtr._errors import EventNotDelivered
from mrtr._wire import Wait
from mrtr.buses import BrokerBus, open_bus
from mrtr.buses._events import BusGap, TaskChanged
from mrtr.console._templates import TEMPLATES
from mrtr.stores import RecordSeal, TaskQuery, TaskRecord, TaskStore, open_store
from mrtr.stores._abilities import WrappedStore
from mrtr.stores._base import STATUSES, WAITS
from mrtr.tasks._admin import TaskAdmin, TaskUnknown, failed
from mrtr.tasks._history import history_rows, iso

COOKIE = "mrtr_console"
_MISSING = "<!doctype html><title>No such task</title><p>No such task (unknown, or past its TTL).</p>"
PAGE = 50
_SHORT = 300
_LONG = 8000
SEALED_TEXT = "sealed"
_NO_KEY = "sealed at rest: start the console with the fleet's key ring (MRTR_STATE_KEY or --key-file) to see it"


def app(
    store: TaskStore | str,
    bus: BrokerBus | str | None = None,
    token: str | None = None,
    *,
    redact: bool = False,
    namespace: str | None = None,
    seal: RecordSeal | None = None,
) -> Starlette:
    """The console for `store` (a `TaskStore`, or an `open_store` URL with `namespace`).

    Args:
        bus: The fleet bus (a `BrokerBus` or an `open_bus` URL): pages update the moment a task
            changes anywhere in the fleet. None: pages poll the store every second.
        token: Require this token on every request (bearer header or login cookie). None: no
            login, for a loopback bind or behind your own auth.
        redact: Show answers and step results as `[redacted]` (their keys stay visible).
        seal: The fleet's key ring (`RecordSeal.from_keys`), to open records sealed at rest.
            Without it, a sealed record shows its metadata and "sealed" where its payload would be.
    """
    tasks_store = open_store(store, namespace=namespace) if isinstance(store, str) else store
    fleet_bus = open_bus(bus, namespace=namespace) if isinstance(bus, str) else bus
    console = _Console(TaskAdmin(tasks_store, seal=seal, bus=fleet_bus), fleet_bus, token, redact)
    routes = [
        Route("/", console.tasks),
        Route("/fragment", console.fragment),
        Route("/events", console.events),
        Route("/login", console.login, methods=["GET", "POST"]),
        Route("/purge", console.purge, methods=["POST"]),
        Route("/bulk", console.bulk, methods=["GET", "POST"]),
        Route("/tasks/{task_id}", console.task),
        Route("/tasks/{task_id}/version", console.version),
        Route("/tasks/{task_id}/{action}", console.act, methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        if fleet_bus is not None:
            await fleet_bus.close()
        await tasks_store.close()

    web = Starlette(routes=routes, lifespan=lifespan)
    web.add_middleware(_Guard, console=console)
    return web


class JournalInfo(TypedDict, total=False):
    """A task page's journal summary (empty when the journal is sealed or unreadable)."""

    started: str
    rounds: int
    asks: list[dict[str, str]]
    """Each ask, answered or outstanding: question, answer, when, who may answer (`_ask`)."""


class _Console:
    def __init__(self, admin: TaskAdmin, bus: BrokerBus | None, token: str | None, redact: bool) -> None:
        self.admin = admin
        self.bus = bus
        self.token = token
        self.redact = redact
        self.cookie = None if token is None else hashlib.sha256(b"mrtr-console\0" + token.encode()).hexdigest()
        self.csrf = secrets.token_urlsafe(24)
        self.label = type(admin.store.inner if isinstance(admin.store, WrappedStore) else admin.store).__name__

    # -- pages -------------------------------------------------------------------------------

    async def tasks(self, request: Request) -> Response:
        query, shown = self._query(request)
        problem = shown.pop("problem", None)
        page = await self.admin.list_tasks(query)
        counts, flows = await asyncio.gather(self.admin.counts(), self.admin.flows())
        now = time.time()
        next_query = urlencode({k: v for k, v in shown.items() if v} | {"cursor": page.next_cursor or ""})
        return self._render(
            request,
            "tasks.html",
            rows=[_row(r, now) for r in page.records],
            counts=counts,
            flows=flows,
            statuses=STATUSES,
            current_status=shown["status"],
            tool=shown["tool"],
            q=shown["q"],
            waits=WAITS,
            waiting=shown["waiting"],
            older=shown["older"],
            filter_query=urlencode({k: v for k, v in shown.items() if v}),
            problem=problem,
            cursor=page.next_cursor,
            next_query=next_query,
            fragment_query=urlencode(shown | {"cursor": request.query_params.get("cursor", "")}),
            live=self.bus is not None,
            purged=request.query_params.get("purged"),
        )

    async def fragment(self, request: Request) -> Response:
        query, _ = self._query(request)
        page, counts = await asyncio.gather(self.admin.list_tasks(query), self.admin.counts())
        now = time.time()
        root = request.scope.get("root_path", "")
        rows = TEMPLATES.get_template("rows.html").render(rows=[_row(r, now) for r in page.records], root=root)
        badges = "".join(
            f'<span class="s s-{s}">{s} {n}</span>' for s, n in counts.items()
        )  # statuses and numbers only: nothing to escape
        return JSONResponse({"rows": rows, "counts": badges})

    async def events(self, request: Request) -> Response:
        """Server-sent events: one message per task change heard on the fleet bus (`"*"`: events were lost)."""
        if self.bus is None:
            return JSONResponse({"error": "no fleet bus: this console polls"}, status_code=404)
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=100)

        def heard(event: Any) -> None:
            # A gap (events were lost on their way here) is a change too: the page refetches.
            if isinstance(event, TaskChanged | BusGap) and not queue.full():
                queue.put_nowait(event.task_id if isinstance(event, TaskChanged) else "*")

        unsubscribe = self.bus.subscribe(heard)

        async def stream() -> AsyncIterator[str]:
            try:
                yield "retry: 2000\n\n"
                while not await request.is_disconnected():
                    try:
                        task_id = await asyncio.wait_for(queue.get(), 15)
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    yield f"data: {json.dumps(task_id)}\n\n"
            finally:
                unsubscribe()

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def task(self, request: Request) -> Response:
        record = await self.admin.get(request.path_params["task_id"])
        if record is None:
            return HTMLResponse(_MISSING, status_code=404)
        now = time.time()
        timeline, journal_info, problem = self._timeline(record)
        asks = journal_info.get("asks", [])
        return self._render(
            request,
            "task.html",
            t=record,
            created=_ago(record.created_at, now),
            updated=_ago(record.updated_at, now),
            arguments=SEALED_TEXT if record.sealed else _pretty(record.arguments, 20000),
            waits=[_wait_text(w) for w in record.waiting],
            inputs=[
                {
                    "key": key,
                    "method": req.get("method", ""),
                    "message": (req.get("params") or {}).get("message", ""),
                }
                for key, req in record.input_requests.items()
            ]
            if not record.terminal
            else [],
            asks=asks,
            timeline=timeline,
            timeline_error=problem,
            started=journal_info.get("started", "-"),
            rounds=journal_info.get("rounds", 0),
            history=history_rows(record.history, record.status == "working"),
            result=_pretty(record.result, 20000) if not self.redact else "[redacted]",
            error=_pretty(record.error, 20000),
            failed=failed(record),
            notice=request.query_params.get("notice"),
        )

    async def version(self, request: Request) -> Response:
        record = await self.admin.get(request.path_params["task_id"])
        return JSONResponse({"version": None if record is None else record.version})

    # -- actions (POST, checked by `_Guard`) ----------------------------------------------------

    async def act(self, request: Request) -> Response:
        task_id, action = request.path_params["task_id"], request.path_params["action"]
        form = await request.form()
        try:
            if action == "cancel":
                changed, running = await self.admin.cancel(task_id)
                notice = "cancel requested: its worker stops it" if running else f"task {changed.status}"
            elif action == "rerun":
                changed = await self.admin.rerun(task_id)
                notice = f"attempt {changed.attempt} queued: the next scan of the fleet replays it"
            elif action == "fork":
                changed = await self.admin.rerun(task_id, from_step=str(form.get("step", "")), by="the console")
                step = changed.history[-1].get("step")
                notice = f"forked from step {step!r}: attempt {changed.attempt} queued for the fleet's next scan"
            elif action == "event":
                name, data = str(form.get("name", "")), str(form.get("data", "null") or "null")
                try:
                    payload = json.loads(data)
                except ValueError:
                    raise ValueError("the payload must be JSON") from None
                delivered = await self.admin.send_event(task_id, name, payload)
                notice = f"event {name!r} delivered" if delivered else f"event {name!r} was delivered before"
            else:
                return JSONResponse({"error": f"unknown action {action!r}"}, status_code=404)
        except TaskUnknown as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        except (ValueError, RuntimeError, EventNotDelivered) as exc:
            notice = f"not done: {exc}"
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/tasks/{task_id}?{urlencode({'notice': notice})}", status_code=303)

    async def bulk(self, request: Request) -> Response:
        """A bulk action on the tasks a filter matches: GET shows the count and the tasks and asks
        to confirm; the confirmation POSTs (CSRF-checked by `_Guard`) exactly the ids it showed,
        and the answer says what each task became."""
        if request.method == "GET":
            action = request.query_params.get("action", "")
            if action not in BULK_ACTIONS:
                return JSONResponse({"error": f"unknown bulk action {action!r}"}, status_code=404)
            query, shown = self._query(request)
            if shown.get("problem"):
                return JSONResponse({"error": shown["problem"]}, status_code=400)
            query = replace(query, cursor=None)  # every task the filter matches, from the newest
            matched = await self.admin.matching(query, limit=BULK_MAX + 1, action=action)  # type: ignore[arg-type]
            chosen = matched[:BULK_MAX]
            now = time.time()
            return self._render(
                request,
                "bulk.html",
                action=action,
                verb=BULK_ACTIONS[action],
                rows=[_row(r, now) for r in chosen[:_LISTED]],
                count=len(chosen),
                ids=" ".join(r.task_id for r in chosen),
                capped=len(matched) > BULK_MAX,
                bulk_max=BULK_MAX,
                shown=shown,
                back=urlencode({k: v for k, v in shown.items() if v and k != "problem"}),
                outcomes=None,
            )
        form = await request.form()
        action = str(form.get("action", ""))
        if action not in BULK_ACTIONS:
            return JSONResponse({"error": f"unknown bulk action {action!r}"}, status_code=404)
        ids = str(form.get("ids", "")).split()[:BULK_MAX]  # exactly the tasks the confirmation listed
        outcomes = await self.admin.bulk(action, ids)  # type: ignore[arg-type]
        return self._render(
            request,
            "bulk.html",
            action=action,
            verb=BULK_ACTIONS[action],
            rows=[],
            count=0,
            ids="",
            capped=False,
            bulk_max=BULK_MAX,
            shown={},
            back=str(form.get("back", "")),
            outcomes=outcomes,
            done=sum(o.outcome == "done" for o in outcomes),
        )

    async def purge(self, request: Request) -> Response:
        purged = await self.admin.purge_expired()
        return RedirectResponse(f"{request.scope.get('root_path', '')}/?purged={purged}", status_code=303)

    async def login(self, request: Request) -> Response:
        root = request.scope.get("root_path", "")
        if request.method == "GET" or self.token is None:
            return self._render(request, "login.html", failed=False)
        form = await request.form()
        given = str(form.get("token", ""))
        if not hmac.compare_digest(given.encode(), (self.token or "").encode()):
            return self._render(request, "login.html", failed=True, status=401)
        response = RedirectResponse(f"{root}/", status_code=303)
        assert self.cookie is not None
        response.set_cookie(COOKIE, self.cookie, httponly=True, samesite="strict", path="/")
        return response

    # -- helpers --------------------------------------------------------------------------------

    def _query(self, request: Request) -> tuple[TaskQuery, dict[str, str]]:
        params = request.query_params
        status = params.get("status", "")
        tool = params.get("tool", "")
        q = params.get("q", "").strip()
        waiting = params.get("waiting", "")
        older = params.get("older", "").strip()
        shown = {"status": status, "tool": tool, "q": q, "waiting": waiting, "older": older}
        age = _age(older)
        if age is None and older:
            shown["problem"] = f"older than takes a duration like 90s, 10m, 2h or 1d, not {older!r}"
        query = TaskQuery(
            statuses=(status,) if status in STATUSES else (),
            flow=tool or None,
            id_prefix=q or None,
            limit=PAGE,
            cursor=params.get("cursor") or None,
            waiting=waiting if waiting in WAITS else None,
            created_before=None if age is None else time.time() - age,
        )
        return query, shown

    def _timeline(self, record: TaskRecord) -> tuple[list[dict[str, str]], JournalInfo, str | None]:
        if record.sealed:
            return [], {}, _NO_KEY
        try:
            journal = journal_codec.decode(record.journal)
        except JournalFormatError as exc:
            return [], {}, f"the journal cannot be read: {exc}"
        entries: list[dict[str, str]] = []
        for key, (_, value) in journal.steps.items():
            name = key.rpartition("/")[2]
            if name.startswith("@sleep"):
                kind = "timer"
            elif name.startswith("@event."):
                kind = "event"
            elif name.startswith("@callback."):
                kind = "callback URL"
            else:
                kind = "step"
            shown = "[redacted]" if self.redact and kind in ("step", "event") else _pretty(value, _LONG)
            entries.append({"kind": kind, "key": key, "value": shown})
        asks: list[dict[str, str]] = []
        for key, (_, answer) in journal.answers.items():
            asks.append(self._ask(journal, key, record, "[redacted]" if self.redact else _pretty(answer, _LONG)))
        if not record.terminal:  # a finished task waits for nothing: its last round's asks are history
            for key in journal.pending:
                if key not in journal.answers:
                    asks.append(self._ask(journal, key, record, ""))
        info: JournalInfo = {"started": iso(journal.started_at), "rounds": journal.rounds, "asks": asks}
        return entries, info, None

    def _ask(self, journal: Journal, key: str, record: TaskRecord, answer: str) -> dict[str, str]:
        """One ask for the task page: question (and form title), answer, when, and who may answer it."""
        note: QuestionNote = journal.questions.get(key) or {}
        asked, replied = note.get("a"), note.get("r")
        question = note.get("q")
        return {
            "key": key,
            "title": str(note.get("t") or ""),
            "question": str(question) if question is not None else "",
            "recorded": "yes" if question is not None else "",
            "answer": answer,
            "outstanding": "" if key in journal.answers else "yes",
            "asked": iso(asked) if isinstance(asked, int | float) else "",
            "when": iso(replied) if isinstance(replied, int | float) and key in journal.answers else "",
            "by": record.owner or "anyone (no auth)",
        }

    def _render(self, request: Request, template: str, *, status: int = 200, **values: Any) -> Response:
        if template == "task_missing":
            return HTMLResponse(
                "<!doctype html><title>No such task</title><p>No such task (unknown, or past its TTL).</p>", 404
            )
        html = TEMPLATES.get_template(template).render(
            root=request.scope.get("root_path", ""), store_label=self.label, csrf=self.csrf, **values
        )
        return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


class _Guard:
    """ASGI middleware: the token (if any) on every request; same-site, CSRF-checked POSTs."""

    def __init__(self, app: Any, console: _Console) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        refusal = await self._refusal(request)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        body = getattr(request, "_body", None)  # a POST's body, read for its CSRF field: hand it on
        await self.app(scope, receive if body is None else _replay(body), send)

    async def _refusal(self, request: Request) -> Response | None:
        console = self.console
        path = request.url.path.removeprefix(request.scope.get("root_path", ""))
        if console.token is not None and path != "/login" and not self._authenticated(request):
            if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
                return RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)
            return JSONResponse({"error": "this console needs its token"}, status_code=401)
        if request.method != "POST":
            return None
        if request.headers.get("sec-fetch-site", "same-origin") == "cross-site":
            return JSONResponse({"error": "cross-site requests cannot change tasks"}, status_code=403)
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
            return JSONResponse({"error": "cross-origin requests cannot change tasks"}, status_code=403)
        if path != "/login":
            form = await _form_copy(request)
            if not hmac.compare_digest(str(form.get("csrf", "")).encode(), console.csrf.encode()):
                return JSONResponse(
                    {"error": "the form is stale or forged (CSRF check failed); reload"}, status_code=403
                )
        return None

    def _authenticated(self, request: Request) -> bool:
        console = self.console
        assert console.token is not None and console.cookie is not None
        header = request.headers.get("authorization", "")
        if header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), console.token.encode()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(), console.cookie.encode())


async def _form_copy(request: Request) -> dict[str, str]:
    """The form fields (the body stays on `request`, and `_Guard` hands it on to the route)."""
    body = await request.body()
    return {k: v[0] for k, v in parse_qs(body.decode("latin-1")).items()}


def _replay(body: bytes) -> Callable[[], Awaitable[Message]]:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


BULK_ACTIONS = {"cancel": "Cancel", "rerun": "Re-run", "purge": "Purge"}
"""The console's bulk actions (`TaskAdmin.bulk`) and their buttons' verbs."""
BULK_MAX = 1000
"""Tasks one bulk action takes at most (act again for more)."""
_LISTED = 100
"""Tasks a confirmation lists by row (it acts on all it counted: their ids are in its form)."""
_AGE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _age(text: str) -> float | None:
    """`90s`, `10m`, `2h`, `1d` (a bare number: seconds) as seconds; None if empty or not a duration."""
    match = _AGE.match(text)
    return None if match is None else float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _row(record: TaskRecord, now: float) -> dict[str, str]:
    if record.status == "input_required":
        waits = "answer: " + (SEALED_TEXT if record.sealed else ", ".join(record.input_requests))
    elif record.waiting:
        waits = "; ".join(_wait_text(w) for w in record.waiting)
    elif record.status == "completed" and record.result and record.result.get("isError"):
        waits = "ended with a tool error (re-runnable)"
    elif record.status == "failed" and record.error:
        waits = f"error {record.error.get('code')}: {record.error.get('message', '')}"[:120]
    else:
        waits = record.status_message or ""
    return {
        "task_id": record.task_id,
        "status": record.status,
        "flow": record.flow,
        "owner": (record.owner or "-")[:12],
        "created": _ago(record.created_at, now),
        "updated": _ago(record.updated_at, now),
        "waits": waits,
    }


def _wait_text(wait: Wait) -> str:
    until = wait.get("until")
    when = f" until {iso(until)}" if until is not None else ""
    if wait.get("kind") == "timer":
        return f"timer{when}"
    return f"event {wait.get('name')!r}" + (f" (timeout{when})" if when else "")


def _ago(ts: float, now: float) -> str:
    delta = max(0.0, now - ts)
    if delta < 90:
        return f"{delta:.0f}s ago"
    if delta < 5400:
        return f"{delta / 60:.0f}m ago"
    if delta < 129600:
        return f"{delta / 3600:.1f}h ago"
    return f"{delta / 86400:.1f}d ago"


def _pretty(value: Any, limit: int) -> str:
    """JSON for people: indented (the page wraps and folds it, see `_json.html`), cut at `limit`."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False, indent=2)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = [
    "COOKIE",
    "JournalInfo",
    "app",
]
