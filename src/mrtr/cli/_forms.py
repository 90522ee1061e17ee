"""Elicitation forms in a terminal, rendered from the request's JSON schema.

One prompt per field, in schema order: its title/description, type, allowed values,
default and whether it is required. Enter takes the default (or skips an optional
field); a value that does not fit its field schema (its type, bounds, pattern, or string
`format`: uri, email, date, date-time) is explained and that field alone is asked again;
the whole answer is validated against the requested schema before it is sent. At any
prompt `:decline` declines and `:cancel` cancels the form (the flow decides what that
means). URL-mode elicitations show the link and ask for consent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]  # no stubs among the project's dependencies
import mcp_types as t
from rich.console import Console
from rich.markup import escape

from mrtr._wire import JSONObject

DECLINE = ":decline"
CANCEL = ":cancel"
_TRUE = {"y", "yes", "true", "t", "1", "on"}
_FALSE = {"n", "no", "false", "f", "0", "off"}
_MAX_TRIES = 20
"""Re-prompts per field before giving up (bounded even when stdin repeats garbage)."""


_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*")
_DATE_TIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(?:Z|[+-](\d{2}):(\d{2}))", re.IGNORECASE
)
FORMAT_EXAMPLES = {
    "uri": "an absolute URI such as https://example.com/page",
    "email": "an address such as ada@example.com",
    "date": "a date such as 2026-07-28",
    "date-time": "a date and time with its UTC offset, such as 2026-07-28T09:30:00Z",
}
"""What a value of each string `format` of MCP elicitation schemas looks like (said with its error)."""


def is_uri(instance: object) -> bool:
    """RFC 3986 absolute URI: a scheme, only URI characters, and a host after `//` (but for file:)."""
    if not isinstance(instance, str):
        return True
    if not _URI.fullmatch(instance) or instance.count("#") > 1:
        return False
    scheme, _, rest = instance.partition(":")
    if not rest.startswith("//"):
        return True  # mailto:, urn:, data: ...
    authority = re.split(r"[/?#]", rest[2:], maxsplit=1)[0]
    host_port = authority.rpartition("@")[2]
    host, port = host_port, ""
    if ":" in host_port and not host_port.endswith("]"):  # host:port, [v6]:port (not a bare [v6])
        host, _, port = host_port.rpartition(":")
    if port and not port.isdigit():
        return False
    return bool(host) or scheme.lower() == "file"


def is_date_time(instance: object) -> bool:
    """RFC 3339 `date-time`: a full date, `T`, a time with seconds, and `Z` or an offset."""
    if not isinstance(instance, str):
        return True
    match = _DATE_TIME.fullmatch(instance)
    if match is None:
        return False
    day, hour, minute, second, offset_hour, offset_minute = match.groups()
    try:
        date.fromisoformat(day)
    except ValueError:
        return False
    in_range = int(hour) <= 23 and int(minute) <= 59 and int(second) <= 60  # 60: a leap second
    return in_range and int(offset_hour or 0) <= 23 and int(offset_minute or 0) <= 59


def format_checker() -> jsonschema.FormatChecker:
    """jsonschema's checker (email, date, ... need no extra package), plus `uri` and `date-time`,
    which jsonschema checks only with rfc3987 / rfc3339-validator installed."""
    checker = jsonschema.FormatChecker()
    for name, check in (("uri", is_uri), ("date-time", is_date_time)):
        if name not in checker.checkers:
            checker.checks(name)(check)
    return checker


FORMATS = format_checker()


def reason(exc: jsonschema.ValidationError) -> str:
    """A validation error's message, with what a `format` expects (`'x' is not a 'uri'` alone says little)."""
    fmt = exc.validator_value if exc.validator == "format" else None
    example = FORMAT_EXAMPLES.get(fmt) if isinstance(fmt, str) else None
    return f"{exc.message}: give {example}" if example else str(exc.message)


