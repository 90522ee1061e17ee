"""The one interop flow's script: what the server asks, what every client answers, what comes out.

Every cell of the interop matrix runs the same `shopping_list` flow of
`tests/external/interop/server.py` and answers it from the same script, so a cell can compare the
final text byte for byte: any difference is an interop bug, never a different answer.
The answers depend only on the question *text*, because legacy (server→client request)
peers see no wire keys and the derived 2026-07-28 keys are opaque by design.

This module is plain Python on purpose: the FastMCP client script imports it from its own
venv, which has none of our test dependencies. `ts/client.mjs` mirrors it (keep the two in
step; the tests catch drift because they check the exact final text).
"""

from __future__ import annotations

from typing import Any, Literal

Scenario = Literal["complete", "decline"]
SCENARIOS: tuple[Scenario, ...] = ("complete", "decline")

TOOL = "shopping_list"
STORE = "corner shop"
OWNER = "Ada"
ITEMS = ("apples", "bread", "coffee")
ROOT_URI = "file:///interop/home"
ROOT_NAME = "home"
TITLE = "Breakfast run"
DECLINED_ITEM = 2  # in the "decline" scenario, the user declines the question for this item

# -- the questions (the server builds them with these functions; clients match on them) --------


def owner_question(store: str) -> str:
    return f"Who is the {store} list for?"


def item_question(n: int, owner: str, store: str, so_far: list[str]) -> str:
    return f"Item {n} for {owner}'s {store} list (so far: {', '.join(so_far) or 'nothing'})?"


def title_prompt(items: list[str]) -> str:
    return f"Name a shopping list of: {', '.join(items)}"


def final_text(title: str, owner: str, items: list[str], root: str, saves: int) -> str:
    saved = "saved once" if saves == 1 else f"saved {saves} times"
    return f"{title!r} for {owner}: {', '.join(items)}; root {root}; {saved}"


# -- the answers ------------------------------------------------------------------------------


def elicit_answer(scenario: Scenario, message: str) -> dict[str, Any]:
    """The `ElicitResult` (as wire JSON) the user gives to `message`."""
    if message == owner_question(STORE):
        return {"action": "accept", "content": {"name": OWNER}}
    if message.startswith("Item "):
        n = int(message.split()[1])
        if scenario == "decline" and n == DECLINED_ITEM:
            return {"action": "decline"}
        if n <= len(ITEMS):
            return {"action": "accept", "content": {"item": ITEMS[n - 1], "done": False}}
        return {"action": "accept", "content": {"item": "", "done": True}}
    return {"action": "cancel"}  # a question not in the script: the flow will say so


def sample_answer(prompt: str) -> str:
    """The client's "LLM": a fixed title, but only for the expected prompt (proves it arrived intact)."""
    return TITLE if prompt == title_prompt(list(ITEMS)) else f"unexpected prompt: {prompt}"


# -- what a cell must see ---------------------------------------------------------------------

ROOTS = "roots/list"
SAMPLE = "sampling/createMessage"


def expected_asks(scenario: Scenario) -> list[str]:
    """What the client is asked, in order (elicitations by message). The first two are one round."""
    asks = [owner_question(STORE), ROOTS]
    so_far: list[str] = []
    last = DECLINED_ITEM if scenario == "decline" else len(ITEMS) + 1
    for n in range(1, last + 1):
        asks.append(item_question(n, OWNER, STORE, so_far))
        if n <= len(ITEMS):
            so_far.append(ITEMS[n - 1])
    if scenario == "complete":
        asks.append(SAMPLE)
    return asks


def expected_result(scenario: Scenario) -> tuple[bool, str]:
    """`(is_error, text)` of the final `tools/call` result."""
    if scenario == "complete":
        return False, final_text(TITLE, OWNER, list(ITEMS), ROOT_URI, saves=1)
    declined = item_question(DECLINED_ITEM, OWNER, STORE, list(ITEMS[: DECLINED_ITEM - 1]))
    return True, f"Error executing tool {TOOL}: The user declined the request: {declined}"


def same_asks(seen: list[str], scenario: Scenario) -> bool:
    """`seen` is the expected sequence; the first round's two asks may come in either order."""
    expected = expected_asks(scenario)
    return sorted(seen[:2]) == sorted(expected[:2]) and seen[2:] == expected[2:]


# -- `echo_and_confirm`: sampling, then one question (for clients with non-interactive modes) ------------


def echo_prompt(word: str) -> str:
    return f"echo {word}"


def keep_question(said: str) -> str:
    return f"Keep {said!r}?"


def echo_text(said: str, verdict: str) -> str:
    return f"sampled {said!r}; {verdict}"


def keep_text(word: str, verdict: str) -> str:
    """`keep_word`'s answer."""
    return f"{word!r} {verdict}"
