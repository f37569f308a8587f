"""Request bodies: the options records (each registered pattern's, and `CollectionOptions`) as their parts, so
each option's default, bounds and description come from the record and nowhere else.

A body names its pattern in ``reading.pattern``; the records themselves keep the pattern as a class
attribute, so each registered pattern gets a request twin here that adds it as a field (``WimReading`` for
wim: `reading_models`; `record` turns it back). A reading that names no pattern (`DefaultReading`) takes
auto's options and the route by size (`app.default_options`). `options_schema` is the JSON Schema the web
page builds its reading form from.

Every part of a body is strict (`Part`): a value of the wrong JSON type is refused rather than converted
(``"512"`` is not a number, ``"yes"`` not a boolean; a whole number is a number), so the records used in
bodies have twins here that are strict too, named as the records in the API's schema. The records
themselves stay lenient for the CLI and config files, whose front ends convert their own values.
"""

from __future__ import annotations

import json
import warnings
from contextvars import ContextVar
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, create_model, model_validator
from pydantic_core import PydanticCustomError

from ..app import AutoOptions, GenerationParams, PatternSpec, pattern_spec, pattern_specs
from ..options import MAX_TOKENS, ROUTE_TOKENS, CollectionOptions, ComposeOptions, PatternOptions
from ..options import describe as describe_options
from .errors import MAX_PROBLEMS, UNKNOWN_FIELDS

#: the longest name a request may give (a collection, a model, an embedder): longer ones name nothing
MAX_NAME = 200
#: the longest document name or id a request may give
MAX_DOCUMENT = 1000


def few_unknown(cls: type[BaseModel], data: Any) -> Any:
    """``data`` as it is, unless it names more than `MAX_PROBLEMS` fields a model that forbids unknown ones
    does not have: then one error that names the first of them and counts them all, raised before
    validation would make an error of each (a body may hold millions)."""
    if not isinstance(data, dict) or len(data) <= MAX_PROBLEMS or cls.model_config.get("extra") != "forbid":
        return data
    fields = cls.model_fields
    unknown = [key for key in data if key not in fields]
    if len(unknown) <= MAX_PROBLEMS:
        return data
    raise PydanticCustomError(UNKNOWN_FIELDS, "{count} fields it does not have",
                              {"count": len(unknown), "names": [str(key) for key in unknown[:MAX_PROBLEMS]]})


class Part(BaseModel):
    """A part of a request body: strict about JSON types, and quick to refuse many unknown fields."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, data: Any) -> Any:
        return few_unknown(cls, data)


def reading_model(spec: PatternSpec) -> type[Part]:
    """A registered pattern's request twin: its options record, strict, with ``pattern`` as a field naming it
    (``WimReading`` for wim); its description is the registration's."""
    with warnings.catch_warnings():  # the field shadows the records' ClassVar on purpose
        warnings.filterwarnings("ignore", message="Field name \"pattern\"")
        bases: Any = (spec.options, Part)
        fields: dict[str, Any] = {"pattern": (Literal[spec.name], spec.name)}
        model: type[Part] = create_model(
            f"{spec.name.title().replace('_', '')}Reading", __base__=bases, __module__=__name__,
            __doc__=f"{spec.description[:1].upper()}{spec.description[1:]}, with its options.", **fields)
    return model


with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Field name \"pattern\"")

    class DefaultReading(AutoOptions, Part):
        __doc__ = (f"No pattern named: auto over a collection or a text of more than {ROUTE_TOKENS} tokens, "
                   "wim over a shorter text; auto's options.")

        pattern: None = None  # type: ignore[misc, assignment]


#: every registered pattern's request twin, by name (the registry as it stood when the service was built)
READINGS: dict[str, type[Part]] = {spec.name: reading_model(spec) for spec in pattern_specs()}


_CollectionRecord = CollectionOptions  # the module's names, which the nested classes below shadow
_ComposeRecord = ComposeOptions


class Strict:
    """The records a body holds as they are, strict (`Part`), under the records' own names (as the API's
    schema calls them)."""

    class CollectionOptions(_CollectionRecord, Part):
        __doc__ = _CollectionRecord.__doc__

    class ComposeOptions(_ComposeRecord, Part):
        __doc__ = _ComposeRecord.__doc__