def problems(schema: Mapping[str, Any], content: Mapping[str, Any]) -> str | None:
    """Why `content` does not fit the form's schema (`field: reason`), or None when it does."""
    try:
        jsonschema.validate(content, schema, format_checker=FORMATS)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"{where}: {reason(exc)}" if where else reason(exc)
    except jsonschema.SchemaError:
        return None  # the server's schema is broken; let the server judge the answer
    return None


class Refused(Exception):
    """The person typed `:decline` or `:cancel`."""

    def __init__(self, action: Literal["decline", "cancel"]) -> None:
        super().__init__(action)
        self.action = action


Reader = Callable[[str], str]


def choices_of(schema: Mapping[str, Any]) -> list[tuple[Any, str]] | None:
    """(value, label) pairs of an enum field (`enum`, or `oneOf`/`anyOf` of `const`s), else None."""
    if isinstance(schema.get("enum"), list):
        names = schema.get("enumNames")
        values = schema["enum"]
        labels = names if isinstance(names, list) and len(names) == len(values) else [str(v) for v in values]
        return list(zip(values, labels, strict=True))
    options = schema.get("oneOf") or schema.get("anyOf")
    if isinstance(options, list) and options and all(isinstance(o, dict) and "const" in o for o in options):
        return [(o["const"], str(o.get("title", o["const"]))) for o in options]
    return None


