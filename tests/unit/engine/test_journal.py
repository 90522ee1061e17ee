"""The journal codec: exact round trips, compression only when it pays, clear format errors."""

from __future__ import annotations

import base64
import json
import time
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrtr._engine import journal as codec
from mrtr._engine.journal import Journal, JournalFormatError, JournalFromNewerVersion


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
    journal.rejected["k1"] = 2
    again = codec.decode(codec.encode(journal))
    assert again.rejected == {"k1": 2}
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


# -- what the codec promises, beyond round trips -------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
entries = st.dictionaries(st.text(min_size=1, max_size=12), st.tuples(st.text(max_size=16), json_values), max_size=6)


@st.composite
def journals(draw: st.DrawFn) -> Journal:
    journal = Journal.start()
    journal.answers = draw(entries)
    journal.steps = draw(entries)
    journal.pending = draw(st.dictionaries(st.text(min_size=1, max_size=12), st.text(max_size=16), max_size=4))
    journal.markers = draw(st.sets(st.text(max_size=8), max_size=3))
    journal.rounds = draw(st.integers(min_value=0, max_value=1000))
    return journal


@settings(max_examples=60, deadline=None)
@given(journals())
def test_any_journal_round_trips_and_its_size_bounds_its_encoding(journal: Journal) -> None:
    state = codec.encode(journal)
    assert codec.decode(state).to_wire() == journal.to_wire()
    assert codec.embedded_length(state) <= journal.size()
    plain = "j" + json.dumps(journal.to_wire(), separators=(",", ":"))
    assert codec.embedded_length(state) <= codec.embedded_length(plain)  # compressed only when it pays


@settings(max_examples=60, deadline=None)
@given(journals(), st.text(min_size=1, max_size=12), st.text(max_size=16), json_values)
def test_an_entry_adds_at_most_its_entry_size(journal: Journal, key: str, digest: str, value: object) -> None:
    """`entry_size` lets a run skip measuring the journal while it is far from its budget: it must bound
    what one more step or answer adds to the journal's size."""
    before = journal.size()
    journal.steps[key] = (digest, value)
    assert journal.size() - before <= codec.entry_size(key, digest, value)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_embedded_length_is_the_length_inside_another_json_document(text: str) -> None:
    assert codec.embedded_length(text) == len(json.dumps(text))
    assert codec.embedded_length(text) == len(json.dumps({"s": text}, separators=(",", ":"))) - len('{"s":}')


def test_size_is_an_upper_bound_of_the_encoded_journal() -> None:
    journal = Journal.start()
    assert codec.encode(journal).startswith("j")
    assert codec.embedded_length(codec.encode(journal)) <= journal.size()


def test_a_fresh_journal_is_minimal_and_unique() -> None:
    a, b = Journal.start(), Journal.start()
    assert a.flow_id != b.flow_id and len(a.flow_id) == 16
    assert abs(a.started_at - time.time()) < 5
    assert set(a.to_wire()) == {"v", "f", "t", "n"}  # empty tables cost nothing on the wire
    assert codec.encode(a).startswith("j") and len(codec.encode(a)) < 80


def test_encoding_is_deterministic() -> None:
    journal = sample_journal(12)
    journal.markers |= {"b", "a"}
    assert codec.encode(journal) == codec.encode(codec.decode(codec.encode(journal)))


def test_a_journal_from_a_newer_format_says_so() -> None:
    with pytest.raises(JournalFromNewerVersion, match="journal format 2"):
        codec.decode('j{"v":2,"f":"a","t":1,"n":0}')
    assert issubclass(JournalFromNewerVersion, JournalFormatError)


@pytest.mark.parametrize(
    "wire",
    [
        {"n": "many"},
        {"a": {"k": ["only a digest"]}},
        {"s": {"k": 5}},
        {"p": ["k"]},
        {"m": 5},
        {"w": "x"},
        {"t": None},
    ],
)
def test_a_journal_with_a_field_of_the_wrong_shape_is_a_format_error(wire: dict[str, object]) -> None:
    base: dict[str, object] = {"v": 1, "f": "a", "t": 1, "n": 0}
    with pytest.raises(JournalFormatError):
        codec.decode("j" + json.dumps(base | wire))


def test_a_compressed_journal_that_inflates_past_the_limit_is_refused() -> None:
    """A sealed state is authentic, but its size is still bounded: no zip bomb through requestState."""
    bomb = '{"v":1,"f":"a","t":1,"n":0,"x":"' + "a" * (9 << 20) + '"}'
    state = "z" + base64.urlsafe_b64encode(zlib.compress(bomb.encode(), 9)).decode().rstrip("=")
    assert len(state) < 20_000
    with pytest.raises(JournalFormatError, match="size limit"):
        codec.decode(state)


def test_a_compressed_journal_within_the_limit_is_read() -> None:
    journal = sample_journal(1)
    journal.steps["big"] = ("d", "a" * (1 << 20))
    state = codec.encode(journal)
    assert state.startswith("z") and len(state) < 10_000
    assert codec.decode(state).steps["big"] == ("d", "a" * (1 << 20))
