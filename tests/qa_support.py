"""A report and a scripted question writer that answers each kind of question-writing request as asked."""

from __future__ import annotations

from marginalia.models.fake import Request

REPORT = """# Harbour

Silt builds up in the inner basin every year. The dredger hired for the work was the Orla Maye.

# Lifeboat

The lifeboat launched 37 times this year. Its new coxswain is Ingrid Tasker.

# Market

The fish market opened a new cold store in March. Its manager is Tomas Brey.
"""

SINGLE = {
    "Orla Maye": '{"question": "Which dredger was hired for the work?", "answer": "the Orla Maye", '
                 '"evidence": "The dredger hired for the work was the Orla Maye."',
    "Ingrid Tasker": '{"question": "Who is the new coxswain?", "answer": "Ingrid Tasker", '
                     '"evidence": "its new coxswain is ingrid tasker"',  # not verbatim: the sentence is found
    "Tomas Brey": '{"question": "Who manages the fish market?", "answer": "Tomas Brey", '
                  '"evidence": "Its manager is Tomas Brey."',
}


def respond_qa(request: Request) -> str:
    """The reply after the opening the writer gives (``{"question": "``), up to the closing brace."""
    prompt = request.prompt
    opening = '{"question": "'
    if "with a single fact" in prompt:
        text = prompt.split("Write one question")[0]
        for name, reply in SINGLE.items():
            if name in text:
                return reply[len(opening):] + "}"
        return "not json"
    if "does not answer" in prompt:
        return 'What colour is the harbour cat?"}'
    if "needs both facts" in prompt:
        return 'Which dredger worked in the year Ingrid Tasker became coxswain?", "answer": "the Orla Maye"}'
    if "about the whole document" in prompt:
        return 'Which people does the report name?", "answer": "Ingrid Tasker and Tomas Brey", "sentences": [2, 3]}'
    return "not json"