def field_type(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return str(kind or "string")


class FormRenderer:
    """Asks one form's fields on `console`, reading lines with `read` (the console's input)."""

    def __init__(self, console: Console, read: Reader | None = None) -> None:
        self.console = console
        self.read = read or (lambda prompt: console.input(escape(prompt)))

    def _line(self, prompt: str) -> str:
        try:
            text = self.read(prompt)
        except EOFError:
            raise Refused("cancel") from None
        stripped = text.strip()
        if stripped == DECLINE:
            raise Refused("decline")
        if stripped == CANCEL:
            raise Refused("cancel")
        return stripped

    def ask_form(self, params: t.ElicitRequestFormParams, key: str | None) -> t.ElicitResult:
        requested: Any = params.requested_schema
        schema = requested if isinstance(requested, dict) else requested.model_dump(mode="json", exclude_none=True)
        title = f"[bold cyan]form[/] [dim]{escape(key)}[/]" if key else "[bold cyan]form[/]"
        self.console.print()
        self.console.print(f"{title}  [bold]{escape(params.message)}[/]")
        self.console.print(f"[dim]  Enter keeps the default · {DECLINE} declines · {CANCEL} cancels[/]")
        try:
            for _ in range(_MAX_TRIES):
                content = self._fields(schema)
                wrong = problems(schema, content)
                if not wrong:
                    return t.ElicitResult(action="accept", content=content)
                self.console.print(f"[red]  ✗ {escape(wrong)}[/] — once more")
            raise Refused("cancel")
        except Refused as refused:
            self.console.print(f"[yellow]  → {refused.action}[/]")
            return t.ElicitResult(action=refused.action)

    def _fields(self, schema: Mapping[str, Any]) -> JSONObject:
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        content: JSONObject = {}
        for name, prop in properties.items():
            value = self._field(name, prop if isinstance(prop, dict) else {}, name in required)
            if value is not _SKIP:
                content[name] = value
        return content

    def _field(self, name: str, prop: Mapping[str, Any], required: bool) -> Any:
        label = str(prop.get("title") or name)
        kind = field_type(prop)
        choices = choices_of(prop)
        item_choices = choices_of(prop.get("items") or {}) if kind == "array" else None
        hint = _hint(kind, prop, choices, item_choices)
        note = f" — {prop['description']}" if prop.get("description") else ""
        star = "[red]*[/]" if required else ""
        self.console.print(f"  [bold]{escape(label)}[/]{star}[dim]{escape(note)}[/]")
        if choices or item_choices:
            listed = "  ".join(
                f"[cyan]{i}[/]) {escape(lab)}" for i, (_, lab) in enumerate(choices or item_choices or [], 1)
            )
            self.console.print(f"    {listed}")
        has_default = "default" in prop
        default_text = f" [{_show(prop['default'])}]" if has_default else ""
        for _ in range(_MAX_TRIES):
            raw = self._line(f"  {name} ({hint}){default_text}: ")
            if raw == "":
                if has_default:
                    return prop["default"]
                if not required:
                    return _SKIP
                self.console.print("[red]    required[/]")
                continue
            try:
                value = _parse(raw, kind, choices, item_choices)
                jsonschema.validate(value, prop, format_checker=FORMATS)
            except jsonschema.SchemaError:
                return value  # the server's field schema is broken: let the server judge
            except (ValueError, jsonschema.ValidationError) as exc:
                message = reason(exc) if isinstance(exc, jsonschema.ValidationError) else str(exc)
                self.console.print(f"[red]    ✗ {escape(message)}[/]")
                continue
            return value
        raise Refused("cancel")

    def ask_url(self, params: t.ElicitRequestURLParams, key: str | None) -> t.ElicitResult:
        title = f"[bold cyan]link[/] [dim]{escape(key)}[/]" if key else "[bold cyan]link[/]"
        self.console.print()
        self.console.print(f"{title}  [bold]{escape(params.message)}[/]")
        self.console.print(f"  open: [link={params.url}]{escape(params.url)}[/link]")
        try:
            for _ in range(_MAX_TRIES):
                raw = self._line(f"  Done in the browser? (y = continue, {DECLINE}, {CANCEL}) [y]: ").lower()
                if raw in ("", "y", "yes"):
                    return t.ElicitResult(action="accept")
                if raw in ("n", "no"):
                    raise Refused("decline")
            raise Refused("cancel")
        except Refused as refused:
            self.console.print(f"[yellow]  → {refused.action}[/]")
            return t.ElicitResult(action=refused.action)


class _Skip:
    pass


_SKIP = _Skip()


def _hint(
    kind: str, prop: Mapping[str, Any], choices: list[tuple[Any, str]] | None, items: list[tuple[Any, str]] | None
) -> str:
    if choices:
        return "number or value"
    if items:
        return "numbers or values, comma-separated"
    if kind == "boolean":
        return "y/n"
    bounds = [
        f"≥ {prop['minimum']}" if "minimum" in prop else "",
        f"≤ {prop['maximum']}" if "maximum" in prop else "",
        f"min {prop['minLength']} chars" if "minLength" in prop else "",
        f"max {prop['maxLength']} chars" if "maxLength" in prop else "",
        f"like {prop['pattern']}" if "pattern" in prop else "",
    ]
    extra = ", ".join(b for b in bounds if b)
    if "format" in prop:
        extra = ", ".join(x for x in (extra, str(prop["format"])) if x)
    return f"{kind}{', ' + extra if extra else ''}"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "y" if value else "n"
    return value if isinstance(value, str) else json.dumps(value)


def _pick(raw: str, choices: list[tuple[Any, str]]) -> Any:
    if raw.isdigit() and 1 <= int(raw) <= len(choices):
        return choices[int(raw) - 1][0]
    for value, label in choices:
        if raw == str(value) or raw.lower() == label.lower():
            return value
    raise ValueError(f"pick one of: {', '.join(label for _, label in choices)}")


def _parse(raw: str, kind: str, choices: list[tuple[Any, str]] | None, items: list[tuple[Any, str]] | None) -> Any:
    if choices:
        return _pick(raw, choices)
    if kind == "array":
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        return [_pick(p, items) for p in parts] if items else parts
    if kind == "boolean":
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ValueError("answer y or n")
    if kind == "integer":
        try:
            return int(raw)
        except ValueError:
            raise ValueError("a whole number, please") from None
    if kind == "number":
        try:
            number = float(raw)
        except ValueError:
            raise ValueError("a number, please") from None
        return int(number) if number.is_integer() and "." not in raw else number
    return raw


__all__ = [
    "CANCEL",
    "DECLINE",
    "FORMATS",
    "FORMAT_EXAMPLES",
    "FormRenderer",
    "Reader",
    "Refused",
    "choices_of",
    "field_type",
    "format_checker",
    "is_date_time",
    "is_uri",
    "problems",
    "reason",
]
