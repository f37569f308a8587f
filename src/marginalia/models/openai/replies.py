"""Pydantic models of what an OpenAI-compatible server sends back: stream chunks, usage,
llama.cpp's timings, error bodies and the ``/models`` listing.

Servers add fields of their own (ignored) and differ in what they leave out (usage,
cache counts, a chunk's content), so whatever the backend can do without is optional;
a field that is present but of the wrong kind makes the whole reply malformed.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ...errors import BackendError


class Reply(BaseModel):
    """A server's JSON: unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class PromptTokensDetails(Reply):
    #: prompt tokens the server took from its prefix cache (vLLM, SGLang, OpenAI)
    cached_tokens: int | None = None


class UsageReport(Reply):
    """The ``usage`` object (sent in the last chunk when ``stream_options.include_usage``)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: PromptTokensDetails | None = None


class Timings(Reply):
    """llama.cpp server's own counts: prompt tokens evaluated, and taken from its cache."""

    prompt_n: int | None = None
    cache_n: int | None = None


class ErrorFields(Reply):
    """The object under ``error``; llama.cpp adds both numbers of a context overflow."""

    message: str | None = None
    type: str | None = None
    n_ctx: int | None = None
    n_prompt_tokens: int | None = None


class ErrorBody(Reply):
    """An error reply: ``{"error": {...}}`` (OpenAI, llama.cpp), ``{"error": "..."}``,
    ``{"message": ...}`` (vLLM) or ``{"detail": ...}`` (FastAPI servers)."""

    error: ErrorFields | str | None = None
    message: str | None = None
    detail: Any = None

    def text(self) -> str:
        """The human part of the error ("" when it has none)."""
        if isinstance(self.error, ErrorFields) and self.error.message:
            return self.error.message.strip()
        if isinstance(self.error, str) and self.error.strip():
            return self.error.strip()
        if self.message:
            return self.message.strip()
        return "" if self.detail is None else str(self.detail).strip()

    def fields(self) -> ErrorFields:
        return self.error if isinstance(self.error, ErrorFields) else ErrorFields()


class Delta(Reply):
    #: null in a chat stream's role-only and final chunks
    content: str | None = None


class Choice(Reply):
    """One choice of a chunk: ``text`` (completions) or ``delta`` (chat)."""

    text: str | None = None
    delta: Delta | None = None
    finish_reason: str | None = None


class Chunk(Reply):
    """One ``data:`` event of a streamed (chat) completion."""

    choices: list[Choice] | None = None
    usage: UsageReport | None = None
    timings: Timings | None = None
    error: ErrorFields | str | None = None

    def piece(self, chat: bool) -> str:
        """The text this chunk adds (its first choice's)."""
        if not self.choices:
            return ""
        choice = self.choices[0]
        if chat:
            return (choice.delta.content or "") if choice.delta else ""
        return choice.text or ""

    def finished(self) -> bool:
        return bool(self.choices and self.choices[0].finish_reason)

    def error_text(self) -> str | None:
        """The message of an error event (None: the chunk is not one)."""
        if self.error is None or self.error == "":
            return None
        return ErrorBody(error=self.error).text() or "(no message)"


class WindowKeys(Reply):
    """Where servers put a model's context window, best first (vLLM, SGLang, llama.cpp)."""

    max_model_len: int | None = None
    context_length: int | None = None
    n_ctx: int | None = None
    n_ctx_train: int | None = None

    def window(self) -> int | None:
        sizes = (self.max_model_len, self.context_length, self.n_ctx, self.n_ctx_train)
        return next((n for n in sizes if n is not None and n > 0), None)


class ModelEntry(WindowKeys):
    """One entry of ``GET /models``; llama.cpp puts the window keys under ``meta``."""

    id: str
    #: who serves it: "llamacpp" for llama.cpp's llama-server, "vllm", "sglang", ...
    owned_by: str | None = None
    meta: WindowKeys | None = None


class ModelList(Reply):
    data: list[ModelEntry] = []


class MalformedReply(BackendError):
    """A server reply of the wrong shape; ``detail`` names the first wrong field."""

    def __init__(self, what: str, detail: str) -> None:
        self.detail = detail
        super().__init__(f"{what} is malformed: {detail}")


R = TypeVar("R", bound=Reply)


def parse(model: type[R], data: str | bytes, what: str) -> R:
    """Validate the JSON ``data`` as ``model``.

    Raises:
        MalformedReply: not JSON, or a field of the wrong kind (``what`` names the reply).
    """
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise MalformedReply(what, describe(exc, data)) from exc


def describe(exc: ValidationError, data: str | bytes) -> str:
    """The first problem of a validation error, in one line."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    problems = exc.errors(include_url=False)
    first = problems[0]
    if first["type"] == "json_invalid":
        return f"{text[:80]!r} is not JSON"
    if not first["loc"]:
        return f"{text[:80]!r} is not a JSON object"
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    return f"field {where}: {first['msg']}, got {first['input']!r:.60}{more}"
