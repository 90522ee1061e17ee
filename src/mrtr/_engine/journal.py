"""The journal: everything one flow has learned so far, and its compact encoding.

A journal records the answers the client gave (keyed by wire key, pinned to a digest
of the exact question), the results of finished steps (pinned to a digest of their
arguments), and the asks still outstanding. Ephemeral flows carry it in
`requestState`; the SDK's `RequestStateBoundary` encrypts and authenticates it, so
this module only has to make it small and exact, never secret.
"""

from __future__ import annotations

import base64
import json
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

import pydantic_core

from mrtr._wire import JSONObject

FORMAT_VERSION = 1

# Below this many bytes compression never pays (zlib's header and the base64 cost).
_COMPRESS_MIN = 160
_JSON_PREFIX = "j"
_ZLIB_PREFIX = "z"
_INFLATE_MAX = 8 << 20
# zlib level 6: within a few bytes of 9 on journals, at a fraction of the time (every round re-encodes).
# Past a few KiB its lazy matching costs a long flow's round more than the rest of encoding
# (JSON, base64) for ~1% of size, so large journals take level 1; both inflate the same way.
_LEVEL = 6
_LARGE = 2048
_LARGE_LEVEL = 1
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True)


def _dumps(wire: Any) -> str:
    """Compact JSON. pydantic-core's encoder is several times faster than the standard
    library's (every round encodes); the latter takes what it refuses (lone surrogates)."""
    try:
        return pydantic_core.to_json(wire).decode()
    except ValueError:
        return _ENCODER.encode(wire)


def _loads(text: str | bytes) -> Any:
    try:
        return pydantic_core.from_json(text)
    except ValueError:  # e.g. an escaped lone surrogate, which only the standard library reads
        return json.loads(text)


_KNOWN = frozenset("vftnaspmowrqb")


class JournalFormatError(ValueError):
    """The state is authentic (the boundary verified it) but not a journal we can read."""


class JournalFromNewerVersion(JournalFormatError):
    """Written by a newer mrtr in a format this one cannot read (an instance that can, will)."""


class QuestionNote(TypedDict, total=False):
    """What one ask asked, as a journal keeps it for people (`mrtr._engine.questions`); short keys,
    as everything in the journal, which rides in sealed state. Each field may be missing from a
    journal an older mrtr wrote (`{}`: nothing recorded)."""

    k: str
    """The ask's kind (`mrtr._engine.asks.AskKind`)."""
    q: str
    """The question's text, bounded (`mrtr._engine.questions.QUESTION_MAX`)."""
    t: str
    """A form's title."""
    d: str
    """The question's digest (a reworded question gets a new note)."""
    a: float
    """When it was first asked, epoch seconds."""
    r: float
    """When it was answered, epoch seconds."""


