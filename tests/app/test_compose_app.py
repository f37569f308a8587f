"""`app.compose` over a real (LanceDB) collection, its refusals, and the `marginalia compose` command."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest

from marginalia import app
from marginalia.cli import build_parser, main
from marginalia.errors import UserError
from marginalia.index.embedders import HashingEmbedder
from marginalia.models.base import GenerationParams, Generator
from marginalia.models.fake import Request, ScriptedGenerator
from marginalia.options import ComposeOptions

pytest.importorskip("lancedb")
pytest.importorskip("rapidfuzz")

FILES = {
    "harbour.md": "# Harbour\n\nThe harbour of Ostervik opens at dawn. Fishing boats leave before the ferry.\n\n"
                  "## Ferry\n\nThe ferry to Lindholm sails twice a day in summer.\n",
    "market.md": "# Market\n\nTraders at the Ostervik market sell wool and honey. The market closes at noon.\n",
    "draft.md": "# Notes on Ostervik\n\nThe harbour of Ostervik opens at dawn, and the ferry to Lindholm sails "
                "twice a day in summer.\n",
}


def index(home: Path, folder: Path, names: list[str], collection: str = "town") -> list[str]:
    folder.mkdir(exist_ok=True)
    paths = []
    for name in names:
        (folder / name).write_text(FILES[name])
        paths.append(str(folder / name))
    app.index_paths(paths, collection, count_tokens=lambda t: len(t.split()), home=home, embedder=HashingEmbedder())
    return paths


@pytest.fixture
def town(hermetic: Path, tmp_path: Path) -> tuple[Any, list[str]]:
    paths = index(hermetic, tmp_path / "docs", list(FILES))
    from marginalia.index.store import Collection

    return Collection.open("town", home=hermetic, embedder=HashingEmbedder()), paths


def spy(store: Any) -> list[Any]:
    """Record every hit the collection's search returns."""
    returned: list[Any] = []
    search = store.search

    def recording(*args: Any, **kwargs: Any) -> Any:
        hits = search(*args, **kwargs)
        returned.extend(hits)
        return hits

    store.search = recording
    return returned


def copy_a_sentence(req: Request) -> str:
    """A memory model's margin: the read sentence about the ferry, once read; else NONE."""
    if "Question:" in req.suffix and "sails twice a day in summer." in req.prefix:
        return "The ferry to Lindholm sails twice a day in summer."
    return "NONE"


@pytest.mark.parametrize("mode", ["takeaways", "margins"])
def test_memory_never_comes_from_the_document_being_written(town: tuple[Any, list[str]], mode: str) -> None:
    store, paths = town
    draft = next(p for p in paths if p.endswith("draft.md"))
    returned = spy(store)
    memory_model = ScriptedGenerator(copy_a_sentence if mode == "margins" else None,
                                     default="Boats leave the harbour of Ostervik at dawn.")
    composer = app.compose(store, ComposeOptions(threshold=4, memory_mode=mode, min_similarity=-1.0),
                           generator=ScriptedGenerator(default=" at dawn"), memory_generator=memory_model,
                           exclude=[draft])
    with composer:
        composer.edit("The harbour of Ostervik opens at dawn, and the ferry to Lindholm sails twice a day")
        assert composer.wait_idle(10)
        memory = composer.memory
    # the draft was indexed as a file alone: it is known by its file name, and excluded by its path
    assert any(h.source == "draft.md" for h in returned)  # the search found the draft...
    assert memory and all(i.source != "draft.md" for i in memory)  # ...and memory never came from it
    if mode == "margins":
        for i in memory:
            assert i.kind == "margin" and i.text == store.document(i.doc_id).text[i.start:i.end]
        assert [i.text for i in memory] == ["The ferry to Lindholm sails twice a day in summer."]
        assert memory[0].section_path == ("Harbour", "Ferry")


def test_an_empty_collection_is_refused(hermetic: Path) -> None:
    from marginalia.index.store import Collection

    Collection.open("empty", home=hermetic, create=True, embedder=HashingEmbedder())
    with pytest.raises(UserError, match="holds no documents"):
        app.compose("empty", generator=ScriptedGenerator(), memory_generator=ScriptedGenerator(), home=hermetic)


def test_a_collection_of_only_the_draft_is_refused(hermetic: Path, tmp_path: Path) -> None:
    (path,) = index(hermetic, tmp_path / "docs", ["draft.md"], collection="mine")
    with pytest.raises(UserError, match="only the document being written"):
        app.compose("mine", generator=ScriptedGenerator(), memory_generator=ScriptedGenerator(), home=hermetic,
                    exclude=[path])


def test_models_that_cannot_serve_are_refused(town: tuple[Any, list[str]]) -> None:
    store, _ = town
    with pytest.raises(UserError, match=r"the memory model \(nosuchmodel\) could not be loaded: unknown model spec"):
        app.compose(store, ComposeOptions(memory_model="nosuchmodel"), generator=ScriptedGenerator())

    class Plain(Generator):
        tokenizer = ScriptedGenerator().tokenizer  # type: ignore[assignment]

        def render_chat(self, messages: Any, add_generation_prompt: bool = True) -> str:
            return ""

        def stream_prompt(self, prompt_ids: Any, params: GenerationParams) -> Any:
            yield ""

    with pytest.raises(UserError, match="KV cache"):
        app.compose(store, generator=Plain(), memory_generator=ScriptedGenerator())
    gen = ScriptedGenerator()
    with pytest.raises(UserError, match="of its own"):
        app.compose(store, generator=gen, memory_generator=gen)
    with pytest.raises(UserError, match="KV cache"):  # margins: WiM needs the memory model's cache
        app.compose(store, ComposeOptions(memory_mode="margins"), generator=ScriptedGenerator(),
                    memory_generator=Plain())


