"""Composing in the terminal: ``marginalia compose --collection NAME``, an editor with ghost-text suggestions.

The text is edited with prompt_toolkit; a suggestion for the text so far appears in grey after the cursor
(Tab or → accepts it, Alt-F one word of it), and the bottom line says what the memory holds. Esc then
Enter (or Alt-Enter) ends; the text goes to stdout, and to ``--output`` when given.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from .. import app
from ..errors import MissingDependency, UserError
from ..files import atomic_write_text
from ..options import ComposeOptions
from .common import MODEL_NOTE, Formatter, Reporter, add_record_options, load_model, model_options, record_from_args
from .documents import collection_option

COMPOSE_INSTALL = "pip install 'marginalia[compose]'"
#: the compose options that say how memory is made, kept and refreshed (the rest are about suggestions)
MEMORY_FIELDS = ("memory_mode", "memory_model", "hits", "search", "min_similarity", "item_tokens", "memory_size",
                 "threshold", "memory_timeout", "give_way")
METAVARS = {"memory_model": "SPEC", "memory_timeout": "SECONDS", "debounce": "SECONDS", "min_similarity": "SIM"}


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add compose."""
    compose = sub.add_parser(
        "compose", parents=[common, model_options()], formatter_class=Formatter, usage="%(prog)s [options]",
        help="write with suggestions drawn from a collection",
        description="Edit a text in the terminal while --model suggests what comes next (ghost text: Tab or → "
                    "accepts). As the text grows, the memory model retrieves related chunks from the collection "
                    "and keeps a short memory of them that the suggestions use; it works in the background, "
                    "so typing never waits for it. Esc then Enter ends; the text goes to stdout.",
        epilog=MODEL_NOTE,
    )
    text = compose.add_argument_group("text")
    collection_option(text)
    text.add_argument("--text", metavar="FILE", help="start from this file's text (never retrieved as memory)")
    text.add_argument("--exclude", metavar="SOURCE", action="append", default=[],
                      help="a document never to draw memory from: its path, source or id (repeatable)")
    text.add_argument("-o", "--output", metavar="FILE", help="also write the text here when done")
    memory = compose.add_argument_group("memory")
    add_record_options(memory, ComposeOptions, fields=MEMORY_FIELDS, metavars=METAVARS)
    suggestions = compose.add_argument_group("suggestions")
    add_record_options(suggestions, ComposeOptions, skip=MEMORY_FIELDS, metavars=METAVARS)
    compose.set_defaults(handler=cmd_compose)


def cmd_compose(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    options: ComposeOptions = record_from_args(ComposeOptions, args)
    _prompt_toolkit()
    initial = ""
    if args.text:
        try:
            initial = Path(args.text).expanduser().read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {args.text}: {exc}") from exc
    store = app.open_collection(args.collection, home=args.home)
    exclude = [*args.exclude, *(p for p in (args.text, args.output) if p)]
    reporter = Reporter(False, err)
    generator = load_model(args, reporter)

    def loader(spec: str) -> Any:
        return app.load_model(spec, home=args.home, device=args.device, backend=args.backend, api_key=args.api_key)

    composer = app.compose(store, options, generator=generator, loader=loader, exclude=exclude)
    with composer:
        text = edit(composer, initial)
    for notice in composer.notices:
        reporter.log(f"memory: {notice}")
    if text is None:
        reporter.log("compose: stopped; nothing written")
        return 130
    out.write(text if text.endswith("\n") else text + "\n")
    if args.output:
        atomic_write_text(Path(args.output).expanduser(), text)
    return 0


def _prompt_toolkit() -> None:
    try:
        import prompt_toolkit  # noqa: F401
    except ImportError as exc:
        raise MissingDependency("prompt_toolkit (the compose editor)", COMPOSE_INSTALL) from exc


def edit(composer: Any, initial: str = "") -> str | None:
    """Run the editor until the writer ends (the text) or aborts with Ctrl-C (None)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.application import get_app
    from prompt_toolkit.auto_suggest import ThreadedAutoSuggest
    from prompt_toolkit.filters import Condition
    from prompt_toolkit.key_binding import KeyBindings

    bindings = KeyBindings()

    @Condition
    def has_suggestion() -> bool:
        buffer = get_app().current_buffer
        return bool(buffer.suggestion and buffer.suggestion.text and buffer.document.is_cursor_at_the_end)

    @bindings.add("tab", filter=has_suggestion)
    def _accept(event: Any) -> None:
        buffer = event.current_buffer
        buffer.insert_text(buffer.suggestion.text)

    session: Any = PromptSession(
        multiline=True, auto_suggest=ThreadedAutoSuggest(compose_suggest(composer)), key_bindings=bindings,
        bottom_toolbar=lambda: status_line(composer), refresh_interval=0.5, prompt_continuation="",
    )
    session.default_buffer.on_text_changed += lambda buffer: composer.edit(buffer.text)
    composer.edit(initial)
    try:
        text: str = session.prompt("", default=initial)
    except KeyboardInterrupt:
        return None
    except EOFError:
        return composer.text
    return text


def status_line(composer: Any) -> str:
    """The bottom line: the keys, and what the memory holds."""
    memory = composer.client.memory
    parts = ["Tab/→ accept", "Esc Enter: done"]
    refreshing = composer.coordinator.busy() or composer.client.preparing()
    parts.append(f"memory: {len(memory)} note{'s' if len(memory) != 1 else ''}"
                 + (" (refreshing)" if refreshing else ""))
    if composer.notices:
        parts.append(composer.notices[-1])
    return " · ".join(parts)


def compose_suggest(composer: Any) -> Any:
    """prompt_toolkit's auto-suggest over a composer: the suggestion for the text, when the cursor is at
    its end (a newer keystroke cancels one in progress, and prompt_toolkit asks again)."""
    from prompt_toolkit.auto_suggest import AutoSuggest, Suggestion

    class ComposeSuggest(AutoSuggest):
        def get_suggestion(self, buffer: Any, document: Any) -> Suggestion | None:
            if not document.is_cursor_at_the_end or not document.text.strip() or buffer.text != document.text:
                return None  # (typed on since: prompt_toolkit asks again for the newer text)
            result = composer.suggest(document.text)
            if result.cancelled or not result.text:
                return None
            return Suggestion(result.text)

    return ComposeSuggest()
