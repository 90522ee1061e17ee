"""Load the seed fixtures: the seeds' JSON exactly as printed, read the way their authors meant it.

The seeds' examples are not all strict JSON (they are "json5" in seed 001's own words):
`//` comments, a comma missing before `"dependent_responses"` / `"input_responses"` in the
retried requests of seeds 000 and 001, trailing commas in seed 001's task example, and
two bare `"key": {...}` fragments. The fixture files keep that text verbatim; `load` makes
only these repairs, so a fixture that needed any other change would fail to load.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def names(prefix: str = "") -> list[str]:
    return sorted(p.name for p in FIXTURES.glob(f"{prefix}*.json5"))


def load(name: str) -> Any:
    return json.loads(repair(strip_comments((FIXTURES / name).read_text())))


def strip_comments(text: str) -> str:
    """Drop `//` comments outside strings."""
    out: list[str] = []
    in_string = escaped = False
    i = 0
    while i < len(text):
        char = text[i]
        if in_string:
            out.append(char)
            escaped = char == "\\" and not escaped
            if char == '"' and not escaped:
                in_string = False
        elif char == '"':
            in_string = True
            escaped = False
            out.append(char)
        elif text.startswith("//", i):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        else:
            out.append(char)
        i += 1
    return "".join(out)


def repair(text: str) -> str:
    text = re.sub(r"}(\s*\n\s*\")", r"},\1", text)  # the missing comma before a top-level key
    text = re.sub(r",(\s*[}\]])", r"\1", text)  # trailing commas
    if text.lstrip().startswith('"'):  # a `"key": {...}` fragment
        text = "{" + text + "}"
    return text
