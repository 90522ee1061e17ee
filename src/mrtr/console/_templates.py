"""The console's pages: server-rendered Jinja2 templates (`templates/`), a little plain JS, no build step."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)

__all__ = ["TEMPLATES"]
