"""Composition assistance with fakes: the coordinator's triggers and FIFO memory, the memory generator's
retrieval and spans, the client's cache reuse, background memory swap and cancellation, the composer."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marginalia.errors import BackendError, UserError
from marginalia.index.schema import Hit
from marginalia.models.base import GenerationParams
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.records import Document, Section

pytest.importorskip("rapidfuzz")

from marginalia.compose import (  # noqa: E402
    AugmentationCoordinator,
    CompletionClient,
    Composer,
    MarginMemory,
    MemoryItem,
    MemoryRequest,
    TakeawayMemory,
    forks_share_cache,
    token_distance,
)
from marginalia.compose.client import strip_trailing  # noqa: E402
from marginalia.compose.coordinator import new_part  # noqa: E402


class Events(list):  # type: ignore[type-arg]
    """A listener that keeps the events, with a wait for one of a kind (events come from other threads)."""

    def __init__(self) -> None:
        super().__init__()
        self._came = threading.Condition()

    def append(self, event: Any) -> None:
        with self._came:
            super().append(event)
            self._came.notify_all()

    def wait_for_kind(self, kind: str, timeout: float = 5.0) -> bool:
        with self._came:
            return self._came.wait_for(lambda: any(e.kind == kind for e in self), timeout)


def item(text: str, doc: str = "d1") -> MemoryItem:
    return MemoryItem(text, f"{doc}.md", doc, (), 0, len(text), "takeaway")


# -- the coordinator -------------------------------------------------------------------------------------


def _levenshtein(a: Sequence[int], b: Sequence[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


@given(st.lists(st.integers(0, 5), max_size=12), st.lists(st.integers(0, 5), max_size=12))
def test_token_distance_is_levenshtein_on_token_ids(a: list[int], b: list[int]) -> None:
    assert token_distance(a, b) == _levenshtein(a, b)


class Gate:
    """A fetch that records requests and blocks until released; counts how many run at once."""

    def __init__(self, items: Sequence[MemoryItem] = (), fail: bool = False) -> None:
        self.calls: list[MemoryRequest] = []
        self.called = threading.Event()
        self.release = threading.Event()
        self.running = 0
        self.most = 0
        self.items = list(items)
        self.fail = fail
        self._lock = threading.Lock()

    def __call__(self, request: MemoryRequest) -> list[MemoryItem]:
        with self._lock:
            self.calls.append(request)
            self.running += 1
            self.most = max(self.most, self.running)
        self.called.set()
        try:
            if not self.release.wait(5):
                raise AssertionError("the gate was never opened")
            if self.fail:
                raise BackendError("the memory model is down")
            return [item(f"{t} (request {request.id})") for t in self.items] if self.items else []
        finally:
            with self._lock:
                self.running -= 1


def coordinator(fetch: Any, threshold: int = 4, size: int = 3, **kw: Any) -> tuple[AugmentationCoordinator, Events]:
    events = Events()
    return AugmentationCoordinator(fetch, threshold=threshold, memory_size=size, on_event=events.append, **kw), events


def test_a_request_is_made_exactly_when_the_token_distance_reaches_the_threshold() -> None:
    gate = Gate()
    gate.release.set()
    coord, _ = coordinator(gate, threshold=4)
    assert coord.observe("a b c", [1, 2, 3]) is None  # 3 edits from nothing
    first = coord.observe("a b c d", [1, 2, 3, 4])
    assert first is not None and first.distance == 4
    coord.wait_idle(5)
    assert coord.observe("a b c d e f g", [1, 2, 3, 4, 5, 6, 7]) is None  # 3 insertions
    assert coord.observe("a X c d e f g", [1, 9, 3, 4, 5, 6, 7]) is not None  # and one substitution
    coord.wait_idle(5)
    assert [c.distance for c in gate.calls] == [4, 4]
    coord.close()


def test_a_query_holds_only_the_text_new_since_the_last_request() -> None:
    gate = Gate()
    gate.release.set()
    coord, _ = coordinator(gate, threshold=2)
    coord.observe("The harbour", [1, 2])
    coord.wait_idle(5)
    coord.observe("The harbour opens at dawn", [1, 2, 3, 4, 5])
    coord.wait_idle(5)
    coord.observe("The harbor opens at dawn", [1, 7, 3, 4, 5, 8])  # an edit inside the text
    coord.wait_idle(5)
    assert [c.query for c in gate.calls] == ["The harbour", " opens at dawn", "r opens at dawn"]
    assert gate.calls[-1].context == "The harbor opens at dawn"
    assert new_part("abc", "abc") == "" and new_part("", "x") == "x"
    coord.close()


def test_one_request_in_flight_and_a_newer_trigger_replaces_the_pending_one() -> None:
    gate = Gate(items=["note"])
    coord, events = coordinator(gate, threshold=2)
    r1 = coord.observe("one two", [1, 2])
    assert gate.called.wait(5)  # r1 is being answered
    r2 = coord.observe("one two three four", [1, 2, 3, 4])
    r3 = coord.observe("one two three four five six", [1, 2, 3, 4, 5, 6])
    assert r1 and r2 and r3
    assert coord.in_flight == r1 and coord.pending == r3
    requested = [e for e in events if e.kind == "memory_requested"]
    assert [(e.request.id, e.replaces, e.started) for e in requested] == [(1, None, True), (2, None, False),
                                                                          (3, 2, False)]
    gate.release.set()
    assert coord.wait_idle(5)
    assert [c.id for c in gate.calls] == [r1.id, r3.id]  # r2 was never sent
    assert gate.most == 1
    assert gate.calls[1].query == " three four five six"  # covers what r2 would have asked
    assert [m.text for m in coord.memory] == ["note (request 1)", "note (request 3)"]
    coord.close()


def test_memory_is_a_bounded_fifo_and_a_repeat_moves_to_the_end() -> None:
    replies = iter([["a", "b"], ["c", "d"], ["b", "e"]])
    coord, events = coordinator(lambda request: [item(t) for t in next(replies)], threshold=1, size=3)
    for n in range(1, 4):
        coord.observe("x" * n, list(range(n)))
        coord.wait_idle(5)
    assert [m.text for m in coord.memory] == ["d", "b", "e"]
    updated = [e for e in events if e.kind == "memory_updated"]
    assert [[m.text for m in e.memory] for e in updated] == [["a", "b"], ["b", "c", "d"], ["d", "b", "e"]]
    assert [e.version for e in updated] == [1, 2, 3] and coord.version == 3
    coord.close()


def test_a_failing_memory_model_leaves_memory_as_it_was_and_gives_one_notice() -> None:
    gate = Gate(fail=True)
    gate.release.set()
    coord, events = coordinator(gate, threshold=2)
    coord.observe("one two", [1, 2])
    coord.wait_idle(5)
    coord.observe("one two three four", [1, 2, 3, 4])
    coord.wait_idle(5)
    failed = [e for e in events if e.kind == "memory_failed"]
    assert len(failed) == 2 and not any(e.timed_out for e in failed)
    assert "memory model is down" in failed[0].notice and failed[1].notice == ""
    assert "busy machine" not in failed[0].notice  # a failure is not a matter of time
    assert coord.memory == () and coord.version == 0
    # what the failed requests carried is asked for again
    assert gate.calls[1].query == "one two three four"
    gate.fail, gate.items = False, ["back"]
    coord.observe("one two three four five six", [1, 2, 3, 4, 5, 6])
    coord.wait_idle(5)
    assert [m.text for m in coord.memory] == ["back (request 3)"]
    gate.fail = True
    coord.observe("one two three four five six seven eight", list(range(8)))
    coord.wait_idle(5)
    assert [e.notice != "" for e in events if e.kind == "memory_failed"] == [True, False, True]
    coord.close()


def test_a_request_past_its_time_is_dropped_and_the_next_waits_for_it() -> None:
    gate = Gate(items=["late"])
    coord, events = coordinator(gate, threshold=2, timeout=0.05)
    coord.observe("one two", [1, 2])
    assert events.wait_for_kind("memory_failed")
    failed = next(e for e in events if e.kind == "memory_failed")
    assert failed.timed_out and "0.05 s" in failed.notice
    assert "busy machine" in failed.notice and "longer memory timeout" in failed.notice  # what to do about it
    second = coord.observe("one two three four", [1, 2, 3, 4])
    # the request that timed out still holds the memory model (it is blocked in the gate): the next one waits
    assert second is not None and coord.pending == second and coord.in_flight is not None
    assert len(gate.calls) == 1
    gate.release.set()
    coord.wait_idle(5)
    assert len(gate.calls) == 2 and gate.most == 1
    assert [m.text for m in coord.memory] == ["late (request 2)"]  # the late items of request 1 were dropped
    coord.close()


# -- the memory generator -------------------------------------------------------------------------------


DOCS = {
    "harbour.md": "# Harbour\n\nThe harbour of Ostervik opens at dawn. Fishing boats leave before the ferry.\n\n"
                  "The ferry to Lindholm sails twice a day in summer.\n",
    "market.md": "# Market\n\nTraders at the Ostervik market sell wool and honey. The market closes at noon.\n",
    "draft.md": "# Draft\n\nThe harbour of Ostervik opens at dawn and the ferry sails twice a day.\n",
}


class FakeCollection:
    """Chunks are paragraphs; hits are ranked by shared words (similarity: the share of query words)."""

    def __init__(self, docs: dict[str, str] = DOCS) -> None:
        self.docs = {src: Document(src, text, f"id-{src}", "markdown") for src, text in docs.items()}
        self.chunks: list[tuple[str, int, int]] = []
        for src, text in docs.items():
            for m in re.finditer(r"[^\n]+", text):
                if not m.group().startswith("#"):
                    self.chunks.append((src, m.start(), m.end()))
        self.queries: list[tuple[str, int]] = []
        self.returned: list[Hit] = []

    def search(self, query: str, k: int = 5, mode: str = "hybrid", kinds: Sequence[str] = ("chunk",)) -> list[Hit]:
        self.queries.append((query, k))
        words = set(re.findall(r"\w+", query.lower()))
        scored = []
        for src, a, b in self.chunks:
            text = self.docs[src].text[a:b]
            shared = len(words & set(re.findall(r"\w+", text.lower())))
            if shared:
                scored.append((shared / max(len(words), 1), src, a, b, text))
        scored.sort(key=lambda s: -s[0])
        hits = [Hit("chunk", f"{src}:{a}", f"id-{src}", src, text, (src.split(".")[0].title(),), 0, a, b, None,
                    sim, sim) for sim, src, a, b, text in scored[:k]]
        self.returned.extend(hits)
        return hits

    def document(self, doc_id: str) -> Document:
        return next(d for d in self.docs.values() if d.doc_id == doc_id)

    def sections(self, doc_id: str) -> list[Section]:
        return []


def request(query: str, context: str | None = None) -> MemoryRequest:
    return MemoryRequest(1, query, context if context is not None else query, len(query.split()))


def test_the_document_being_written_is_never_retrieved() -> None:
    store = FakeCollection()
    memory = TakeawayMemory(store, ScriptedGenerator(default="Boats leave at dawn."), hits=3,
                            exclude={"draft.md"})
    items = memory(request("harbour of Ostervik opens at dawn ferry"))
    assert any(h.source == "draft.md" for h in store.returned)  # the search did find it...
    assert items and all(i.source != "draft.md" for i in items)  # ...and it was left out
    by_id = TakeawayMemory(store, ScriptedGenerator(default="x y"), exclude={"id-draft.md"})
    assert all(h.source != "draft.md" for h in by_id.retrieve(request("harbour Ostervik dawn")))


def test_retrieval_looks_deeper_while_the_draft_fills_the_hits() -> None:
    long_draft = "# Draft\n\n" + "\n".join(f"The harbour of Ostervik opens at dawn, note {i}." for i in range(40))
    store = FakeCollection({**DOCS, "draft.md": long_draft})
    memory = TakeawayMemory(store, ScriptedGenerator(), hits=2, exclude={"draft.md"})
    hits = memory.retrieve(request("harbour of Ostervik opens at dawn"))
    assert [k for _, k in store.queries] == [8, 32, 128]  # 40 draft chunks fill the first two searches
    assert len(hits) == 2 and all(h.source != "draft.md" for h in hits)


def test_a_chunk_the_text_already_holds_word_for_word_is_not_memory() -> None:
    store = FakeCollection()
    written = DOCS["draft.md"] + "\nMore words of mine."  # the draft, indexed under another name
    hits = TakeawayMemory(store, ScriptedGenerator()).retrieve(request("harbour Ostervik dawn ferry", written))
    assert hits and all(h.source != "draft.md" for h in hits)


@pytest.mark.parametrize("note", [
    "The passage does not mention anything that helps me go on writing.",
    "The passage does not provide any fact that would help me go on writing.",
    "This text doesn't say anything about the ferry.",
    "The passage has no information about the formation of the 2nd Division.",
    "Nothing in the passage helps.",
    "No relevant fact.",
    "NONE",
    "ferry",
])
def test_a_takeaway_saying_its_passage_has_nothing_is_empty(note: str) -> None:
    from marginalia.compose.memory import empty_takeaway

    assert empty_takeaway(note)


@pytest.mark.parametrize("note", [
    "The passage of the Reform Act did not end the dispute.",
    "Kershaw did not play in 2010.",
    "Nothing Compares 2 U was released in 1990.",
    "The text was first printed in 1851.",
])
def test_a_takeaway_with_a_fact_is_kept_even_with_a_no_in_it(note: str) -> None:
    from marginalia.compose.memory import empty_takeaway

    assert not empty_takeaway(note)


def test_takeaways_that_say_nothing_never_reach_memory() -> None:
    store = FakeCollection()

    def respond(req: Request) -> str:
        if "Traders" in req.prompt:
            return "The passage does not mention anything that helps me go on writing."
        return "The ferry sails twice a day."

    items = TakeawayMemory(store, ScriptedGenerator(respond), hits=3, exclude={"draft.md"})(
        request("ferry market Ostervik"))
    assert [i.text for i in items] == ["The ferry sails twice a day."]


def test_takeaways_are_written_per_chunk_and_span_their_chunk() -> None:
    store = FakeCollection()

    def respond(req: Request) -> str:
        return "NONE" if "Traders" in req.prompt else "- The ferry sails twice a day.\nmore"

    gen = ScriptedGenerator(respond)
    items = TakeawayMemory(store, gen, hits=3, exclude={"draft.md"})(request("ferry market Ostervik"))
    assert len(gen.requests) == 3  # one per retrieved chunk
    assert all("ferry market Ostervik" in r.prompt for r in gen.requests)
    # harbour.md's two chunks give the same takeaway: the memory would hold it once, and so do the items
    assert [i.text for i in items] == ["The ferry sails twice a day."]
    assert [h.source for h in store.returned].count("harbour.md") == 2
    for i in items:
        doc = store.docs[i.source]
        assert i.kind == "takeaway" and doc.text[i.start:i.end] in {h.text for h in store.returned}
        assert i.section_path == ("Harbour",)


def test_margins_memory_carries_exact_source_spans() -> None:
    store = FakeCollection()

    def respond(req: Request) -> str:  # copy the sentence about the ferry once it has been read
        return "The ferry to Lindholm sails twice a day in summer." if "in summer." in req.prefix else "NONE"

    memory = MarginMemory(store, ScriptedGenerator(respond), hits=3, segment_tokens=12, exclude={"draft.md"})
    items = memory(request("when does the ferry to Lindholm sail"))
    assert len(items) == 1
    got = items[0]
    assert got.kind == "margin" and got.source == "harbour.md"
    assert got.text == store.docs[got.source].text[got.start:got.end]
    assert got.text == "The ferry to Lindholm sails twice a day in summer."


def test_margins_memory_keeps_a_copied_sentence_that_shares_no_word_with_the_passage() -> None:
    """The passage being written is no question: a sentence read that helps go on with it rarely repeats its
    words, and is kept all the same; one that only repeats the passage is not."""
    store = FakeCollection()
    said = "The ferry to Lindholm sails twice a day in summer."

    def respond(req: Request) -> str:
        assert "helps to continue" in req.prompt  # asked as a request, not with the bare passage
        return said if "in summer." in req.prefix else "NONE"

    memory = MarginMemory(store, ScriptedGenerator(respond), hits=3, segment_tokens=12, exclude={"draft.md"})
    assert [i.text for i in memory(request("Visitors crossing over from the mainland usually"))] == [said]
    repeat = MarginMemory(store, ScriptedGenerator(lambda req: "Visitors crossing over from the mainland"),
                          hits=3, segment_tokens=12, exclude={"draft.md"})
    assert repeat(request("Visitors crossing over from the mainland usually")) == []


def test_margins_memory_needs_a_caching_model() -> None:
    from marginalia.models.base import Generator

    class Plain(Generator):
        tokenizer = ScriptedGenerator().tokenizer  # type: ignore[assignment]

        def render_chat(self, messages: Any, add_generation_prompt: bool = True) -> str:
            return ""

        def stream_prompt(self, prompt_ids: Any, params: GenerationParams) -> Iterator[str]:
            yield ""

    with pytest.raises(UserError, match="KV cache"):
        MarginMemory(FakeCollection(), Plain())


# -- the client ------------------------------------------------------------------------------------------


def test_a_keystroke_prefills_only_its_new_tokens() -> None:
    gen = ScriptedGenerator(default=" sails at dawn")
    client = CompletionClient(gen, suggestion_tokens=4)
    tok = gen.tokenizer
    first = client.complete("The ferry").text()
    assert first == " sails at"  # four tokens: ' ', 'sails', ' ', 'at'
    same = client.complete("The ferry")
    assert same.text() == first
    assert same.result is not None and same.result.prefilled_tokens == 0
    typed = client.complete("The ferry to Lindholm")
    typed.text()
    assert typed.result is not None and typed.result.prefilled_tokens == len(tok.encode(" to Lindholm"))
    # the cache holds exactly the prompt: instruction + memory + text
    assert gen.requests[-1].prefix_ids == tuple(client.prompt_ids(client.encode("The ferry to Lindholm")))
    edited = client.complete("The ferrys to Lindholm")  # an edit inside: back to the common prefix
    edited.text()
    assert edited.result is not None and edited.result.prefilled_tokens == len(tok.encode("ferrys to Lindholm"))


def test_a_trailing_blank_is_left_to_the_model_and_dropped_from_the_suggestion() -> None:
    gen = ScriptedGenerator(default=" sails at dawn")
    client = CompletionClient(gen, suggestion_tokens=4)
    assert strip_trailing("The ferry \t") == "The ferry"
    assert client.complete("The ferry ").text() == "sails at"
    assert gen.requests[-1].prefix.endswith("The ferry")


def test_the_loop_guard_goes_with_every_suggestion_or_is_refused_at_once() -> None:
    gen = ScriptedGenerator(default=" sails at dawn")
    client = CompletionClient(gen, suggestion_tokens=4, no_repeat_ngram=3)
    client.complete("The ferry", max_new_tokens=2).text()
    assert gen.requests[-1].params.no_repeat_ngram == 3 and gen.requests[-1].params.max_new_tokens == 2
    assert gen.requests[-1].params.stop == ("\n",)
    plain = ScriptedGenerator(default=" sails")
    plain.supports_copy = False  # as a server backend: it cannot mask tokens
    with pytest.raises(UserError, match="no run of tokens twice"):
        CompletionClient(plain, no_repeat_ngram=3)
    with pytest.raises(UserError, match="a run length in tokens"):
        CompletionClient(ScriptedGenerator(), no_repeat_ngram=-1)
    CompletionClient(plain)  # without the guard it is fine


def test_a_given_memory_serves_one_completion_and_leaves_the_memory_in_use() -> None:
    gen = ScriptedGenerator(default=" sails at dawn")
    client = CompletionClient(gen, suggestion_tokens=4)
    notes = (item("The ferry leaves Ostervik at seven."),)
    assert client.complete("The ferry", memory=notes).text() == " sails at"
    assert "The ferry leaves Ostervik at seven." in gen.requests[-1].prefix
    assert client.memory == () and client.memory_version == 0
    client.complete("The ferry").text()
    assert "Ostervik" not in gen.requests[-1].prefix


def test_the_client_scores_a_continuation_after_its_own_prompt(make_tiny: Any) -> None:
    gen = make_tiny()
    client = CompletionClient(gen, suggestion_tokens=4)
    notes = (item("The harbour opens at dawn and closes at dusk."),)
    scores = client.score("The harbour opens ", "at dawn", memory=notes)
    ref = make_tiny()
    ref.prefill(client.prompt_ids(client.encode("The harbour opens"), memory=notes))
    ids = gen.tokenizer.encode(" at dawn")  # the blank the prompt left out starts the continuation
    assert scores == pytest.approx(ref.score(ids), abs=1e-5)
    assert scores != pytest.approx(client.score("The harbour opens ", "at dawn"), abs=1e-5)  # memory counts
    with pytest.raises(UserError, match="empty"):
        client.score("The harbour", "")


def test_a_long_text_keeps_its_end_and_the_cut_moves_in_steps() -> None:
    gen = ScriptedGenerator(default=" more", context_window=300)
    client = CompletionClient(gen, suggestion_tokens=4)
    words = " ".join(f"w{i}" for i in range(400))
    client.complete(words).text()
    assert len(gen.requests[-1].prefix_ids) <= 300 - 4
    assert gen.requests[-1].prefix.endswith("w399")
    more = client.complete(words + " w400")
    more.text()
    assert more.result is not None and more.result.prefilled_tokens == 2  # the cut stayed where it was


class StuckStandby:
    """A fork of ``gen`` (``generator``) whose prefill waits until ``gate`` is set: ``entered`` says that a
    prefill waits there, ``gave_up`` that one stopped waiting (after 5 s, and failed)."""

    def __init__(self, gen: ScriptedGenerator) -> None:
        self.generator = gen.fork(keep_cache=False)
        self.gate, self.entered, self.gave_up = threading.Event(), threading.Event(), threading.Event()
        prefill = self.generator.prefill

        def gated(ids: Sequence[int]) -> None:
            self.entered.set()
            if not self.gate.wait(5):
                self.gave_up.set()
                raise AssertionError("the standby's gate was never opened")
            prefill(ids)

        self.generator.prefill = gated  # type: ignore[method-assign]


def test_new_memory_is_prepared_aside_and_never_blocks_a_completion() -> None:
    gen = ScriptedGenerator(default=" sails at dawn")
    standby = StuckStandby(gen)
    events: list = []
    client = CompletionClient(gen, standby=standby.generator, suggestion_tokens=3, on_event=events.append)
    client.complete("The ferry").text()
    client.set_memory([item("The ferry sails twice a day.")], 1)
    assert standby.entered.wait(5)  # the memory is being prepared, and stuck
    during = client.complete("The ferry to")  # this must not wait for the standby
    during.text()
    assert not standby.gave_up.is_set()  # it did not: it would have waited until the standby gave up
    assert during.result is not None and during.result.memory_version == 0
    assert during.result.prefilled_tokens == 2
    assert "twice a day" not in gen.requests[-1].prompt
    standby.gate.set()
    assert client.wait_prepared(5)
    after = client.complete("The ferry to Lindholm")
    after.text()
    assert after.result is not None and after.result.memory_version == 1
    assert "- The ferry sails twice a day." in gen.requests[-1].prompt
    # the standby caught up with "The ferry to" in the background: this completion prefilled only the new word
    assert after.result.prefilled_tokens == len(gen.tokenizer.encode(" Lindholm"))
    kinds = [e.kind for e in events]
    assert kinds.index("memory_prepared") < kinds.index("memory_swapped")
    assert client.memory == (item("The ferry sails twice a day."),)
    client.close()


def test_newer_memory_replaces_memory_being_prepared() -> None:
    gen = ScriptedGenerator(default=" x")
    standby = StuckStandby(gen)
    client = CompletionClient(gen, standby=standby.generator, suggestion_tokens=1)
    client.complete("Start").text()
    client.set_memory([item("old note")], 1)
    assert standby.entered.wait(5)  # the old note is being prepared
    client.set_memory([item("new note")], 2)
    client.set_memory([item("stale note")], 1)  # an older version is ignored
    standby.gate.set()
    assert client.wait_prepared(5)
    client.complete("Start").text()
    assert client.memory_version == 2 and "new note" in gen.requests[-1].prompt
    assert "old note" not in gen.requests[-1].prompt
    client.close()


def test_typing_cancels_the_completion_in_progress() -> None:
    gen = Held(default=" " + " ".join(f"word{i}" for i in range(40)), at=3)
    composer = Composer(CompletionClient(gen, suggestion_tokens=60), lambda r: [], threshold=1000, memory_size=2)
    results: list = []
    worker = threading.Thread(target=lambda: results.append(composer.suggest("The ferry")))
    worker.start()
    assert gen.writing.wait(5)  # its first words are written
    composer.edit("The ferry sails")
    gen.release.set()
    worker.join(5)
    (result,) = results
    assert result.cancelled and result.generated_tokens < 20 and result.text.startswith(" word0")
    assert gen.length == len(composer.client.prompt_ids(composer.client.encode("The ferry")))  # rolled back
    again = composer.suggest("The ferry sails")
    assert not again.cancelled and again.prefilled_tokens == 2
    composer.close()


def test_a_suggestion_waits_for_the_debounce_and_a_keystroke_in_it_cancels_it() -> None:
    gen = ScriptedGenerator(default=" a b")
    client = CompletionClient(gen, suggestion_tokens=2)
    taken = threading.Event()
    update = client.update

    def taking(ids: Sequence[int]) -> None:  # the last step of an edit, once its text counts
        update(ids)
        taken.set()

    client.update = taking  # type: ignore[method-assign]
    composer = Composer(client, lambda r: [], threshold=1000, memory_size=2, debounce=60.0)
    results: list = []
    worker = threading.Thread(target=lambda: results.append(composer.suggest("Hello")), daemon=True)
    worker.start()
    assert taken.wait(5)  # the suggestion has its text and waits out the debounce
    composer.edit("Hello there")
    worker.join(5)  # the keystroke ended the wait: not 60 s
    assert results and results[0].cancelled and gen.requests == []
    composer.debounce = 0.0
    assert composer.suggest("Hello there").text == " a"
    composer.close()


def test_forks_that_share_a_cache_need_a_standby() -> None:
    class SharedForks(ScriptedGenerator):
        """Forks share one context that holds one fork's tokens at a time (like llama.cpp's): a fork that
        finds another's tokens there prefills its own again."""

        def __init__(self, *args: Any, context: dict[str, Any] | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.context = context if context is not None else {"owner": None}

        def fork(self, keep_cache: bool = True) -> ScriptedGenerator:
            other = SharedForks(default=self.default, _shared=self, context=self.context)
            if keep_cache:
                other.ids = list(self.ids)
            return other

        def prefill(self, ids: Sequence[int]) -> None:
            if self.context["owner"] is not self:
                self.usage.prefilled_tokens += len(self.ids)
                self.context["owner"] = self
            super().prefill(ids)

    gen = SharedForks()
    with pytest.raises(UserError, match="standby"):
        CompletionClient(gen)
    CompletionClient(gen, standby=ScriptedGenerator(_shared=gen))  # a separate cache is fine


def test_a_standby_of_another_model_is_refused() -> None:
    gen = ScriptedGenerator()
    other = ScriptedGenerator()
    other.tokenizer.encode("something else first")
    with pytest.raises(UserError, match="tokenizes differently"):
        CompletionClient(gen, standby=other)


# -- the composer ----------------------------------------------------------------------------------------


def test_the_composer_keeps_suggesting_with_its_memory_while_memory_fails() -> None:
    gen = ScriptedGenerator(default=" and more")
    calls = []

    def fetch(r: MemoryRequest) -> list[MemoryItem]:
        calls.append(r)
        if len(calls) == 1:
            return [item("The ferry sails twice a day.")]
        raise BackendError("memory model crashed")

    composer = Composer(CompletionClient(gen, suggestion_tokens=2), fetch, threshold=3, memory_size=4)
    composer.edit("The ferry leaves")
    assert composer.wait_idle(5)
    text = "The ferry leaves"
    for word in "at dawn every day from the old quay".split(" "):
        text += " " + word
        result = composer.suggest(text)
        assert result.text == " and" and not result.cancelled
        assert composer.wait_idle(5)
    assert len(calls) == 5  # a request every two words (a blank and a word: two tokens); all but the first fail
    assert composer.client.memory_version == 1 and "twice a day" in gen.requests[-1].prompt
    assert len(composer.notices) == 1 and "memory model crashed" in composer.notices[0]
    composer.close()


def test_composer_end_to_end_with_fakes_retrieves_and_uses_memory() -> None:
    store = FakeCollection()
    memory_model = ScriptedGenerator(
        lambda r: "The ferry sails twice a day." if "summer" in r.prompt else "Boats leave before the ferry.")
    gen = ScriptedGenerator(default=" twice a day")
    composer = Composer(CompletionClient(gen, suggestion_tokens=3),
                        TakeawayMemory(store, memory_model, hits=2, exclude={"draft.md"}),
                        threshold=4, memory_size=3)
    composer.edit("The ferry to Lindholm")
    assert composer.wait_idle(5)
    assert [i.source for i in composer.memory] == ["harbour.md", "harbour.md"]
    assert [i.text for i in composer.memory] == ["The ferry sails twice a day.", "Boats leave before the ferry."]
    composer.suggest("The ferry to Lindholm sails")
    assert "twice a day." in gen.requests[-1].prompt
    kinds = [e.kind for e in composer.events]
    for kind in ("memory_requested", "memory_started", "memory_updated", "memory_prepared", "memory_swapped",
                 "suggested"):
        assert kind in kinds
    composer.close()


# -- the real embedded model on llama.cpp -----------------------------------------------------------------


@pytest.fixture(scope="module")
def second_smollm2(smollm2_llamacpp: Any) -> Any:
    """A second llama.cpp load of SmolLM2: forks of the first share its one context."""
    from marginalia.models import load_generator

    return load_generator("smollm2", backend="llamacpp")


@pytest.mark.slow
def test_real_smollm2_reuses_its_cache_and_swaps_memory_in(smollm2_llamacpp: Any, second_smollm2: Any) -> None:
    from marginalia.compose.client import common_prefix

    gen = smollm2_llamacpp.fork(keep_cache=False)
    assert forks_share_cache(gen)
    with pytest.raises(UserError, match="load the model a second time"):
        CompletionClient(gen)
    standby = second_smollm2.fork(keep_cache=False)
    fetched: list[MemoryRequest] = []

    def fetch(r: MemoryRequest) -> list[MemoryItem]:
        fetched.append(r)
        return [item("The ferry to Lindholm leaves Ostervik harbour at seven every morning.", "harbour")]

    client = CompletionClient(gen, standby=standby, suggestion_tokens=8)
    composer = Composer(client, fetch, threshold=6, memory_size=3)
    text = "Every morning in Ostervik, the harbour"
    first = composer.suggest(text)
    assert first.text.strip() and first.generated_tokens <= 8 and first.memory_version == 0
    assert composer.wait_idle(60) and len(fetched) == 1 and fetched[0].query == text
    before = client.encode(text)
    text += " fills with boats"
    after = client.encode(text)
    typed = composer.suggest(text)  # the first completion after memory was prepared swaps it in
    assert typed.memory_version == 1 and typed.text.strip()
    # the standby had caught up with the text it saw; only the words typed since were prefilled
    assert typed.prefilled_tokens == len(after) - common_prefix(before, after)
    more = client.encode(text + " and")
    again = composer.suggest(text + " and")
    assert again.prefilled_tokens == len(more) - common_prefix(after, more)
    assert any(e.kind == "memory_swapped" for e in composer.events)
    composer.close()


def test_background_threads_run_in_the_idle_class_and_nicer_than_the_caller() -> None:
    import os
    import sys

    from marginalia.compose.threads import BACKGROUND_NICE, start_background

    if not sys.platform.startswith("linux"):
        pytest.skip("threads have scheduling classes and nice values of their own on Linux")
    seen: list[tuple[int, int]] = []

    def probe() -> None:  # and a background thread started by a background thread
        tid = threading.get_native_id()
        seen.append((os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)))
        if len(seen) == 1:
            start_background(probe, "probe-2").join(5)

    start_background(probe, "probe").join(5)
    main = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert seen == [(os.SCHED_IDLE, min(19, main + BACKGROUND_NICE))] * 2
    assert os.sched_getscheduler(threading.get_native_id()) != os.SCHED_IDLE  # the caller's class is its own


