"""Long documents, questions and margins for the grounded judge's oracle test (test_grounding.py).

Everything here is made from a seeded random generator and plain string operations, never from the code under
test, so that the verdicts it leads to can be stored once (tests/data/grounding_verdicts.json, written by
``python tests/patterns/grounding_oracle.py``) and compared with what a later judge gives on the same calls.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marginalia.patterns.judges import GroundedJudge
from marginalia.records import Segment

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "grounding_verdicts.json"

_TOWNS = ["Ostervik", "Lindholm", "Carrow", "Maplefold", "Dunmere", "Astley", "Kettleby", "Brackwater"]
_ADJ = ["mild", "grey", "quiet", "busy", "narrow", "windy", "calm", "damp", "bright", "steep"]
_MONTHS = ["March", "April", "May", "June", "July", "August", "September"]
_GOODS = ["apples", "wool", "cheese", "honey", "turnips", "candles", "rope", "barley", "salt", "slate"]
_PEOPLE = ["Dr. Ilse Varga", "Mr. Tomas Pell", "Prof. Ada Okafor", "St. Brendan", "Mrs. Nora Lemke"]
_SENTENCES = [
    "The weather in {town} stayed {adj} through {month}, with {n} days of light rain.",
    "Traders at the {town} market sold {good} and {good2} from early morning.",
    "The road from {town} to the coast was {adj} after the spring repairs, which cost {big} crowns.",
    "In {month} the council of {town} discussed the old granary and its {adj} roof.",
    "{person} measured the river at {town} each morning; it rose {dec} metres in {month}.",
    "A choir from {town} sang in the square on the first evening of {month} (the {n}th time since 1953).",
    "The bakery near the {town} bridge was known for its {adj} rye bread, said {person}.",
    "Farmers around {town} brought {good} to the weekly fair by cart, as the U.S. consul noted.",
    "\"Why did the barges stop at {town}?\" asked {person}.",
    "The ferry to {town} leaves from pier {n} at {hour} p.m. on weekdays!",
]
_FACTS = [
    "The night ferry to Brackwater leaves from pier 47.",
    "The lighthouse at Kettleby was built in 1887 by the engineer Alma Rusk.",
    "Title: Alma Rusk\nAlma Rusk was a civil engineer from Dunmere. She rowed for her school as a child. As an adult, "
    "she served as harbour master of Carrow.",
]
_UNSPACED = ["新码头在河的东岸。", "渡船每天早上七点出发。", "市场上卖苹果和蜂蜜。"]


def _sentence(rng: random.Random) -> str:
    goods = rng.sample(_GOODS, 2)
    return rng.choice(_SENTENCES).format(
        town=rng.choice(_TOWNS), adj=rng.choice(_ADJ), month=rng.choice(_MONTHS), n=rng.randint(2, 99),
        good=goods[0], good2=goods[1], person=rng.choice(_PEOPLE), dec=f"{rng.randint(1, 9)}.{rng.randint(1, 9)}",
        big=f"{rng.randint(1, 9)},{rng.randint(100, 999)}", hour=rng.randint(1, 11))


def town_paragraphs(seed: int, paragraphs: int) -> str:
    """Paragraphs of five to seven sentences, the facts planted among them, parted by blank lines."""
    rng = random.Random(seed)
    out = [" ".join(_sentence(rng) for _ in range(rng.randint(5, 7))) for _ in range(paragraphs)]
    for k, fact in enumerate(_FACTS):
        out.insert((k + 1) * len(out) // (len(_FACTS) + 1), fact)
    return "\n\n".join(out) + "\n"


def notes(seed: int, parts: int) -> str:
    """Markdown-like notes: headings, bullet lines without full stops, long run-on sentences of a few hundred
    to some fifteen hundred characters (commas and semicolons, no full stop), single line breaks, and lines in a
    script written without spaces."""
    rng = random.Random(seed)
    out = []
    for k in range(parts):
        out.append(f"## Part {k + 1}: {rng.choice(_TOWNS)}")
        for _ in range(rng.randint(2, 5)):
            out.append(f"- {rng.choice(_GOODS)} from {rng.choice(_TOWNS)}, {rng.randint(2, 900)} crates")
        clauses = [_sentence(rng).rstrip(".!?\"") for _ in range(rng.randint(2, 14))]
        out.append("; ".join(c[0].lower() + c[1:] for c in clauses) + ".")
        if rng.random() < 0.3:
            out.append(rng.choice(_UNSPACED) + rng.choice(_UNSPACED))
        out.append(" ".join(_sentence(rng) for _ in range(rng.randint(1, 4))))
        if rng.random() < 0.2:
            out.append(rng.choice(_FACTS))
        out.append("")
    return "\n".join(out)


DOCUMENTS = {
    "towns": town_paragraphs(1, 70),
    "notes": notes(2, 40),
}
QUESTIONS = {
    "towns": ["Which pier does the night ferry to Brackwater leave from?",
              "What government post was held by the woman who built the lighthouse at Kettleby?"],
    "notes": ["How many crates of honey came from Lindholm?",
              "What did the council of Carrow discuss in May, and which market in Lindholm sold wool and honey?"],
}

_SPLIT = re.compile(r"(?<=[.!?。])\s+|\n+")
_NUMBER = re.compile(r"\d+")
_MARKET = re.compile(r"[Tt]raders at the Lindholm market sold [^;.]*")


def segments(text: str, seed: int) -> list[Segment]:
    """Parts of about 700 to 2,000 characters, each ending before a space."""
    rng = random.Random(seed)
    out: list[Segment] = []
    start = 0
    while start < len(text):
        end = text.find(" ", start + rng.randint(700, 2000))
        end = len(text) if end < 0 else end
        out.append(Segment(len(out), start, end, text[start:end], ()))
        start = end
    return out


@functools.lru_cache(maxsize=256)
def _pieces(text: str) -> list[str]:
    return [p.strip() for p in _SPLIT.split(text) if len(p.strip()) > 12]


def margins(rng: random.Random, doc: str, question: str, segs: list[Segment], k: int) -> list[str]:
    """Two or three margins for segment ``k``, of the kinds a small model writes: a sentence copied, copied with a word
    left out, copied a segment late or from further on, a number changed, a lead-in, nothing, a list, a bare
    word, halves of two sentences joined, the question's words reordered, the question's names before a copied
    sentence; and where the segment holds the fact a multi-hop question asks for, that fact joined to the
    question's subject; and a sentence on the market one clause of a question asks about, not quite copied."""
    own = _pieces(segs[k].text) or [segs[k].text.strip()]
    before = _pieces(segs[k - 1].text) if k else own
    later = _pieces(segs[min(k + 1, len(segs) - 1)].text) or own
    far = _pieces(doc[: segs[k].start]) or own
    pick = rng.choice(own)
    words = pick.split()
    kinds = {
        "copy": pick,
        "drop": " ".join(words[:1] + words[2:]) if len(words) > 3 else pick,
        "late": rng.choice(before),
        "ahead": rng.choice(later),
        "number": _NUMBER.sub(lambda m: str(int(m.group()) + 1), pick, count=1),
        "lead-in": "The answer is: " + pick,
        "none": "NONE",
        "list": ", ".join(rng.sample(segs[k].text.split(), min(4, len(segs[k].text.split())))),
        "bare": rng.choice(words).strip(".,;:!?\"()"),
        "join": " ".join(words[: len(words) // 2] + rng.choice(far).split()[len(words) // 2:]),
        "question": " ".join(reversed(question.rstrip("?").split()[1:])),
        "two": pick + " " + rng.choice(before),
        "subject": " ".join(w for w in question.split()[1:] if w[:1].isupper()) + " " + pick,
    }
    chosen = [kinds[kind] for kind in rng.sample(sorted(kinds), 2)]
    if "harbour master" in segs[k].text:  # a multi-hop margin: the question's subject, the fact of another passage
        chosen.append("The woman who built the lighthouse at Kettleby served as harbour master of Carrow.")
    market = _MARKET.search(segs[k].text)  # one clause of a composite question, not quite copied
    if market:
        chosen.append(market.group().replace(" and ", " ", 1))
    return chosen


def calls() -> Iterator[tuple[str, str, str, Segment, int]]:
    """(document name, question, margin, segment, read length) in the order a reading would judge them: each
    question over every segment in turn (the second reads the same prefixes again), then a few prefixes out of
    order, cut mid-segment."""
    for name, doc in DOCUMENTS.items():
        rng = random.Random(name)
        segs = segments(doc, len(name))
        for question in QUESTIONS[name]:
            for k, segment in enumerate(segs):
                for margin in margins(rng, doc, question, segs, k):
                    yield name, question, margin, segment, segment.end
        for k in rng.sample(range(len(segs)), 6):
            cut = rng.randint(segs[k].start + 1, segs[k].end)
            part = Segment(k, segs[k].start, cut, doc[segs[k].start:cut], ())
            for margin in margins(rng, doc, QUESTIONS[name][0], segs, k):
                yield name, QUESTIONS[name][0], margin, part, cut


def verdict_row(judge: GroundedJudge, call: tuple[str, str, str, Segment, int]) -> list[Any]:
    """The judge's verdict on one of `calls`, as `REFERENCE` stores it: the length read, whether it is relevant,
    its score, evidence and reason, and its text where that is not the margin's."""
    name, question, margin, segment, read = call
    doc = DOCUMENTS[name]
    v = judge.judge(question, margin, segment, doc[:read], document=doc)
    row = [read, v.relevant, None if v.score is None else round(v.score, 9), list(v.evidence) if v.evidence else None,
           v.reason]
    return row + ([v.text] if v.text != margin.strip() else [])


def write_reference() -> None:
    judge = GroundedJudge()
    rows = [verdict_row(judge, call) for call in calls()]
    REFERENCE.write_text("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n]\n", "utf-8")
    print(f"wrote {len(rows)} verdicts to {REFERENCE}")


if __name__ == "__main__":
    write_reference()