def _pattern_of(value: Any) -> str | None:
    """The pattern a reading names; ``default`` when it names none (the route by size)."""
    if isinstance(value, dict):
        named = value.get("pattern")
        return "default" if named is None else str(named)
    if isinstance(value, BaseModel):
        return getattr(value, "pattern", None) or "default"
    return None


if TYPE_CHECKING:
    class AnyReading(Part):
        """What every reading is: a pattern's options record, strict, with the pattern's name (None: none)."""

        pattern: str | None

    Reading = AnyReading
else:
    AnyReading = Part  # one of `READINGS`, or a `DefaultReading`
    Reading = Annotated[
        Union[tuple(Annotated[model, Tag(name)] for name, model in READINGS.items())  # noqa: UP007
              + (Annotated[DefaultReading, Tag("default")],)],
        Discriminator(_pattern_of, custom_error_type="unknown_pattern",
                      custom_error_message=f"unknown pattern; choose one of {', '.join(READINGS)}, or name none "
                                           "for the route by size"),
    ]


def record(reading: AnyReading) -> PatternOptions:
    """The options record a request's reading stands for (auto's for one that names no pattern)."""
    cls = pattern_spec(reading.pattern or AutoOptions.pattern).options
    result: PatternOptions = cls.model_validate(reading.model_dump(exclude={"pattern"}))
    return result


def options_schema() -> dict[str, Any]:
    """The JSON Schema of a request's reading options, what the web page builds its form from: ``reading`` is
    one of the registered patterns (each with its description and options: defaults, bounds, descriptions),
    with the answer's ``temperature`` and, for a collection, ``collection_options``."""
    readings = []
    for spec in pattern_specs():
        if spec.name in READINGS:  # registered before the service was built
            schema = READINGS[spec.name].model_json_schema()
            schema.update(title=spec.name, description=spec.description)
            readings.append(schema)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Reading options",
        "description": "How to read: a pattern and its options, the answer's temperature, and what reading a "
                       "collection takes.",
        "type": "object",
        "properties": {
            "reading": {"oneOf": readings, "description": "the pattern and its options"},
            "temperature": AskRequest.model_json_schema()["properties"]["temperature"],
            "collection_options": Strict.CollectionOptions.model_json_schema(),
        },
    }


def _default_reading() -> Any:
    return DefaultReading()


#: set while a request whose body was checked for lone surrogates already (`common.ParsedOffLoop`) is validated
SCANNED: ContextVar[bool] = ContextVar("marginalia_body_scanned", default=False)


def lone_surrogate(value: Any) -> str | None:
    """Where a decoded JSON value holds a string that is not valid Unicode: a lone surrogate, which JSON's
    ``\\ud800`` escape allows and nothing downstream can encode. Returns where, in words, or None.

    Linear in the value's size: one pass in C (encoding it all) says whether there is one; only then a walk
    finds where."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        pass
    except (TypeError, ValueError, RecursionError):  # not plain JSON, or nested deeper than C recursion goes
        pass
    else:
        return None
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:  # a loop, not recursion: a body nests as deep as the JSON parser allows
        path, item = stack.pop()
        if isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{path or 'the body'}, at character {exc.start}"
        elif isinstance(item, dict):
            for key, inner in item.items():
                if lone_surrogate(str(key)) is not None:
                    return f"a field name in {path or 'the body'}"
                stack.append((f"{path}.{key}" if path else str(key), inner))
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}" if path else str(i), inner) for i, inner in enumerate(item))
    return None


class UnicodeBody(Part):
    """A request body whose every string, field names included, is valid Unicode (see `lone_surrogate`)."""

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, data: Any) -> Any:  # in place of Part's: the unknown fields first, then the scan
        data = few_unknown(cls, data)
        if SCANNED.get():  # checked already, off the event loop
            return data
        unknown = [key for key in data if key not in cls.model_fields] if isinstance(data, dict) else []
        if unknown and cls.model_config.get("extra") == "forbid":
            # refused for its unknown fields anyway: only their names, which the refusal quotes, are checked
            where = "a field name" if lone_surrogate(unknown) is not None else None
        else:
            where = lone_surrogate(data)
        if where is not None:
            raise ValueError(f"not valid Unicode ({where}): it holds a lone surrogate, a \\ud800 to \\udfff "
                             "escape without its pair; send UTF-8 text")
        return data


class ErrorDetail(BaseModel):
    """What went wrong: a code to branch on and a message that says what to do; some errors add fields
    (``fields`` for a validation error, the first few of its problems, with ``more_problems`` counting the
    rest; ``margins`` for a reading that failed; the token counts of an overflow)."""

    model_config = ConfigDict(extra="allow")

    code: str = Field(description="e.g. not_found, validation_error, unsupported_type, too_large, busy")
    message: str


class ErrorReply(BaseModel):
    """Every error the service answers: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


