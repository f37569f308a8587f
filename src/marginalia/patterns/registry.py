"""The pattern registry: each way of reading is registered once, by name, with its options record, its class
and what the front ends need to know of it; the CLI's flags, the HTTP request bodies, the benchmark config's
pattern kinds and the web page's choices are all derived from it.

A built-in pattern's module holds its registration (``SPEC``); a pattern from outside the package is a
`PatternSpec` named by an entry point of the group ``marginalia.patterns`` (or given to `register` before the
front ends are built). See docs/patterns.md.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from ..models.base import Generator
from ..options import CollectionOptions, PatternOptions, Scope
from .base import Pattern

if TYPE_CHECKING:
    from ..index.embedders import Embedder
    from ..index.store import Collection
    from ..models.snapshots import SnapshotStore
    from .base import Run
    from .collection import CollectionReader

#: the entry point group a pattern from another package is named in (its value: ``module:SPEC``)
ENTRY_POINTS = "marginalia.patterns"
#: the built-in patterns, in the order the front ends list them, and the modules that register them
BUILTINS = {"auto": "marginalia.patterns.auto", "wim": "marginalia.patterns.wim",
            "lc": "marginalia.patterns.long_context", "rag": "marginalia.patterns.rag"}
#: the name the HTTP bodies give a reading that names no pattern (the route by size): no pattern may take it
RESERVED = frozenset({"default"})
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

#: reads a text from a stored reading where there is one (``cache``): (generator, options, text, question,
#: source=, embedder=, cache=, settings=) -> Run
ReadText = Callable[..., "Run"]
#: reads a collection: (store, options, reading, generator, scope[, note=]) -> a reader whose ``ask`` starts a
#: Run (``note``, given only where the options came from a collection's reading profile: said in its route)
ReadCollection = Callable[..., Any]


@dataclass(frozen=True)
class PatternSpec:
    """One way of reading, as the registry knows it.

    Attributes:
        name: what the CLI's ``--pattern``, the HTTP body's ``reading.pattern`` and the benchmark config's
            ``kind`` call it; the options record's ``pattern`` class attribute must say the same.
        options: its options record (a frozen `PatternOptions` subclass): every option's default, bounds
            and description, written once.
        pattern: its class, built as ``pattern(generator, options, **values)`` (with ``embedder=`` too when
            it needs one).
        description: one line on how it reads: the CLI's help, the HTTP schema's and the page's.
        title: the heading of its own options in ``marginalia ask --help`` (default: its name).
        needs_embedder: whether reading a text needs an embedder (retrieval over the text's chunks).
        reads: what it reads of a collection by default: the retrieved ``sections``, ``chunks`` or whole
            ``documents`` (`CollectionOptions.scope` overrides it).
        read_text: reads a text from a stored reading in a cache (WiM's); None: it always reads anew.
        read_collection: builds its reader of a collection; None: its own pattern reads the retrieved
            references, as many of them as `CollectionOptions.hits` says.
    """

    name: str
    options: type[PatternOptions]
    pattern: type[Pattern]
    description: str
    title: str = ""
    needs_embedder: bool = False
    reads: Scope = "sections"
    read_text: ReadText | None = None
    read_collection: ReadCollection | None = None

    @property
    def heading(self) -> str:
        return self.title or self.name


_lock = threading.RLock()
_specs: dict[str, PatternSpec] = {}
_loaded = False


def register(spec: PatternSpec) -> PatternSpec:
    """Add a way of reading (registering the same spec again does nothing); returns ``spec``.

    The front ends (the CLI's parser, the HTTP service's schema, the benchmark config) are derived from the
    registry when they are first built, so a pattern registered later is not in them; an entry point of
    the group `ENTRY_POINTS` is loaded before they are.

    Raises:
        UserError: a bad name, a name another spec has, or an options record that names another pattern.
    """
    if not isinstance(spec, PatternSpec):
        raise UserError(f"register takes a PatternSpec, got {type(spec).__name__}")
    if not _NAME.match(spec.name) or spec.name in RESERVED:
        raise UserError(f"pattern name {spec.name!r}: use 1-32 lowercase letters, digits and '_', starting with "
                        f"a letter (and not {', '.join(sorted(RESERVED))})")
    if not (isinstance(spec.options, type) and issubclass(spec.options, PatternOptions)):
        raise UserError(f"pattern {spec.name!r}: its options must be a PatternOptions subclass")
    if getattr(spec.options, "pattern", None) != spec.name:
        raise UserError(f"pattern {spec.name!r}: its options record {spec.options.__name__} must say "
                        f"pattern: ClassVar[str] = {spec.name!r}")
    with _lock:
        known = _specs.get(spec.name)
        if known is not None and known != spec:
            raise UserError(f"a pattern called {spec.name!r} is registered already ({known.pattern.__module__}); "
                            "give yours another name")
        _specs[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a pattern registered from outside the package (a built-in stays)."""
    if name in BUILTINS:
        raise UserError(f"{name!r} is a built-in pattern; it cannot be removed")
    with _lock:
        _specs.pop(name, None)


def load() -> None:
    """Register the built-in patterns and those the installed packages name in `ENTRY_POINTS` (once).

    Raises:
        UserError: an entry point that does not load or does not name a `PatternSpec`.
    """
    global _loaded
    with _lock:
        if _loaded:
            return
        for module in BUILTINS.values():
            register(importlib.import_module(module).SPEC)
        for point in entry_points(group=ENTRY_POINTS):
            load_entry_point(point)
        _loaded = True


def load_entry_point(point: Any) -> PatternSpec:
    """Register the `PatternSpec` an entry point names (``module:attribute``)."""
    try:
        spec = point.load()
    except Exception as exc:  # a plugin's own failure, whatever it is, named with the plugin
        raise UserError(f"the pattern plugin {point.name!r} ({point.value}, entry point group {ENTRY_POINTS}) "
                        f"failed to load: {type(exc).__name__}: {exc}; fix or uninstall it") from exc
    if not isinstance(spec, PatternSpec):
        raise UserError(f"the pattern plugin {point.name!r} names {point.value}, which is a "
                        f"{type(spec).__name__}, not a PatternSpec")
    return register(spec)


def specs() -> list[PatternSpec]:
    """Every registered pattern: the built-ins in `BUILTINS` order, then the others as registered."""
    load()
    with _lock:
        ordered = [_specs[name] for name in BUILTINS if name in _specs]
        return ordered + [s for name, s in _specs.items() if name not in BUILTINS]


def names() -> tuple[str, ...]:
    return tuple(s.name for s in specs())


def get(name: str) -> PatternSpec:
    """The pattern called ``name``.

    Raises:
        UserError: no pattern is called so (the message lists them).
    """
    load()
    with _lock:
        spec = _specs.get(name)
    if spec is None:
        raise UserError(f"unknown pattern {name!r}; choose one of {', '.join(names())}")
    return spec


def spec_of(options: PatternOptions | str) -> PatternSpec:
    """The pattern an options record (or a name) stands for, by the record's ``pattern``."""
    return get(options if isinstance(options, str) else options.pattern)


def pattern_options(name: str, **values: Any) -> PatternOptions:
    """The options record of the pattern ``name``, built from ``values``.

    Raises:
        UserError: an unknown pattern, an option the pattern does not take, or a bad value.
    """
    result: PatternOptions = get(name).options.build(**values)
    return result


def needs_embedder(options: PatternOptions | str) -> bool:
    """Whether reading a text with this pattern needs an embedder (the one rule the front ends ask)."""
    return spec_of(options).needs_embedder


def build(options: PatternOptions, generator: Generator, *, embedder: Embedder | None = None,
          **values: Any) -> Pattern:
    """The pattern an options record describes (``values``: its class's own keyword arguments)."""
    spec = spec_of(options)
    if spec.needs_embedder:
        values["embedder"] = embedder
    return spec.pattern(generator, options, **values)


def read_text(options: PatternOptions, generator: Generator, text: str, question: str, *, source: str,
              embedder: Embedder | None, cache: SnapshotStore | None, settings: Any) -> Run:
    """Start reading ``text``: from a stored reading in ``cache`` where the pattern keeps one, else anew."""
    spec = spec_of(options)
    if cache is not None and spec.read_text is not None:
        run: Run = spec.read_text(generator, options, text, question, source=source, embedder=embedder,
                                  cache=cache, settings=settings)
        return run
    return build(options, generator, embedder=embedder).run(text, question, source=source, settings=settings)


def collection_reader(store: Collection, options: PatternOptions, reading: CollectionOptions,
                      generator: Generator, note: str | None = None) -> Any:
    """A pattern's reader of a collection (its ``ask(question, source, settings)`` starts a Run); ``note``:
    where the options came from (a collection's reading profile), given to a pattern's own reader of a
    collection, which may name it in its route."""
    from .collection import CollectionReader, searching

    spec = spec_of(options)
    scope = reading.scope or spec.reads
    if spec.read_collection is not None:
        if note is not None:
            return spec.read_collection(store, options, reading, generator, scope, note=note)
        return spec.read_collection(store, options, reading, generator, scope)
    reader: CollectionReader = CollectionReader(
        build(options, generator), searching(store, reading, generator, scope=scope, k=reading.hits),
        name=spec.name)
    return reader