def test_a_closed_composer_is_joined_once_its_memory_request_returns() -> None:
    gate, asked = threading.Event(), threading.Event()

    def fetch(r: MemoryRequest) -> list[MemoryItem]:
        asked.set()
        assert gate.wait(5)
        return [item("The ferry sails twice a day.")]

    composer = Composer(CompletionClient(ScriptedGenerator(default=" on"), suggestion_tokens=2), fetch,
                        threshold=1, memory_size=2)
    composer.edit("The ferry")
    assert asked.wait(5)
    composer.close()
    assert not composer.join(0)  # the request in flight still uses the memory model
    gate.set()
    assert composer.join(5)  # it returned, and nothing else runs: the models are free


class Held(ScriptedGenerator):
    """Writes its first ``at`` tokens, then waits for ``release`` before the rest (a suggestion in progress)."""

    def __init__(self, *args: Any, at: int = 1, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.at = at
        self.writing = threading.Event()
        self.release = threading.Event()

    def _sample_tokens(self, params: GenerationParams) -> Iterator[int]:
        for i, token in enumerate(super()._sample_tokens(params)):
            if i == self.at:
                self.writing.set()
                assert self.release.wait(5)
            yield token


@pytest.mark.parametrize("give_way", [True, False])
def test_the_memory_model_waits_while_a_suggestion_is_written(give_way: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import marginalia.compose.client as client_module

    monkeypatch.setattr(client_module, "YIELD_AT_MOST", 30.0)  # no time limit on giving way in this test
    memory_model = ScriptedGenerator(default="The ferry sails twice a day from the old harbour.")
    gen = Held(default=" sails at dawn every day")
    client = CompletionClient(gen, suggestion_tokens=5)
    stepping, stepped_while_written = threading.Event(), []
    give_way_now = client.give_way

    def watched() -> None:  # what the memory model calls before each of its steps
        stepping.set()
        give_way_now()
        stepped_while_written.append(not gen.release.is_set())

    client.give_way = watched  # type: ignore[method-assign]
    composer = Composer(client, TakeawayMemory(FakeCollection(), memory_model, hits=1, exclude={"draft.md"}),
                        threshold=4, memory_size=3, give_way=give_way)
    completion = composer.client.complete("The ferry to Lindholm")
    reader = threading.Thread(target=completion.text)
    reader.start()
    assert gen.writing.wait(5)  # the suggestion is being written: its model holds the foreground
    composer.coordinator.observe("The ferry to Lindholm", composer.client.encode("The ferry to Lindholm"))
    if give_way:
        assert stepping.wait(5)  # the memory model is at its first step (its prompt's prefill) ...
        assert memory_model.requests == []
    else:  # it went on beside the suggestion, and finished
        assert composer.coordinator.wait_idle(5) and len(memory_model.requests) == 1
    gen.release.set()
    reader.join(5)
    assert composer.wait_idle(5)
    assert len(memory_model.requests) == 1
    # ... and no step of the memory model's (nor of the memory's preparation) ran while the suggestion was written
    assert not any(stepped_while_written) and (stepped_while_written or not give_way)
    assert [i.text for i in composer.memory] == ["The ferry sails twice a day from the old harbour."]
    composer.close()


def test_memory_is_prepared_in_small_slices_that_each_give_way() -> None:
    gen = ScriptedGenerator(default=" sails at dawn")
    standby = gen.fork(keep_cache=False)
    slices: list[int] = []
    prefill = standby.prefill

    def recorded(ids: Sequence[int]) -> None:
        slices.append(len(ids))
        prefill(ids)

    standby.prefill = recorded  # type: ignore[method-assign]
    client = CompletionClient(gen, standby=standby, suggestion_tokens=3, background_step=4)
    gave_way: list[int] = []
    give_way = client.give_way
    client.give_way = lambda: (gave_way.append(1), give_way())[1]  # type: ignore[method-assign]
    client.complete("The ferry to Lindholm").text()
    client.set_memory([item("The ferry sails twice a day from the old harbour in summer.")], 1)
    assert client.wait_prepared(5)
    assert len(slices) > 3 and max(slices) <= 4 and len(gave_way) == len(slices)
    client.close()