class Body(UnicodeBody):
    model_config = ConfigDict(extra="forbid")


class Target(Body):
    """What to read: a pasted text, one document of a collection, or a collection; and how."""

    text: str | None = Field(default=None, description="a pasted text to read (markdown or plain)")
    collection: str | None = Field(default=None, max_length=MAX_NAME, description="a collection to answer from")
    document: str | None = Field(
        default=None, max_length=MAX_DOCUMENT,
        description="with collection: read only this document of it, whole (its name or id)")
    reading: Reading = Field(default_factory=_default_reading,
                             description="how to read: the pattern and its options (no pattern: auto over a "
                                         f"collection or a text of more than {ROUTE_TOKENS} tokens, wim over a "
                                         "shorter text)")
    collection_options: Strict.CollectionOptions = Field(
        default_factory=Strict.CollectionOptions,
        description="reading a collection: the retrieval policy and how much of what it finds is read")

    @model_validator(mode="after")
    def _one_source(self) -> Target:
        if (self.text is None) == (self.collection is None):
            raise ValueError("give either 'text' or 'collection' (with 'document' for one of its documents)")
        if self.document is not None and self.collection is None:
            raise ValueError("'document' names a document of a collection: give 'collection' too")
        if self.text is not None and not self.text.strip():
            raise ValueError("'text' is empty; paste a document with some text")
        return self

    @property
    def options(self) -> PatternOptions:
        return record(self.reading)

    @property
    def by_size(self) -> bool:
        """Whether the reading names no pattern, so that the route by size chooses one."""
        return self.reading.pattern is None

    def describe(self) -> str:
        """The source in a few words (for logs and the session listing)."""
        if self.text is not None:
            return f"a text of {len(self.text)} characters"
        if self.document is not None:
            return f"document {self.document!r} of collection {self.collection!r}"
        return f"collection {self.collection!r}"


Question = Annotated[str, Field(min_length=1, max_length=4000, pattern=r"\S",
                                description="the question to answer")]
TEMPERATURE = Field(default=GenerationParams.temperature, ge=0.0, le=2.0,
                    description="sampling temperature of the answer (0: greedy, reproducible)")


class AskRequest(Target):
    """A question about a text, a document or a collection."""

    question: Question
    stream: bool = Field(default=False, description="send server-sent events, one per reading step")
    temperature: float = TEMPERATURE


class SessionRequest(Target):
    """A chat session over a text, a document or a collection."""


class MessageRequest(Body):
    """One message of a chat session."""

    message: Question
    stream: bool = Field(default=False, description="send server-sent events, one per reading step")
    temperature: float = TEMPERATURE


class ComposeSessionRequest(Body):
    """A compose session: suggestions for a text being written, with memory drawn from a collection."""

    collection: str = Field(max_length=MAX_NAME, description="the collection memory is retrieved from")
    options: Strict.ComposeOptions = Field(default_factory=Strict.ComposeOptions,
                                    description="when memory is refreshed, what it holds, and the suggestions")
    exclude: list[Annotated[str, Field(min_length=1, max_length=500)]] = Field(
        default_factory=list, max_length=100,
        description="documents of the collection never to draw memory from (the one being written): their "
                    "names or ids")


class SuggestionRequest(Body):
    """The text as it is now; a suggestion continues it. A newer request to the same session cancels this one."""

    text: str = Field(max_length=1_000_000, description="the whole text written so far (the cursor at its end)")
    stream: bool = Field(default=False, description="send server-sent events: `delta` per piece, then `done`")


