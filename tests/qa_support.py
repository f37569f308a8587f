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

SINGLE = {"Orla Maye": "Which dredger was hired for the work?", "Ingrid Tasker": "Who is the new coxswain?",
          "Tomas Brey": "Who manages the fish market?"}
UNANSWERABLE = {"question": "What colour is the harbour cat?"}
JOIN = {"question": "Which dredger worked in the year Ingrid Tasker became coxswain?", "answer": "the Orla Maye"}
DOCUMENT = {"question": "Which people does the report name?", "answer": "Ingrid Tasker and Tomas Brey",
            "sentences": "2 and 3"}


def field_reply(request: Request, reply: dict[str, str]) -> str:
    """The value of the field the writer's prompt ends at (``...\nAnswer:``), then the next line."""
    field = request.prompt.rsplit("\n", 1)[-1].rstrip(":").lower()
    return " " + reply.get(field, "") + "\nMore: ignored"


def respond_qa(request: Request) -> str:
    """Answers each kind of question-writing request as asked, field by field."""
    prompt = request.prompt
    if "Write the question that this sentence answers" in prompt:
        answer = prompt.split('answers with "')[1].split('"')[0]
        return " " + SINGLE.get(answer, "not a question") + "\nAnswer: ignored"
    if "does not answer" in prompt:
        return field_reply(request, UNANSWERABLE)
    if "needs both facts" in prompt:
        return field_reply(request, JOIN)
    if "about the whole document" in prompt:
        return field_reply(request, DOCUMENT)
    return "not a question"


#: what a question-writing request's prompt says (any other request is a reading's)
WRITING = ("Write the question that this sentence answers", "does not answer", "needs both facts",
           "about the whole document")


def respond_qa_and_read(request: Request) -> str:
    """`respond_qa` for question-writing requests; a reading answers the single-fact questions right (a
    margin too), and abstains on any other."""
    if any(marker in request.prompt for marker in WRITING):
        return respond_qa(request)
    for answer, question in SINGLE.items():
        if question in request.prompt:
            return answer
    return "I don't know."
