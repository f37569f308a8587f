"""How the tests tell a WiM margin request from the others (scripted generators see them all).

WiM's intro, prefilled before the document, says what to write after each part; a margin
request is one made on a cache that holds the intro, and whose suffix is not an answer prompt
(both answer prompts ask to "Answer the question").
"""

from __future__ import annotations

from marginalia.models.fake import Request
from marginalia.prompts import render

MARGIN_INTRO = render("wim_intro").strip()
ANSWER_ASK = "Answer the question"


def is_margin(req: Request) -> bool:
    return MARGIN_INTRO in req.prefix and ANSWER_ASK not in req.suffix