class CollectionRequest(Body):
    """A new, empty collection."""

    name: str = Field(max_length=MAX_NAME,
                      description="1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    embedder: str | None = Field(
        default=None, max_length=MAX_NAME, description="'minilm' or 'hashing' (default: the server's embedder)")


class KeyRequest(Body):
    """A new key and what it may do (an admin's request)."""

    name: str = Field(min_length=1, max_length=100,
                      description="the key's name: letters, digits, '_', '.', '@' or '-' (whose key it is)")
    read: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=1000, description="collections it may list, search, view and ask")
    write: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=1000, description="collections it may also upload to and delete from")
    admin: bool = Field(default=False, description="it may do everything, keys included")


_COLLECTION = CollectionOptions.model_fields


class DocqaChatRequest(UnicodeBody):
    """The docqa service's ``/chat`` request: a message, a temperature and the retrieval thresholds."""

    message: Question
    temperature: float = TEMPERATURE
    certainty_threshold: float = Field(default=_COLLECTION["certain"].default,
                                       description=_COLLECTION["certain"].description)
    uncertainty_threshold: float = Field(default=_COLLECTION["uncertain"].default,
                                         description=_COLLECTION["uncertain"].description)
    collection: str | None = Field(default=None, max_length=MAX_NAME,
                                   description="the collection (default: the server's --collection)")
    openai_model: str | None = Field(default=None, max_length=MAX_NAME,
                                     description="accepted for docqa clients; the served model answers")

    @model_validator(mode="after")
    def _thresholds(self) -> DocqaChatRequest:
        self.collection_options()
        return self

    def collection_options(self) -> CollectionOptions:
        try:
            return CollectionOptions(certain=self.certainty_threshold, uncertain=self.uncertainty_threshold)
        except ValidationError as exc:
            raise ValueError(describe_options(exc, CollectionOptions)) from None


class ChatMessage(Part):
    """One message of an OpenAI chat; text parts of a list content are joined."""

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            return ""
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class MarginaliaExtras(Body):
    """How to read, for OpenAI clients (send it as ``extra_body={"marginalia": {...}}``)."""

    reading: Reading = Field(default_factory=_default_reading)
    collection_options: Strict.CollectionOptions = Field(default_factory=Strict.CollectionOptions)


class StreamOptions(Part):
    include_usage: bool = False


class ChatCompletionRequest(UnicodeBody):
    """OpenAI's chat completion request; ``model`` is ``marginalia:<collection>``. Fields this service does
    not use (``top_p``, ``user``, ...) are accepted and ignored, as OpenAI clients send them."""

    model: str = Field(max_length=MAX_NAME, description="marginalia:<collection> (see GET /v1/models)")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    n: int = Field(default=1, ge=1, le=1, description="one choice only")
    marginalia: MarginaliaExtras = Field(default_factory=MarginaliaExtras)

    def question(self) -> str:
        """The last user message: what is asked (earlier turns are not read yet)."""
        for message in reversed(self.messages):
            if message.role == "user" and message.text().strip():
                return message.text()
        raise ValueError("no user message with text")

    @model_validator(mode="after")
    def _has_question(self) -> ChatCompletionRequest:
        self.question()
        return self


class QaJobRequest(Body):
    """A question-generation job over a collection's documents."""

    documents: list[str] | None = Field(default=None, max_length=1000,
                                        description="only these documents, by source or id (default: all)")
    retries: int = Field(default=2, ge=0, le=5, description="tries after a malformed reply from the model")


class PairReview(Body):
    """A person's decision on a generated QA pair, with an edited question or answer if they changed it."""

    status: Literal["accepted", "rejected", "pending"] = Field(description="the pair's new status")
    question: str | None = Field(default=None, min_length=1, max_length=4000,
                                 description="the question as edited (default: kept)")
    answer: str | None = Field(default=None, min_length=1, max_length=4000,
                               description="the answer as edited (default: kept)")


class EvalJobRequest(Body):
    """Readings to run on a collection's accepted QA pairs, each scored against the pairs' answers."""

    patterns: list[str] = Field(default_factory=lambda: ["rag", "wim", "auto"], min_length=1, max_length=16,
                                description="the readings, by pattern name (see GET /v1/patterns)")