def test_the_memory_model_is_loaded_by_its_spec(town: tuple[Any, list[str]]) -> None:
    store, _ = town
    loaded: list[str] = []

    def loader(spec: str) -> Generator:
        loaded.append(spec)
        return ScriptedGenerator(name=spec)

    composer = app.compose(store, ComposeOptions(memory_model="scripted:note"), generator=ScriptedGenerator(),
                           loader=loader)
    composer.close()
    composer = app.compose(store, generator=ScriptedGenerator(name="client-spec"), loader=loader)
    composer.close()
    assert loaded == ["scripted:note", "client-spec"]  # the client's spec when none is given


def test_the_loop_guard_defaults_to_what_the_client_model_can_enforce(town: tuple[Any, list[str]]) -> None:
    from marginalia.options import NO_REPEAT_NGRAM

    store, _ = town
    masking, server = ScriptedGenerator(), ScriptedGenerator()
    server.supports_copy = False  # as an openai: client, which cannot mask tokens

    def guard(options: ComposeOptions, generator: ScriptedGenerator) -> int:
        composer = app.compose(store, options, generator=generator, memory_generator=ScriptedGenerator())
        composer.close()
        return composer.client.params.no_repeat_ngram

    assert guard(ComposeOptions(), masking) == NO_REPEAT_NGRAM > 0
    assert guard(ComposeOptions(), server) == 0
    assert guard(ComposeOptions(no_repeat_ngram=0), masking) == 0
    assert guard(ComposeOptions(no_repeat_ngram=5), masking) == 5
    loaded: list[str] = []
    with pytest.raises(UserError, match="no run of tokens twice"):  # refused before the memory model loads
        app.compose(store, ComposeOptions(no_repeat_ngram=3), generator=server,
                    loader=lambda spec: loaded.append(spec) or ScriptedGenerator())
    assert loaded == []


def test_a_composer_notes_an_openmp_runtime_loaded_too_early(town: tuple[Any, list[str]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from marginalia import openmp

    store, _ = town
    notices = []
    for state in ("set", "late"):
        monkeypatch.setattr(openmp, "state", state)
        composer = app.compose(store, generator=ScriptedGenerator(), memory_generator=ScriptedGenerator())
        composer.close()
        notices.append(composer.notices)
    assert notices[0] == []
    assert len(notices[1]) == 1 and "OMP_WAIT_POLICY" in notices[1][0]


# -- the command -----------------------------------------------------------------------------------------


def test_every_compose_default_is_the_records() -> None:
    args = build_parser().parse_args(["compose", "--collection", "c"])
    for name, info in ComposeOptions.model_fields.items():
        assert getattr(args, name) == info.default, name


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_the_command_refuses_what_it_cannot_use(hermetic: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from marginalia.index.store import Collection

    code, _, err = run_cli("compose", "--collection", "nowhere", "--model", "scripted:x")
    assert code == 2 and "no collection named 'nowhere'" in err
    Collection.open("empty", home=hermetic, create=True, embedder=HashingEmbedder())
    code, _, err = run_cli("compose", "--collection", "empty", "--model", "scripted:x")
    assert code == 2 and "holds no documents" in err
    with pytest.raises(SystemExit) as exited:
        run_cli("compose", "--collection", "empty", "--threshold", "0")
    assert exited.value.code == 2 and "--threshold: must be above 0" in capsys.readouterr().err


def test_the_editor_shows_a_suggestion_that_tab_accepts(town: tuple[Any, list[str]], monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    sessions: list[Any] = []
    made = PromptSession.__init__
    changed = threading.Condition()  # the editor's buffer changed (its text or its suggestion)

    def notify(*_: Any) -> None:
        with changed:
            changed.notify_all()

    def capture(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        self.default_buffer.on_text_changed += notify
        self.default_buffer.on_suggestion_set += notify
        sessions.append(self)
        notify()

    monkeypatch.setattr(PromptSession, "__init__", capture)

    def wait_for(condition: Any) -> None:
        with changed:
            assert changed.wait_for(condition, timeout=20), "timed out"

    output = tmp_path / "written.md"
    with create_pipe_input() as keys, create_app_session(input=keys, output=DummyOutput()):
        def type_and_accept() -> None:
            wait_for(lambda: sessions)
            buffer = sessions[0].default_buffer
            keys.send_text("The ferry to Lindholm")
            wait_for(lambda: buffer.text == "The ferry to Lindholm" and buffer.suggestion is not None)
            keys.send_text("\t")
            wait_for(lambda: buffer.text.endswith("sails twice"))
            keys.send_text("\x1b\r")  # Esc, Enter: done

        typist = threading.Thread(target=type_and_accept, daemon=True)
        typist.start()
        code, out, err = run_cli("compose", "--collection", "town", "--model", "scripted: sails twice",
                                 "--memory-model", "scripted:NONE", "--debounce", "0", "--suggestion-tokens", "4",
                                 "-o", str(output))
        typist.join(5)
    assert code == 0, err
    assert out == "The ferry to Lindholm sails twice\n"
    assert output.read_text() == "The ferry to Lindholm sails twice"
