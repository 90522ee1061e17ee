"""fast-agent as a host runs `echo_and_confirm`: `python fastagent_client.py URL ERA` (in its own venv).

fast-agent (PyPI `fast-agent-mcp`, Python >= 3.12) is an agent host that answers a server's
questions without a person, which is how it is run in CI: sampling by its `passthrough` model
(the reply is the prompt itself) and elicitation in `auto-cancel` mode (every form is
cancelled). Its `passthrough` model also places the tool call, from a `***CALL_TOOL` message,
so no LLM is involved. ERA is fast-agent's `protocol_mode` for the server: `modern`
(2026-07-28, `input_required` rounds) or `legacy` (2025-11-25, server-to-client requests).

Prints one JSON line, the report `tests/external/interop/peers.py` reads: the protocol version
fast-agent negotiated, and the tool's text as the host got it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

from fast_agent import FastAgent

CONFIG = """\
default_model: passthrough
logger:
  level: error
  progress_display: false
  show_chat: false
  show_tools: false
mcp:
  servers:
    mrtr:
      transport: http
      url: {url}
      protocol_mode: {era}
      elicitation:
        mode: auto-cancel
      sampling:
        model: passthrough
"""


async def run(url: str, era: str, workdir: Path) -> dict[str, object]:
    config = workdir / "fastagent.config.yaml"
    config.write_text(CONFIG.format(url=url, era=era))
    fast = FastAgent("mrtr-interop", config_path=str(config), parse_cli_args=False, quiet=True)

    @fast.agent(name="host", servers=["mrtr"], model="passthrough")
    async def host() -> None:  # registered for fast.run(); the calls happen below
        return None

    async with fast.run() as app:
        reply = await app.host.send('***CALL_TOOL echo_and_confirm {"word": "ping"}')
        status = await app.host._aggregator.collect_server_status()
    text = reply
    with contextlib.suppress(ValueError, KeyError, TypeError):  # passthrough hands back the result as JSON
        text = str(json.loads(reply)["result"])
    return {"protocolVersion": status["mrtr"].protocol_version, "isError": False, "text": text, "asked": []}


def main() -> None:
    url, era = sys.argv[1], sys.argv[2]
    try:
        with tempfile.TemporaryDirectory(prefix="mrtr-fastagent-") as tmp:
            os.chdir(tmp)  # fast-agent keeps its sessions under ./.fast-agent: never in the project tree
            report = asyncio.run(run(url, era, Path(tmp)))
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
