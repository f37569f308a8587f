"""Tuning the composition client: examples labelled by a larger model (the scripted fake) on the client's own
prompt, resumable; LoRA on the tiny random Llama, the loss on label tokens only; the merged model loads by
spec; `marginalia tune data|train`."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marginalia import app
from marginalia.cli import main
from marginalia.errors import MissingDependency, UserError
from marginalia.ingest.base import content_id
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.options import TuneDataOptions, TuneOptions
from marginalia.records import Document

pytest.importorskip("rapidfuzz")

from marginalia.compose import CompletionClient, MemoryItem  # noqa: E402
from marginalia.compose.prompt import ClientPrompt  # noqa: E402
from marginalia.compose.tuning import (  # noqa: E402
    IGNORE_LABEL,
    TuningExample,
    collate,
    cut_text,
    label_loss,
    make_examples,
    read_examples,
    relabel_examples,
    split_held_out,
    training_row,
    tune,
)
from marginalia.compose.tuning.data import SCHEMA  # noqa: E402

WORDS = ("the harbour opens at dawn and the ferry sails to Lindholm twice a day while traders sell wool "
         "honey and rye bread in the square before the rain").split()


def text_of(n: int, shift: int = 0, title: str = "Notes") -> str:
    body = " ".join(WORDS[(i + shift) % len(WORDS)] for i in range(n))
    return f"# {title}\n\n{body}.\n"


def doc(text: str, source: str) -> Document:
    return Document(source, text, content_id(text), "markdown")


def item(text: str) -> MemoryItem:
    return MemoryItem(text, "other.md", "id-other", ("Other",), 0, len(text), "takeaway")


class StaticMemory:
    """A memory generator stand-in: the same items for every request; records the exclusions it was given."""

    def __init__(self, items: tuple[MemoryItem, ...]) -> None:
        self.items = items
        self.excluded: list[frozenset[str]] = []
        self.requests: list[Any] = []

    def excluding(self, names: Any) -> StaticMemory:
        self.excluded.append(frozenset(names))
        return self

    def __call__(self, request: Any) -> list[MemoryItem]:
        self.requests.append(request)
        return list(self.items)


# -- cutting texts ---------------------------------------------------------------------------------------


def test_cuts_end_at_word_ends_outside_headings_and_are_followed_by_the_text() -> None:
    text = text_of(60, title="A heading of several words")
    cuts = cut_text(text, cuts=4, min_words=3, max_words=100, reference_words=5)  # a window wider than the text
    assert len(cuts) == 4
    assert [c.offset for c in cuts] == sorted({c.offset for c in cuts})
    for cut in cuts:
        assert cut.context == text[:cut.offset]
        assert text.startswith(cut.context + cut.reference)
        assert not cut.context[-1].isspace() and (text[cut.offset].isspace() or text[cut.offset] == ".")
        assert "\n\n" in cut.context  # never inside the heading line
        assert len(cut.reference.split()) == 5
        assert 3 <= len(cut.context.split()) <= 100
    assert cut_text(text_of(5), cuts=4, min_words=3, max_words=50, reference_words=5) == []


def test_cuts_spread_over_the_whole_text_and_keep_its_title_and_last_words() -> None:
    text = text_of(400, title="The title")
    cuts = cut_text(text, cuts=5, min_words=10, max_words=30, reference_words=5)
    offsets = [c.offset for c in cuts]
    assert offsets[0] < len(text) * 0.1 and offsets[-1] > len(text) * 0.9  # from the opening to the end
    for cut in cuts[1:]:
        title, _, window = cut.context.partition("\n\n")
        assert title == "# The title"
        assert text[:cut.offset].endswith(window) and len(window.split()) == 30
        assert text.startswith(text[:cut.offset] + cut.reference)
    assert cuts[0].context == text[:cuts[0].offset]  # within the first 30 words: the text itself
    late = cut_text(text, cuts=3, min_words=50, max_words=20, reference_words=5)  # after 50 words, 20 in view
    assert TuneDataOptions(min_words=50, max_words=20).max_words == 20
    assert all(c.offset > len(" ".join(text.split()[:50])) and len(c.context.split()) == 20 + 3 for c in late)
    untitled = text.split("\n\n", 1)[1]
    assert all(len(c.context.split()) <= 30
               for c in cut_text(untitled, cuts=5, min_words=10, max_words=30, reference_words=5))


# -- making examples -------------------------------------------------------------------------------------


def test_labels_come_from_the_larger_model_on_the_clients_own_prompt(tmp_path: Path) -> None:
    larger = ScriptedGenerator(respond=lambda r: " the next words\nand more")
    memory = StaticMemory((item("Boats leave the harbour at dawn."), item("The ferry sails twice a day.")))
    docs = [doc(text_of(80), "a.md"), doc(text_of(70, shift=3), "b.md")]
    options = TuneDataOptions(cuts=3, min_words=10, max_words=60, label_tokens=12, reference_words=6)
    report = make_examples(docs, larger, tmp_path / "ex.jsonl", options, memory=memory)  # type: ignore[arg-type]
    examples = read_examples(tmp_path / "ex.jsonl")
    assert report.written == len(examples) == 6 and report.kept == 0
    # the larger model's continuation, ended after its line break
    assert {e.label for e in examples} == {" the next words\n"}
    assert all(e.label_model == "scripted" and e.label_tokens == 12 for e in examples)
    # each document is excluded from its own memory
    assert memory.excluded == [frozenset({d.doc_id, d.source}) for d in docs]
    assert [r.query for r in memory.requests] == [e.context for e in examples]
    assert [e.source for e in examples] == ["a.md", "b.md"] * 3  # the texts in turn
    # the prompt the larger model got is the one a completion client on it builds
    client = CompletionClient(larger.fork(keep_cache=False), suggestion_tokens=12)
    assert len(larger.requests) == len(examples)
    for request, example in zip(larger.requests, examples, strict=True):
        assert example.memory == memory.items
        expected = client.prompt_ids(client.encode(example.context), example.memory)
        assert list(request.prefix_ids + request.suffix_ids) == expected
        assert request.params.max_new_tokens == 12 and request.params.temperature == 0
        assert example.reference == docs[0 if example.source == "a.md" else 1].text[example.offset:][
            :len(example.reference)]
    capped = make_examples(docs, larger, tmp_path / "capped.jsonl", options, limit=4)
    assert capped.written == 4
    assert [e.source for e in read_examples(tmp_path / "capped.jsonl")] == ["a.md", "b.md"] * 2  # each its share


def test_making_examples_resumes_after_a_crash(tmp_path: Path) -> None:
    larger = ScriptedGenerator(default=" more")
    docs = [doc(text_of(80), "a.md"), doc(text_of(70, shift=2), "b.md")]
    options = TuneDataOptions(cuts=3, min_words=10, max_words=60)
    path = tmp_path / "ex.jsonl"
    first = make_examples(docs, larger, path, options, limit=2)
    assert first.written == 2 and len(larger.requests) == 2
    with path.open("a") as f:  # a kill in the middle of a line
        f.write('{"id": "cut sho')
    again = make_examples(docs, larger, path, options)
    assert again.kept == 2 and again.written == 4
    assert len(larger.requests) == 6  # the two already made were not labelled again
    examples = read_examples(path)
    assert len({e.id for e in examples}) == 6
    assert path.read_text().endswith("\n")
    assert make_examples(docs, larger, path, options).written == 0


def test_examples_refuse_other_settings_empty_input_and_short_texts(tmp_path: Path) -> None:
    path = tmp_path / "ex.jsonl"
    docs = [doc(text_of(80), "a.md")]
    make_examples(docs, ScriptedGenerator(default=" x"), path, TuneDataOptions(cuts=1))
    with pytest.raises(UserError, match="labelled by scripted with at most 15 tokens"):
        make_examples(docs, ScriptedGenerator(default=" x"), path, TuneDataOptions(cuts=1, label_tokens=9))
    with pytest.raises(UserError, match="no texts"):
        make_examples([], ScriptedGenerator(), tmp_path / "other.jsonl")
    with pytest.raises(UserError, match="long enough"):
        make_examples([doc(text_of(8), "s.md")], ScriptedGenerator(), tmp_path / "other.jsonl")
    with pytest.raises(UserError, match="make it with 'marginalia tune data'"):
        read_examples(tmp_path / "missing.jsonl")
    example = read_examples(path)[0]
    assert TuningExample.from_dict(json.loads(json.dumps(example.to_dict()))) == example
    with pytest.raises(UserError, match="schema"):
        TuningExample.from_dict({**example.to_dict(), "schema": 99})


def test_an_older_examples_takeaways_that_say_nothing_are_not_tuned_with() -> None:
    def item(text: str, kind: str) -> dict[str, object]:
        return {"text": text, "source": "b.md", "doc_id": "b", "section_path": [], "start": 0, "end": 9,
                "kind": kind}

    line = {"id": "a:1", "source": "a.md", "doc_id": "a", "offset": 1, "context": "The ferry", "label": " sails",
            "reference": " sails", "label_model": "scripted", "label_tokens": 15, "seconds": 1.0, "schema": SCHEMA,
            "memory": [item("The passage does not mention anything that helps.", "takeaway"),
                       item("The ferry sails twice a day.", "takeaway"),
                       item("The passage does not mention the ferry.", "margin")]}  # a margin is a copied span
    example = TuningExample.from_dict(line)
    assert [m.text for m in example.memory] == ["The ferry sails twice a day.",
                                                 "The passage does not mention the ferry."]


def test_relabelling_keeps_prefixes_and_memory_and_resumes(tmp_path: Path) -> None:
    memory = StaticMemory((item("Boats leave the harbour at dawn."),))
    docs = [doc(text_of(80), "a.md"), doc(text_of(70, shift=3), "b.md")]
    short = TuneDataOptions(cuts=2, min_words=10, max_words=60, label_tokens=6, reference_words=6)
    make_examples(docs, ScriptedGenerator(default=" short"), tmp_path / "ex6.jsonl", short,
                  memory=memory)  # type: ignore[arg-type]
    first = read_examples(tmp_path / "ex6.jsonl")
    longer = ScriptedGenerator(respond=lambda r: " a longer label\nnot this")
    with pytest.raises(UserError, match="the file to relabel"):
        relabel_examples(tmp_path / "ex6.jsonl", longer, tmp_path / "ex6.jsonl", 12)
    report = relabel_examples(tmp_path / "ex6.jsonl", longer, tmp_path / "ex12.jsonl", 12, limit=3)
    assert report.written == 3 and report.kept == 0
    again = relabel_examples(tmp_path / "ex6.jsonl", longer, tmp_path / "ex12.jsonl", 12)
    assert again.written == 1 and again.kept == 3
    relabelled = read_examples(tmp_path / "ex12.jsonl")
    assert [(e.id, e.context, e.memory, e.reference) for e in relabelled] == \
        [(e.id, e.context, e.memory, e.reference) for e in first]
    assert {(e.label, e.label_tokens) for e in relabelled} == {(" a longer label\n", 12)}
    assert len(memory.requests) == len(first)  # nothing retrieved again
    assert [r.params.max_new_tokens for r in longer.requests] == [12] * len(first)
    # the relabelled file is extended by make_examples with the same label model and length
    more = make_examples(docs, longer, tmp_path / "ex12.jsonl",
                         short.model_copy(update={"cuts": 3, "label_tokens": 12}))
    assert more.kept == len(first) and more.written >= 1
    extended = read_examples(tmp_path / "ex12.jsonl")
    assert len(extended) == len(first) + more.written and len({e.id for e in extended}) == len(extended)
    with pytest.raises(UserError, match="labelled by scripted with at most 12 tokens"):
        relabel_examples(tmp_path / "ex6.jsonl", longer, tmp_path / "ex12.jsonl", 20)


def test_labels_can_be_written_under_a_loop_guard(tmp_path: Path) -> None:
    docs = [doc(text_of(80), "a.md")]
    guarded = TuneDataOptions(cuts=2, min_words=10, max_words=60, label_tokens=6, reference_words=6, label_guard=4)
    gen = ScriptedGenerator(default=" next")
    make_examples(docs, gen, tmp_path / "g4.jsonl", guarded)
    assert {r.params.no_repeat_ngram for r in gen.requests} == {4}
    assert {e.label_guard for e in read_examples(tmp_path / "g4.jsonl")} == {4}
    # a file is labelled one way: plain greedy labels are not added to guarded ones, nor the other way round
    with pytest.raises(UserError, match="with at most 6 tokens, no run of 4 tokens twice; give another file"):
        make_examples(docs, gen, tmp_path / "g4.jsonl", guarded.model_copy(update={"label_guard": 0}))
    plain = ScriptedGenerator(default=" next")
    make_examples(docs, plain, tmp_path / "g0.jsonl", guarded.model_copy(update={"label_guard": 0}))
    assert {r.params.no_repeat_ngram for r in plain.requests} == {0}
    with pytest.raises(UserError, match="plain greedy; give another file"):
        relabel_examples(tmp_path / "g4.jsonl", gen, tmp_path / "g0.jsonl", 6, label_guard=3)
    report = relabel_examples(tmp_path / "g0.jsonl", gen, tmp_path / "g3.jsonl", 6, label_guard=3)
    assert report.written == 2 and gen.requests[-1].params.no_repeat_ngram == 3
    assert {e.label_guard for e in read_examples(tmp_path / "g3.jsonl")} == {3}
    server = ScriptedGenerator(default=" next")
    server.supports_copy = False  # as a server backend: it cannot mask tokens, so nothing is labelled
    with pytest.raises(UserError, match="no run of tokens twice"):
        make_examples(docs, server, tmp_path / "server.jsonl", guarded)
    with pytest.raises(UserError, match="no run of tokens twice"):
        relabel_examples(tmp_path / "g0.jsonl", server, tmp_path / "server.jsonl", 6, label_guard=3)
    assert not server.requests and not (tmp_path / "server.jsonl").exists()
    # examples written before the guard existed read as plain greedy
    line = json.loads((tmp_path / "g0.jsonl").read_text().splitlines()[0])
    del line["label_guard"]
    assert TuningExample.from_dict(line).label_guard == 0


def test_app_tuning_data_draws_memory_from_a_collection_never_from_the_text(hermetic: Path, tmp_path: Path) -> None:
    pytest.importorskip("lancedb")
    from marginalia.index.embedders import HashingEmbedder

    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.md").write_text(text_of(90))
    (folder / "b.md").write_text(text_of(90, shift=5, title="Ferry"))
    app.index_paths([folder], "corpus", count_tokens=lambda t: len(t.split()), home=hermetic,
                    embedder=HashingEmbedder())
    seen: list[str] = []

    def respond(r: Request) -> str:
        seen.append(r.prompt)
        return "The ferry sails to Lindholm." if "fact" in r.prompt else " onwards"

    larger = ScriptedGenerator(respond=respond)
    options = TuneDataOptions(cuts=2, min_words=10, max_words=60)
    report = app.tuning_data([folder / "a.md"], tmp_path / "ex.jsonl", options, label_model=larger,
                             collection="corpus", home=hermetic)
    examples = read_examples(tmp_path / "ex.jsonl")
    assert report.written == 2 and report.documents == 1
    assert all(e.memory for e in examples)
    assert {m.source for e in examples for m in e.memory} == {"texts/b.md"}  # named from the folder indexed down
    assert all(e.label == " onwards" for e in examples)
    with pytest.raises(UserError, match="no file or folder"):
        app.tuning_data([tmp_path / "nope"], tmp_path / "x.jsonl", label_model=larger)


# -- training rows ---------------------------------------------------------------------------------------


def example(context: str, label: str, source: str = "a.md", memory: tuple[MemoryItem, ...] = ()) -> TuningExample:
    return TuningExample(f"{source}:{len(context)}", source, content_id(source), len(context), context, memory, label,
                         "", "scripted", 15)


def test_the_loss_mask_covers_only_the_label_tokens(tiny: Any) -> None:
    torch = pytest.importorskip("torch")
    memory = (item("Fact 17: the value is 1717."),)
    prompt = ClientPrompt(tiny, suggestion_tokens=8)
    ex = example("The harbour opens at", " dawn and", memory=memory)
    row = training_row(prompt, ex)
    assert row is not None
    client = CompletionClient(tiny.fork(keep_cache=False))
    prompt_ids = client.prompt_ids(client.encode(ex.context), memory)
    label_ids = tiny.tokenizer.encode(" dawn and")
    assert list(row.input_ids) == prompt_ids + label_ids
    assert list(row.labels) == [IGNORE_LABEL] * len(prompt_ids) + label_ids
    assert training_row(prompt, example("The harbour", "  ")) is None
    short = training_row(prompt, example("Rain", " fell"))
    assert short is not None
    ids, mask, labels = collate([row, short], pad_id=0, torch=torch)
    assert ids.shape == mask.shape == labels.shape == (2, len(row.input_ids))
    n = len(short.input_ids)
    assert mask[1, :n].tolist() == [1] * n and mask[1, n:].tolist() == [0] * (len(row.input_ids) - n)
    assert labels[1, n:].tolist() == [IGNORE_LABEL] * (len(row.input_ids) - n)
    trained_on = (labels != IGNORE_LABEL).sum().item()
    assert trained_on == len(label_ids) + len(tiny.tokenizer.encode(" fell"))


def test_whole_texts_are_held_out() -> None:
    examples = [example(f"text {i}", " x", source=f"{s}.md") for s in "abcdefghij" for i in range(3)]
    train, held = split_held_out(examples, 0.2, seed=1)
    assert len({e.source for e in held}) == 2 and len(held) == 6
    assert not {e.source for e in train} & {e.source for e in held}
    assert split_held_out(examples, 0.2, seed=1) == (train, held)
    assert split_held_out(examples, 0.0)[1] == []
    assert split_held_out(examples[:3], 0.5)[1] == []  # one text: nothing to hold out


# -- LoRA ------------------------------------------------------------------------------------------------


def tiny_examples() -> list[TuningExample]:
    memory = (item("Fact 17: the value is 1717."),)
    out = []
    for i, (context, label) in enumerate([("The harbour opens at", " dawn and closes at dusk."),
                                          ("Rain fell on the market", " square all week."),
                                          ("Ships, carts and bicycles", " crowd the bridge."),
                                          ("What is the answer? The answer", " is written in the margin.")]):
        out.append(example(context, label, source=f"t{i % 2}.md", memory=memory if i % 2 else ()))
    return out


def test_two_steps_train_the_adapters_and_the_merged_model_loads_by_spec(tiny: Any, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    from marginalia.models import load_generator

    before = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    steps: list[tuple[int, int, float]] = []
    options = TuneOptions(rank=4, alpha=8, steps=2, learning_rate=5e-3, batch_size=2, held_out=0.5)
    report = tune(tiny_examples(), tiny, tmp_path / "tuned", options, on_step=lambda *s: steps.append(s))
    assert [s[:2] for s in steps] == [(1, 2), (2, 2)]
    assert report.losses == tuple(s[2] for s in steps) and len(report.losses) == 2
    assert report.train_examples == 2 and report.held_out_examples == 2
    assert report.held_out_before is not None and report.held_out_after is not None
    assert report.held_out_after != report.held_out_before
    # the caller's model is untouched: training ran on a copy
    assert all(torch.equal(before[k], v) for k, v in tiny.model.state_dict().items())
    adapter = load_file(tmp_path / "tuned" / "adapter" / "adapter_model.safetensors")
    b = [v for k, v in adapter.items() if "lora_B" in k]
    assert b and all(v.abs().sum() > 0 for v in b)  # LoRA's B starts at zero: two steps moved it
    assert report.spec == f"tuned:{tmp_path / 'tuned'}"
    assert not (tmp_path / 'tuned' / 'adapter.gguf').exists()  # an hf: base has no llama.cpp adapter
    record = json.loads((tmp_path / "tuned" / "tuning.json").read_text())
    assert record["losses"] == list(report.losses) and record["options"]["rank"] == 4

    tuned = load_generator(report.spec, device="cpu")
    merged = tuned.model.state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], before[q])
    assert torch.equal(merged["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    # the merged model is the tuned one: its held-out label loss is the one measured after training
    _, held = split_held_out(tiny_examples(), 0.5, options.seed)
    longest = max(len(tuned.tokenizer.encode(e.label)) for e in tiny_examples())
    prompt = ClientPrompt(tuned, suggestion_tokens=longest, window=min(options.max_tokens, tuned.context_window))
    rows = [r for e in held if (r := training_row(prompt, e)) is not None]
    assert label_loss(tuned.model, rows, 2, 0, torch) == pytest.approx(report.held_out_after, abs=1e-4)
    client = CompletionClient(tuned)  # a composition client, as any model
    completion = client.complete("The harbour opens at", max_new_tokens=3)
    completion.text()
    assert completion.result is not None and 1 <= completion.result.generated_tokens <= 3
    # tuning again into the same folder replaces it
    again = tune(tiny_examples(), tiny, tmp_path / "tuned", options.model_copy(update={"steps": 1}))
    assert json.loads((tmp_path / "tuned" / "tuning.json").read_text())["steps"] == again.steps == 1


def test_bf16_steps_when_asked_with_the_held_out_loss_still_in_fp32(tiny: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    def options(precision: str) -> TuneOptions:
        return TuneOptions(rank=4, alpha=8, steps=2, learning_rate=5e-3, batch_size=2, held_out=0.5,
                           precision=precision)

    said: list[str] = []
    fp32 = tune(tiny_examples(), tiny, tmp_path / "fp32", options("fp32"))
    bf16 = tune(tiny_examples(), tiny, tmp_path / "bf16", options("bf16"), log=said.append)
    assert json.loads((tmp_path / "bf16" / "tuning.json").read_text())["options"]["precision"] == "bf16"
    assert json.loads((tmp_path / "fp32" / "tuning.json").read_text())["options"]["precision"] == "fp32"
    assert any(line.startswith("training steps in bf16") for line in said)
    assert bf16.held_out_before == fp32.held_out_before  # measured in fp32 both times
    assert bf16.losses != fp32.losses  # the steps were computed in another format...
    assert bf16.losses == pytest.approx(fp32.losses, rel=0.05)  # ...to the same end


def test_auto_precision_takes_bf16_only_where_the_processor_has_it_and_no_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from marginalia.compose.tuning import train

    cpu = torch.device("cpu")
    for flags, expected in [({"avx2", "avx512f", "avx512_bf16"}, "bf16"),
                            ({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}, "fp32"),  # AMX may fault in a VM
                            ({"avx2", "avx512f"}, "fp32"), (set(), "fp32")]:
        monkeypatch.setattr(train, "_cpu_flags", lambda flags=flags: frozenset(flags))
        assert train.step_precision("auto", cpu, torch) == expected
        assert train.step_precision("fp32", cpu, torch) == "fp32"  # a choice is kept as given
        assert train.step_precision("bf16", cpu, torch) == "bf16"


def test_early_stopping_keeps_the_adapters_of_the_lowest_held_out_loss(
        tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from marginalia.compose.tuning import train
    from marginalia.models import load_generator

    real = train.label_loss
    calls: list[float] = []

    def spoiled_last_measurement(*args: Any) -> float:
        # call 0 is "before", calls 1-4 the measurements after steps 1-4, call 5 "after": the measurement
        # after step 4 is made to look worst, so an earlier step must be kept
        loss = real(*args)
        calls.append(loss)
        return loss + 10.0 if len(calls) == 5 else loss

    monkeypatch.setattr(train, "label_loss", spoiled_last_measurement)
    options = TuneOptions(rank=4, alpha=8, steps=4, eval_every=1, learning_rate=5e-3, batch_size=2, held_out=0.5)
    report = tune(tiny_examples(), tiny, tmp_path / "tuned", options)
    assert [step for step, _ in report.held_out_curve] == [1, 2, 3, 4]
    assert report.held_out_curve[-1][1] == pytest.approx(calls[4] + 10.0, abs=1e-3)
    measured = [loss for _, loss in report.held_out_curve[:3]]
    assert report.kept_step == 1 + measured.index(min(measured))
    # the saved model is the kept step's: its held-out loss is that step's measurement, not the last step's
    assert report.held_out_after == pytest.approx(calls[report.kept_step], abs=1e-4)
    assert report.held_out_after != pytest.approx(calls[4], abs=1e-6)
    monkeypatch.setattr(train, "label_loss", real)
    tuned = load_generator(report.spec, device="cpu")
    _, held = split_held_out(tiny_examples(), 0.5, options.seed)
    longest = max(len(tuned.tokenizer.encode(e.label)) for e in tiny_examples())
    prompt = ClientPrompt(tuned, suggestion_tokens=longest, window=min(options.max_tokens, tuned.context_window))
    rows = [r for e in held if (r := training_row(prompt, e)) is not None]
    assert real(tuned.model, rows, 2, 0, torch) == pytest.approx(report.held_out_after, abs=1e-4)
    record = json.loads((tmp_path / "tuned" / "tuning.json").read_text())
    assert record["kept_step"] == report.kept_step and len(record["held_out_curve"]) == 4
    # without eval_every the last step is kept and only before/after are measured
    plain = tune(tiny_examples(), tiny, tmp_path / "plain", options.model_copy(update={"eval_every": 0}))
    assert plain.kept_step == 4 and plain.held_out_curve == ()


class Stop(Exception):
    """A crash in the middle of a tuning."""


def stop_at(at: int) -> Callable[[int, int, float], None]:
    def on_step(step: int, steps: int, loss: float) -> None:
        if step == at:
            raise Stop(step)
    return on_step


def test_a_stopped_tuning_goes_on_from_its_checkpoint_and_ends_as_an_uninterrupted_one(
        tiny: Any, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    from marginalia.compose.tuning.checkpoint import checkpoint_path

    # one example a step over two: the example order is drawn again every second step; dropout draws from
    # torch's generator; the held-out loss picks a best step
    options = TuneOptions(rank=4, alpha=8, steps=6, learning_rate=5e-3, batch_size=1, held_out=0.5, dropout=0.2,
                          eval_every=2, checkpoint_every=2)
    straight = tune(tiny_examples(), tiny, tmp_path / "straight", options)
    assert not checkpoint_path(tmp_path / "straight").exists()  # removed once the model is saved

    with pytest.raises(Stop):
        tune(tiny_examples(), tiny, tmp_path / "resumed", options, on_step=stop_at(5))  # step 4 was saved
    assert checkpoint_path(tmp_path / "resumed").is_file() and not (tmp_path / "resumed").exists()
    lines: list[str] = []
    steps: list[int] = []
    resumed = tune(tiny_examples(), tiny, tmp_path / "resumed", options, on_step=lambda s, *_: steps.append(s),
                   log=lines.append)
    assert steps == [5, 6]
    assert any("resuming from the checkpoint at step 4 of 6" in line for line in lines)
    assert not any("held-out label loss before" in line for line in lines)  # kept, not measured again
    assert resumed.losses == straight.losses and len(resumed.losses) == 6
    assert resumed.held_out_curve == straight.held_out_curve and resumed.kept_step == straight.kept_step
    assert resumed.held_out_before == straight.held_out_before
    assert resumed.held_out_after == straight.held_out_after
    a = load_file(tmp_path / "straight" / "adapter" / "adapter_model.safetensors")
    b = load_file(tmp_path / "resumed" / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not checkpoint_path(tmp_path / "resumed").exists()


def test_a_checkpoint_of_other_settings_or_a_torn_one_is_not_resumed_and_more_steps_are(
        tiny: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from marginalia.compose.tuning.checkpoint import checkpoint_path

    options = TuneOptions(rank=4, alpha=8, steps=3, learning_rate=5e-3, batch_size=1, held_out=0.5,
                          checkpoint_every=1, schedule="constant")
    out = tmp_path / "tuned"
    saved = checkpoint_path(out)

    def again(opts: TuneOptions, **kwargs: Any) -> tuple[list[str], list[int]]:
        lines: list[str] = []
        steps: list[int] = []

        def on_step(step: int, total: int, loss: float) -> None:
            steps.append(step)
            if "stop" in kwargs and step == kwargs["stop"]:
                raise Stop(step)
        try:
            tune(tiny_examples(), tiny, out, opts, on_step=on_step, log=lines.append)
        except Stop:
            pass
        return lines, steps

    again(options, stop=2)
    assert saved.is_file()
    lines, steps = again(options.model_copy(update={"steps": 5}))  # more steps: the same tuning, extended
    assert steps == [3, 4, 5] and any("at step 2 of 5" in x for x in lines)
    assert not saved.exists()
    decaying = options.model_copy(update={"schedule": "linear"})
    again(decaying, stop=2)
    lines, steps = again(decaying.model_copy(update={"steps": 5}))  # a decay set by 3 steps is not extended
    assert steps == [1, 2, 3, 4, 5] and any("other examples, another client or other settings" in x for x in lines)
    again(options, stop=2)
    lines, steps = again(options.model_copy(update={"rank": 2}))  # other settings: from step 1
    assert steps == [1, 2, 3] and any("other examples, another client or other settings" in x for x in lines)
    again(options, stop=2)
    lines, steps = again(options.model_copy(update={"steps": 2}))  # fewer steps than were done: from step 1
    assert steps == [1, 2] and any("at step 2, not before step 2" in x for x in lines)
    saved.write_bytes(b"half a checkpoint")
    lines, steps = again(options)
    assert steps == [1, 2, 3] and any("unreadable checkpoint" in x for x in lines)
    assert not saved.exists()


def test_tuning_refuses_what_it_cannot_use(tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("peft")
    with pytest.raises(UserError, match="on transformers"):
        tune(tiny_examples(), ScriptedGenerator(), tmp_path / "t")
    with pytest.raises(UserError, match="no examples to train on"):
        tune([example("The harbour", " ")], tiny, tmp_path / "t")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a tuned model's folder"):
        tune(tiny_examples(), tiny, tmp_path / "busy")
    with pytest.raises(UserError, match="cannot put LoRA adapters"):
        tune(tiny_examples(), tiny, tmp_path / "t", TuneOptions(modules="no_such_proj", steps=1))
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(MissingDependency, match=r"marginalia\[tune\]"):
        tune(tiny_examples(), tiny, tmp_path / "t")


# -- the command -----------------------------------------------------------------------------------------


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def test_the_commands_make_data_and_a_tuned_model(tiny_parts: Any, hermetic: Path, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    model, tok = tiny_parts
    base = tmp_path / "tiny"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(3):
        (texts / f"t{i}.md").write_text(text_of(60, shift=i))
    data = tmp_path / "ex.jsonl"
    code, out, err = run("tune", "data", str(texts), "-o", str(data), "--label-model", "scripted: and so on",
                         "--cuts", "2", "--min-words", "10", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["written"] == 6 and summary["documents"] == 3
    assert {e.label for e in read_examples(data)} == {" and so on"}
    code, out, err = run("tune", "train", str(data), "--model", f"hf:{base}", "--steps", "2", "--batch-size", "2",
                         "--rank", "2", "--device", "cpu")
    assert code == 0, err
    spec = out.strip()
    assert spec == f"tuned:{hermetic / 'tuned' / 'ex'}"
    assert "held-out label loss" in err
    assert (hermetic / "tuned" / "ex" / "model" / "config.json").is_file()
    assert json.loads((hermetic / "tuned" / "ex" / "tuning.json").read_text())["base_model"] == f"hf:{base}"

    # Ctrl-C after a checkpoint: the command says the state is saved, and the same command goes on from it
    from marginalia.compose.tuning import checkpoint

    real_save = checkpoint.save

    def save_then_interrupt(*args: Any, **kwargs: Any) -> None:
        real_save(*args, **kwargs)
        raise KeyboardInterrupt

    train = ("tune", "train", str(data), "--model", f"hf:{base}", "--steps", "3", "--batch-size", "2",
             "--rank", "2", "--device", "cpu", "--checkpoint-every", "2", "-o", str(tmp_path / "again"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint, "save", save_then_interrupt)
        code, _, err = run(*train)
    assert code == 130 and "run the same command again to go on" in err
    code, out, err = run(*train)
    assert code == 0, err
    assert "resuming from the checkpoint at step 2 of 3" in err and out.strip() == f"tuned:{tmp_path / 'again'}"


def test_the_commands_say_what_is_wrong(hermetic: Path, tmp_path: Path) -> None:
    code, _, err = run("tune", "train", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no tuning data" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run("tune", "data", str(tmp_path / "empty"), "-o", str(tmp_path / "x.jsonl"),
                       "--label-model", "scripted:x")
    assert code == 2 and "no readable text" in err
    (tmp_path / "t.md").write_text(text_of(60))
    code, _, err = run("tune", "data", str(tmp_path / "t.md"), "-o", str(tmp_path / "x.jsonl"),
                       "--label-model", "gguf:/no/such/model.gguf")
    assert code == 2 and "no GGUF file" in err
    code, _, err = run("tune", "data", str(tmp_path / "t.md"), "-o", str(tmp_path / "x.jsonl"),
                       "--label-model", "scripted:x", "--min-words", "50", "--max-words", "10")
    assert code == 2 and "no text is long enough to cut" in err and "lower --min-words" in err
    make_examples([doc(text_of(60), "t.md")], ScriptedGenerator(default=" x"), tmp_path / "ok.jsonl")
    code, _, err = run("tune", "train", str(tmp_path / "ok.jsonl"), "--model", "gguf:/no/such/model.gguf")
    assert code == 2 and "no GGUF file" in err
    code, _, err = run("tune", "train", str(tmp_path / "ok.jsonl"), "--model", "scripted:x")
    assert code == 2 and "on transformers" in err
    with pytest.raises(SystemExit) as exit_:
        run("tune", "train", "x.jsonl", "--held-out", "1.5")
    assert exit_.value.code == 2


def test_the_learning_rate_rises_over_the_warmup_then_falls_to_zero_or_holds() -> None:
    from marginalia.compose.tuning.train import learning_rate

    linear = TuneOptions(steps=10, learning_rate=1.0, warmup_steps=1)
    rates = [learning_rate(step, linear) for step in range(1, 11)]
    assert rates[0] == 0.5 and rates[1] == 1.0  # half the peak in the warmup step, then the peak
    assert all(a > b for a, b in zip(rates[1:], rates[2:], strict=False)) and 0 < rates[-1] < 0.2
    cosine = linear.model_copy(update={"schedule": "cosine"})
    assert learning_rate(2, cosine) == 1.0 and learning_rate(6, cosine) < learning_rate(6, linear) + 0.1
    assert [learning_rate(s, linear.model_copy(update={"schedule": "constant"})) for s in (2, 10)] == [1.0, 1.0]
    assert learning_rate(1, TuneOptions(steps=1, learning_rate=1.0)) == 1.0  # one step, no warmup: the peak
