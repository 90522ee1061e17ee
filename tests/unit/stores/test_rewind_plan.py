"""`rewind_plan`: what "Back" does on the SQL ledgers, from a flow's rounds (mrtr.stores._base)."""

from __future__ import annotations

from mrtr.stores._base import RoundRow, rewind_plan

NOW = 1000.0


def rounds(**changes: RoundRow) -> dict[str, RoundRow]:
    """f:1 -> f:2 -> f:3 (handed out, never claimed); no step finished, all done."""
    base: dict[str, RoundRow] = {
        "f:1": ("A1", 0.0, "o1", False, False, "f:2"),
        "f:2": ("A2", 0.0, "o2", False, False, "f:3"),
    }
    return base | {key.replace("_", ":"): row for key, row in changes.items()}


def test_back_takes_a_round_no_step_followed_and_lists_the_branch_it_leaves() -> None:
    assert rewind_plan(rounds(), "f:1", "B1", NOW) == ("claimed", ["f:2", "f:3"])
    assert rewind_plan(rounds(), "f:2", "B2", NOW) == ("claimed", ["f:3"])
    assert rewind_plan(rounds(), "f:1", "A1", NOW) == ("same", [])
    assert rewind_plan(rounds(), "g:1", "B1", NOW) == ("retry", [])


def test_back_past_a_step_a_running_round_a_dead_one_or_an_unknown_one_is_not_taken() -> None:
    assert rewind_plan(rounds(f_2=("A2", 0.0, "o2", False, True, "f:3")), "f:1", "B1", NOW) == ("forked", [])
    assert rewind_plan(rounds(f_2=("A2", NOW + 5, None, False, None, None)), "f:1", "B1", NOW) == ("busy", [])
    assert rewind_plan(rounds(f_2=("A2", NOW - 5, None, False, None, None)), "f:1", "B1", NOW) == ("forked", [])
    legacy = rounds(f_1=("A1", 0.0, "o1", False, None, None))  # finished by an mrtr before "Back"
    assert rewind_plan(legacy, "f:1", "B1", NOW) == ("forked", [])
    assert rewind_plan(rounds(f_1=("", 0.0, None, True, None, None)), "f:1", "B1", NOW) == ("superseded", [])


def test_a_branch_already_left_stops_the_walk() -> None:
    left = rounds(f_3=("", 0.0, None, True, None, None))
    assert rewind_plan(left, "f:1", "B1", NOW) == ("claimed", ["f:2"])