@dataclass
class Journal:
    """One flow's progress. Field names are spelled out here and shortened on the wire."""

    flow_id: str
    started_at: float
    rounds: int = 0
    answers: dict[str, tuple[str, Any]] = field(default_factory=dict)
    """wire key -> (question digest, the client's answer as wire JSON)."""
    steps: dict[str, tuple[str, Any]] = field(default_factory=dict)
    """step key -> (argument digest, the step's result as JSON)."""
    pending: dict[str, str] = field(default_factory=dict)
    """wire key -> question digest, for every ask the last round sent out."""
    markers: set[str] = field(default_factory=set)
    """`ctx.patched(id)` ids this flow passed (code versioning)."""
    origins: dict[str, str] = field(default_factory=dict)
    """explicit ask key -> the concurrent branch that asked it (derived keys carry theirs)."""
    reworded: int = 0
    """Rounds in a row whose answer went unused because the flow asked a different question."""
    rejected: dict[str, int] = field(default_factory=dict)
    """wire key -> answers in a row the question refused (a form answer off its schema); see `MAX_REJECTED`."""
    fork_from: str | None = None
    """A step key an operator forked the task from (`TaskAdmin.rerun(from_step=)`): when the run
    reaches it, the answers it has not used yet were given after that step, and are dropped
    (those asks are asked again). Cleared once reached."""
    questions: dict[str, QuestionNote] = field(default_factory=dict)
    """wire key -> what was asked, for people (`mrtr._engine.questions`). Durable tasks only;
    replay never reads it, and a journal from before it has none."""
    extras: JSONObject = field(default_factory=dict)
    """Wire fields written by a newer mrtr that this one does not know: kept, not dropped."""

    @classmethod
    def start(cls) -> Journal:
        return cls(flow_id=_b64u(os.urandom(12)), started_at=time.time())

    def to_wire(self, *, copy: bool = True) -> JSONObject:
        """The wire form, as JSON-ready data.

        `copy=False` (for the encoder, every round) puts the answer and step tables in as
        they are: their `(digest, value)` tuples serialize as the same JSON arrays as the
        lists a copy holds, without rebuilding a long flow's tables each round.
        """
        wire: JSONObject = {
            "v": FORMAT_VERSION,
            "f": self.flow_id,
            "t": round(self.started_at, 3),
            "n": self.rounds,
        }
        if self.answers:
            wire["a"] = {k: [q, v] for k, (q, v) in self.answers.items()} if copy else self.answers
        if self.steps:
            wire["s"] = {k: [d, v] for k, (d, v) in self.steps.items()} if copy else self.steps
        if self.pending:
            wire["p"] = self.pending
        if self.markers:
            wire["m"] = sorted(self.markers)
        if self.origins:
            wire["o"] = self.origins
        if self.reworded:
            wire["w"] = self.reworded
        if self.rejected:
            wire["b"] = dict(self.rejected)
        if self.fork_from is not None:
            wire["r"] = self.fork_from
        if self.questions:
            wire["q"] = {k: dict(v) for k, v in self.questions.items()} if copy else self.questions
        return wire | self.extras if self.extras else wire

    def size(self) -> int:
        """Bytes of the encoded journal, as it will sit in the sealed state (an upper bound: the
        plain form, its prefix included; `encode` picks the compressed form only when shorter)."""
        return len(_JSON_PREFIX) + embedded_length(_dumps(self.to_wire(copy=False)))

    @classmethod
    def from_wire(cls, wire: Any) -> Journal:
        try:
            if wire["v"] != FORMAT_VERSION:
                raise JournalFromNewerVersion(f"journal format {wire['v']!r}, this server reads {FORMAT_VERSION}")
            # Absent fields are the common case: skip building what would be empty.
            answers, steps, pending = wire.get("a"), wire.get("s"), wire.get("p")
            markers, origins, questions = wire.get("m"), wire.get("o"), wire.get("q")
            journal = cls(
                flow_id=str(wire["f"]),
                started_at=float(wire["t"]),
                rounds=int(wire["n"]),
                # JSON object keys are strings already; every entry of a long flow passes here each round.
                answers={k: (str(q), v) for k, (q, v) in answers.items()} if answers else {},
                steps={k: (str(d), v) for k, (d, v) in steps.items()} if steps else {},
                pending={str(k): str(q) for k, q in pending.items()} if pending else {},
                markers={str(m) for m in markers} if markers else set(),
                origins={str(k): str(v) for k, v in origins.items()} if origins else {},
                reworded=int(wire.get("w", 0)),
                rejected={str(k): int(n) for k, n in wire["b"].items()} if wire.get("b") else {},
                fork_from=None if wire.get("r") is None else str(wire["r"]),
                questions=cast(dict[str, QuestionNote], {str(k): dict(v) for k, v in questions.items()})
                if questions
                else {},
                extras={} if wire.keys() <= _KNOWN else {k: v for k, v in wire.items() if k not in _KNOWN},
            )
        except JournalFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise JournalFormatError(f"malformed journal: {exc!r}") from None
        return journal


def encode(journal: Journal) -> str:
    """Smallest text form of the journal *as it will sit inside the sealed envelope*.

    The boundary embeds our string in its own JSON claims, so every quote in plain JSON
    costs an escape; we compare the escaped lengths and compress only when that wins.
    """
    text = _dumps(journal.to_wire(copy=False))
    plain = _JSON_PREFIX + text
    if len(text) < _COMPRESS_MIN:
        return plain
    raw = text.encode()
    packed = _ZLIB_PREFIX + _b64u(zlib.compress(raw, _LARGE_LEVEL if len(raw) > _LARGE else _LEVEL))
    # Escaping only lengthens: a packed form shorter than the bare text needs no measuring of it.
    return packed if len(packed) < len(plain) + 2 or len(packed) < embedded_length(plain) else plain


def decode(state: str) -> Journal:
    try:
        if state.startswith(_JSON_PREFIX):
            wire = _loads(state[1:])
        elif state.startswith(_ZLIB_PREFIX):
            raw = base64.urlsafe_b64decode(state[1:] + "=" * (-len(state[1:]) % 4))
            inflater = zlib.decompressobj()
            text = inflater.decompress(raw, _INFLATE_MAX)
            if inflater.unconsumed_tail:
                raise JournalFormatError("journal inflates past the size limit")
            wire = _loads(text)
        else:
            raise JournalFormatError("not an mrtr journal")
    except JournalFormatError:
        raise
    except (ValueError, zlib.error) as exc:
        raise JournalFormatError(f"undecodable journal: {exc!r}") from None
    return Journal.from_wire(wire)


def entry_size(key: str, digest: str, value: Any) -> int:
    """What one journal entry adds to the encoded journal (upper bound, before compression).

    UTF-8 JSON from pydantic-core, tripled: our encoding escapes non-ASCII (up to 6 bytes a
    character where UTF-8 takes at least 2) and quotes (2 where JSON takes 1). Only used to
    skip the exact measurement while a journal is far from its budget.
    """
    return 3 * len(pydantic_core.to_json([key, digest, value], fallback=str))


def embedded_length(text: str) -> int:
    """Length of `text` once JSON-escaped inside another JSON document.

    The C encoder escapes faster than Python can tell whether anything needs escaping.
    """
    return len(json.dumps(text, ensure_ascii=True))


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


__all__ = [
    "FORMAT_VERSION",
    "Journal",
    "JournalFormatError",
    "JournalFromNewerVersion",
    "QuestionNote",
    "decode",
    "embedded_length",
    "encode",
    "entry_size",
]
