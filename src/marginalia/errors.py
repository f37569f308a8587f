"""The one error tree. Messages state what was wrong; a front end (the CLI, the server) adds what to do
where that depends on it (a flag to pass, a field to send)."""

from __future__ import annotations


class MarginaliaError(Exception):
    """Base of every error marginalia raises on purpose."""

    exit_code = 1


class UserError(MarginaliaError):
    """The caller asked for something impossible; the message says how to fix it."""

    exit_code = 2


class ContextOverflow(UserError):
    """A prompt does not fit the model's context window."""

    def __init__(self, needed: int, window: int, what: str = "the prompt") -> None:
        self.needed = needed
        self.window = window
        super().__init__(f"{what} needs {needed} tokens but the model's window holds {window}")


class NotFound(UserError):
    """Something the caller named does not exist (a document, a collection, a session)."""

    def __init__(self, message: str, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(message)


class CollectionBusy(UserError):
    """Another process (or thread) kept a collection's writer lock past the timeout."""

    def __init__(self, name: str, holder_pid: int | None, waited: float) -> None:
        self.name = name
        self.holder_pid = holder_pid
        self.waited = waited
        holder = f"process {holder_pid}" if holder_pid else "another process"
        super().__init__(
            f"collection {name!r} is being written by {holder}; waited {waited:.0f} s for it. "
            "Let that indexing run finish (or stop it) and try again, or pass a longer lock timeout"
        )


class MissingDependency(UserError):
    """An optional extra is not installed; the message carries the install command."""

    def __init__(self, what: str, command: str) -> None:
        self.what = what
        self.command = command
        super().__init__(f"{what} is not installed; install it with: {command}")


class BackendError(MarginaliaError):
    """A model backend failed at run time (wraps the cause with `raise ... from`)."""


class IngestError(MarginaliaError):
    """A document could not be read."""

    def __init__(self, message: str, path: str | None = None, page: int | None = None) -> None:
        self.path = path
        self.page = page
        super().__init__(message)


class DocumentTooLarge(IngestError):
    """A document whose reading would cost more than a bound allows (pages, inflated size, time, memory);
    ``limit`` names the option that sets the bound, ``bound`` is its value."""

    def __init__(self, message: str, *, limit: str, bound: float, path: str | None = None) -> None:
        self.limit = limit
        self.bound = bound
        super().__init__(message, path=path)


class BadInput(IngestError, UserError):
    """A document the user gave is unusable (missing, empty, binary, wrong encoding)."""

    exit_code = 2


class EmptyDocument(BadInput):
    """A document with no text at all (an empty file, only whitespace, markup that holds no text)."""
