"""The journal codec: exact round trips, compression only when it pays, clear format errors."""

from __future__ import annotations

import json

import pytest

from mrtr._engine import journal as codec
from mrtr._engine.journal import Journal, JournalFormatError


def sample_journal(answers: int) -> Journal:
    journal = Journal.start()
    for i in range(answers):
        journal.answers[f"elicit_abcdefghij_{i}"] = ("q" * 16, {"action": "accept", "content": {"env": "prod", "i": i}})
    journal.steps["plan"] = ("d" * 12, {"id": "plan-1", "env": "prod"})
    journal.pending["elicit_zzzz"] = "q" * 16
    journal.rounds = answers
    return journal


@pytest.mark.parametrize("answers", [0, 1, 5, 10, 40])
def test_round_trip_is_exact(answers: int) -> None:
    journal = sample_journal(answers)
    again = codec.decode(codec.encode(journal))
    assert again.to_wire() == journal.to_wire()


def test_every_field_this_version_writes_is_read_back_as_that_field() -> None:
    """A field this version writes must not come back as an unknown one (kept verbatim, it would
    override the field's new value on the next encode): origins grow from round to round."""
    journal = sample_journal(1)
    journal.markers.add("v2")
    journal.origins["k1"] = "0"
    journal.reworded = 1
    again = codec.decode(codec.encode(journal))
    assert again.extras == {}
    again.origins["k2"] = "1.0"
    assert codec.decode(codec.encode(again)).origins == {"k1": "0", "k2": "1.0"}
    newer = codec.decode("j" + json.dumps(journal.to_wire() | {"x": [1]}))
    assert newer.extras == {"x": [1]} and codec.decode(codec.encode(newer)).extras == {"x": [1]}


@pytest.mark.parametrize("value", ["é ü 漢字", "\u2028", "\ud800 lone surrogate", 10**30, 1e-7, [1.5, None, True]])
def test_any_json_value_round_trips_exactly(value: object) -> None:
    """Step results and answers are whatever JSON (or Python str) they were, both encoders' worth."""
    journal = Journal.start()
    journal.steps["s"] = ("d", {"v": value})
    for size in (1, 400):  # plain, then big enough to be compressed
        journal.steps["pad"] = ("d", "x" * size)
        assert codec.decode(codec.encode(journal)).steps["s"] == ("d", {"v": value})


def test_compression_is_used_only_when_it_pays() -> None:
    small = codec.encode(Journal.start())
    assert small.startswith("j")
    big = codec.encode(sample_journal(20))
    assert big.startswith("z")
    plain = "j" + json.dumps(sample_journal(20).to_wire(), separators=(",", ":"))
    assert codec.embedded_length(big) < codec.embedded_length(plain)


@pytest.mark.parametrize(
    "state",
    [
        "",
        "x{}",
        "j{",
        "j[]",
        'j{"v":99,"f":"a","t":1,"n":0}',
        'j{"v":1}',
        "z!!!!",
        'j{"v":1,"f":"a","t":1,"n":0,"a":5}',
    ],
)
def test_unreadable_state_raises_format_error(state: str) -> None:
    with pytest.raises(JournalFormatError):
        codec.decode(state)
