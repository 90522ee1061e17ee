"""`mrtr inspect-state`: what a sealed `requestState` carries, for a developer holding the key.

Unsealing is the SDK's: `RequestStateSecurity(keys=...)` builds the same AES-GCM codec
the server's `RequestStateBoundary` seals with, and the envelope's claims (method,
target, audience, issue and expiry times) are shown as the boundary would check them.
The inner state is decoded with `mrtr._engine.journal.decode`. Debugging only: anyone with the
key can read every answer a user gave.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from mcp.server.request_state import InvalidRequestState, RequestStateSecurity
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mrtr._engine import journal as journal_codec
from mrtr._engine.journal import JournalFormatError
from mrtr._wire import JSONObject
from mrtr.cli._errors import EXIT_OK, UsageError
from mrtr.cli._taskadmin import ago, describe_journal
from mrtr.tasks._history import iso


def load_security(key_env: str) -> RequestStateSecurity:
    """The key ring from `$key_env`: hex keys, comma-separated (the first seals, all open)."""
    raw = os.environ.get(key_env, "").strip()
    if not raw:
        raise UsageError(f"set {key_env} to the server's hex state key (or pick another variable with --key-env)")
    try:
        keys = [bytes.fromhex(part.strip()) for part in raw.split(",") if part.strip()]
        return RequestStateSecurity(keys=keys)
    except ValueError as exc:
        raise UsageError(f"{key_env} must hold hex keys of at least 32 bytes: {exc}") from None


def unseal(token: str, security: RequestStateSecurity) -> JSONObject:
    if not token:
        raise UsageError("no requestState given (pass it as an argument, or - to read stdin)")
    try:
        payload = security.codec.unseal(token)
    except InvalidRequestState as exc:
        raise UsageError(f"cannot unseal this requestState ({exc}): wrong key, or not a sealed state") from None
    try:
        claims = json.loads(payload)
    except ValueError:
        raise UsageError("the sealed payload is not a requestState envelope") from None
    if not isinstance(claims, dict) or not isinstance(claims.get("s"), str):
        raise UsageError("the sealed payload is not a requestState envelope")
    return claims


def describe(claims: Mapping[str, Any], now: float) -> JSONObject:
    """Claims and decoded journal as one JSON-able document."""
    envelope = {k: claims.get(k) for k in ("m", "t", "aud", "iat", "exp") if k in claims}
    out: JSONObject = {
        "method": envelope.get("m"),
        "target": envelope.get("t"),
        "audience": envelope.get("aud"),
        "issuedAt": iso(claims["iat"]) if isinstance(claims.get("iat"), int | float) else None,
        "expiresAt": iso(claims["exp"]) if isinstance(claims.get("exp"), int | float) else None,
        "expired": isinstance(claims.get("exp"), int | float) and claims["exp"] <= now,
        "principalBound": "p" in claims,
    }
    try:
        journal = journal_codec.decode(claims["s"])
    except JournalFormatError as exc:
        out["journalError"] = str(exc)
        out["state"] = claims["s"]
        return out
    out["journal"] = describe_journal(journal) | {"ageSeconds": round(now - journal.started_at, 3)}
    return out


def inspect(token: str, key_env: str, as_json: bool, out: Console) -> int:
    now = time.time()
    doc = describe(unseal(token, load_security(key_env)), now)
    if as_json:
        out.print_json(json.dumps(doc, default=str))
        return EXIT_OK
    expired = " [red](expired)[/]" if doc["expired"] else ""
    head = f"{doc['method']} {doc['target']}"
    out.print(f"[bold]{escape(head)}[/]  audience {escape(str(doc['audience']))}")
    out.print(f"  sealed {doc['issuedAt']}, valid until {doc['expiresAt']}{expired}")
    if "journalError" in doc:
        out.print(f"  [red]not an mrtr journal: {escape(doc['journalError'])}[/]")
        return EXIT_OK
    journal = doc["journal"]
    out.print(
        f"  flow {journal['flowId']}: started {journal['startedAt']} ({ago(now - journal['ageSeconds'], now)}),"
        f" {journal['rounds']} round(s)"
    )
    for title, rows in (
        ("answers", [[k, json.dumps(a["answer"])] for k, a in journal["answers"].items()]),
        ("steps", [[k, s["idempotencyKey"], json.dumps(s["result"])] for k, s in journal["steps"].items()]),
        ("pending asks", [[k, d["questionDigest"] or ""] for k, d in journal["pending"].items()]),
    ):
        if not rows:
            out.print(f"  {title}: none")
            continue
        table = Table(title=f"  {title}", title_justify="left", show_edge=False)
        for column in {"answers": ["key", "answer"], "steps": ["step", "idempotency key", "result"]}.get(
            title, ["key", "question digest"]
        ):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        out.print(table)
    return EXIT_OK


__all__ = [
    "describe",
    "inspect",
    "load_security",
    "unseal",
]
