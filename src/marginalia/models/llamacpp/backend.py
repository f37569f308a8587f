"""In-process llama.cpp backend (llama-cpp-python): a CachingGenerator over a GGUF file.

On CPU it decodes the same weights faster than transformers. The GGUF's own tokenizer and
chat template are used. Keys are cached in 16 bits by default: 8-bit keys
(``key_cache="q8_0"``) decode a little faster but keep the keys rounded, which can
change greedy answers. Values stay 16-bit: 8-bit values need flash attention, which is
slower on long prefixes.

Rollback is `n_tokens = L`: the KV entries past L are dropped before the next
evaluation, and a continuation that repeats the same evaluation calls gives the same
logits as never having generated.

Several generator objects (forks) share one llama.cpp context; each keeps its own
token list and, before evaluating, re-syncs the context to it by the longest common
prefix, the way a server's prefix cache would. Stateless requests (`stream_prompt`)
run on a second, scratch context so they never evict a document from the first; it
keeps the last such prompt, so long context asked again about the same document
evaluates only the new question.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import BackendError, MissingDependency, UserError
from ..base import YIELD_STEP, CacheSnapshot, CachingGenerator, GenerationParams, Message, Tokenizer, step_pause
from ..copying import CopyState
from ..ledger import common_prefix
from ..repeats import NoRepeat

#: cached-key precisions: name -> ggml type id (llama_cpp.GGML_TYPE_F16, GGML_TYPE_Q8_0)
KEY_CACHE_TYPES = {"f16": 1, "q8_0": 8}
DEFAULT_KEY_CACHE = "f16"
#: branches decoded side by side (WiM's margins for a stored reading): a document's worth of segments
DEFAULT_BRANCHES = 16
LLAMACPP_INSTALL = "pip install 'marginalia[llamacpp]'  (builds llama.cpp from source, ~5 minutes once)"


def usable_cores() -> int:
    """The cores this process may run on (``taskset`` and container CPU sets narrow them), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise MissingDependency("the llama.cpp backend (llama-cpp-python)", LLAMACPP_INSTALL) from exc
    return llama_cpp


class LlamaCppTokenizer(Tokenizer):
    """The GGUF's own tokenizer, with character offsets rebuilt from token pieces."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def encode_with_offsets(
        self, text: str, allow_special: bool = False
    ) -> tuple[list[int], list[tuple[int, int]]]:
        if not text:
            return [], []
        data = text.encode("utf-8")
        ids = list(self.llm.tokenize(data, add_bos=False, special=allow_special))
        pieces = [self.llm.detokenize([i], special=True) for i in ids]
        joined = b"".join(pieces)
        shift = 0
        if joined != data:
            if joined == b" " + data:  # SentencePiece models add a space before the text
                shift = 1
            else:
                raise BackendError("the llama.cpp tokenizer does not reproduce the text; "
                                   "use the transformers backend (--backend transformers)")
        # byte position -> character index, so offsets are in characters like Python's str
        char_at = np.zeros(len(data) + 1, dtype=np.int64)
        pos = 0
        for index, ch in enumerate(text):
            width = len(ch.encode("utf-8"))
            char_at[pos:pos + width] = index
            pos += width
        char_at[len(data)] = len(text)
        offsets = []
        b = -shift
        for piece in pieces:
            start, end = max(b, 0), max(b + len(piece), 0)
            offsets.append((int(char_at[start]), int(char_at[end]) if end < len(data) else len(text)))
            b += len(piece)
        return ids, offsets

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(self.llm.detokenize(list(ids), special=True)).decode("utf-8", errors="replace")


@dataclass
class _Shared:
    """What forks share: the model path, the main context, the lazily made scratch one."""

    path: Path
    options: dict[str, Any]  # llama_cpp.Llama's settings, for the scratch context too
    llm: Any
    tokenizer: LlamaCppTokenizer
    template: Any
    eos_ids: frozenset[int]
    scratch: Any = None
    owner: Any = field(default=None)  # the fork whose tokens the main context holds
    n_seq_max: int = 1  # sequences of the main context: 0 holds the cache, the others branches


class LlamaCppGenerator(CachingGenerator):
    """A GGUF model run by llama.cpp in this process.

    Args:
        path: the GGUF file.
        name: the spec it was loaded from.
        n_ctx: the context window to allocate (default: the model's training window).
        n_threads: CPU threads (default: the cores this process may use).
        key_cache: ``f16`` (default) or ``q8_0``, the precision of the cached keys.
        n_branches: how many branches `branches` may decode side by side (0: none; the cache then
            holds one sequence).
        lora: a llama.cpp LoRA adapter (GGUF) for this model, applied to every context
            (`marginalia.models.llamacpp.lora_gguf` writes one from a peft adapter).
    """

    supports_copy = True  # every token's logits are masked to keep a copy (`_constrain`)
    supports_choice_probabilities = True

    def __init__(self, path: str | Path, name: str = "gguf", n_ctx: int | None = None,
                 n_threads: int | None = None, key_cache: str = DEFAULT_KEY_CACHE,
                 n_branches: int = DEFAULT_BRANCHES, lora: str | Path | None = None,
                 _shared: _Shared | None = None) -> None:
        super().__init__()
        self.name = name
        if _shared is None:
            if key_cache not in KEY_CACHE_TYPES:
                raise UserError(f"unknown key cache type {key_cache!r}; choose one of "
                                f"{', '.join(KEY_CACHE_TYPES)}")
            _shared = self._load(Path(path), n_ctx, n_threads, KEY_CACHE_TYPES[key_cache], n_branches,
                                 Path(lora).expanduser() if lora else None)
        self._shared = _shared
        self.context_window = _shared.options["n_ctx"]
        self.eos_ids = _shared.eos_ids
        self._ids: list[int] = []
        self._logits: np.ndarray | None = None
        self._logits_at = -1
        # The logits after the cache's tokens as they were read: a generation that is not committed
        # overwrites `_logits` step by step, and after rolling back, re-evaluating the last token alone
        # rounds differently from the batch that read it (a near-tie can then flip, so the same request
        # would not give the same tokens twice); these are kept until the cache is cut below them.
        self._read: tuple[int, np.ndarray] | None = None

    @staticmethod
    def _load(path: Path, n_ctx: int | None, n_threads: int | None, type_k: int, n_branches: int,
              lora: Path | None = None) -> _Shared:
        llama_cpp = import_llama_cpp()
        # llama-cpp-python decodes on half the cores by default; all of them decode faster. Prefill gets the
        # same threads: left to itself it takes every core the machine has, those a CPU set or taskset keeps
        # from this process too, and a caller's limit (the composer's memory model on one thread) would hold
        # for decoding only
        n_threads = n_threads or usable_cores()
        if not path.is_file():
            raise UserError(f"no GGUF file at {path}; check the path after 'gguf:'")
        # n_ctx=0: the window the model was trained with
        options: dict[str, Any] = {"n_ctx": n_ctx or 0, "n_batch": 512, "n_threads": n_threads,
                                   "n_threads_batch": n_threads, "type_k": type_k, "verbose": False}
        if lora is not None:
            if not lora.is_file():
                raise UserError(f"no LoRA adapter at {lora}")
            options["lora_path"] = str(lora)  # the scratch context gets it too
        try:
            llm = llama_cpp.Llama(str(path), **options)
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"llama.cpp could not load {path}: {exc}") from exc
        if lora is not None and not llm._lora_adapter:  # llama-cpp-python lets a NULL adapter through
            raise UserError(f"{lora} is not a llama.cpp LoRA adapter for {path} (llama.cpp could not read it); "
                            "write it again with 'marginalia tune train'")
        options["n_ctx"] = int(llm.n_ctx())  # the window as allocated, for the scratch context too
        if n_branches > 0:  # a unified cache over several sequences, so branches share their prefixes' cells
            from llama_cpp import _internals

            params = llm.context_params
            params.n_seq_max = n_branches + 1
            params.kv_unified = True
            llm._ctx.close()
            llm._ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
            if llm._lora_adapter:  # Llama set it on the context just replaced
                import ctypes

                adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(llm._lora_adapter)
                if llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, adapters, 1, (ctypes.c_float * 1)(1.0)):
                    raise BackendError(f"llama.cpp could not apply the LoRA adapter {lora}")
        source = llm.metadata.get("tokenizer.chat_template")
        template = None
        if source:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            template = env.from_string(source)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        eos = frozenset(i for i in range(llm.n_vocab())
                        if llama_cpp.llama_vocab_is_eog(vocab, i)) | {llm.token_eos()}
        return _Shared(path, options, llm, LlamaCppTokenizer(llm), template, eos, n_seq_max=n_branches + 1)

    # -- Generator ---------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        return self._shared.tokenizer

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        if self._shared.template is None:
            raise BackendError(f"{self.name} has no chat template in its GGUF; use an instruct model")
        llm = self._shared.llm
        return str(self._shared.template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=llm.detokenize([llm.token_bos()], special=True).decode("utf-8", "replace"),
            eos_token=llm.detokenize([llm.token_eos()], special=True).decode("utf-8", "replace"),
        ))

    def stream_prompt(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[str]:
        shared = self._shared
        if shared.scratch is None:
            llama_cpp = import_llama_cpp()
            shared.scratch = llama_cpp.Llama(str(shared.path), **shared.options)
        scratch = LlamaCppGenerator(shared.path, self.name, _shared=_Shared(
            shared.path, shared.options, shared.scratch, shared.tokenizer,
            shared.template, shared.eos_ids))
        scratch.usage = self.usage
        # The scratch context keeps the last request's prompt (the answer is rolled back to it): one that opens
        # the same way (the same document, another question) evaluates only from where they part. The kept
        # prefix ends on a multiple of the batch size, so every token is evaluated in the same batches as from
        # scratch and the answer is the same to the bit (a batch cut elsewhere can round differently and flip a
        # near-tie). At least one token is evaluated, for its logits.
        llm, ids = shared.scratch, list(prompt_ids)
        common = common_prefix(llm.input_ids[: llm.n_tokens].tolist(), ids[:-1])
        common -= common % llm.n_batch
        llm.n_tokens = common
        scratch._ids = ids[:common]
        scratch._shared.owner = scratch
        scratch.prefill(ids[common:])
        yield from scratch.generate_from_cache((), params, commit=False)

    # -- CachingGenerator --------------------------------------------------

    @property
    def length(self) -> int:
        return len(self._ids)

    def _sync(self) -> None:
        """Make the shared context hold exactly this fork's tokens (longest common prefix)."""
        shared, llm = self._shared, self._shared.llm
        if shared.owner is self and llm.n_tokens == len(self._ids):
            return
        common = common_prefix(llm.input_ids[: llm.n_tokens].tolist(), self._ids)
        llm.n_tokens = common
        shared.owner = self
        if common < len(self._ids):
            rest = self._ids[common:]
            self._read = (len(self._ids), self._eval(rest))
            self.usage.prefilled_tokens += len(rest)
            self.usage.evaluated(self._ids, common, len(self._ids))

    def _eval(self, ids: Sequence[int]) -> np.ndarray:
        """Evaluate ``ids`` on top of the context; return (and keep) the last one's logits."""
        llama_cpp = import_llama_cpp()
        llm = self._shared.llm
        ids = list(ids)
        pause = step_pause()
        try:
            if pause is None:
                llm.eval(ids)
            else:  # in slices, giving way before each (see `yielding_to`)
                for at in range(0, len(ids), YIELD_STEP):
                    pause()
                    llm.eval(ids[at:at + YIELD_STEP])
        except Exception as exc:  # llama.cpp reports decode failures as RuntimeError
            raise BackendError(f"llama.cpp failed to evaluate {len(ids)} tokens: {exc}") from exc
        pointer = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        logits = np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),)).copy()
        self._logits, self._logits_at = logits, llm.n_tokens
        return logits

    def prefill(self, ids: Sequence[int]) -> None:
        ids = list(ids)
        if not ids:
            return
        self.check_fits(self.length + len(ids), what="the prefilled context")
        t0 = time.perf_counter()
        self._sync()
        logits = self._eval(ids)
        self._ids.extend(ids)
        self._read = (len(self._ids), logits)
        self.usage.prefilled_tokens += len(ids)
        self.usage.evaluated(self._ids, len(self._ids) - len(ids), len(self._ids))
        self.usage.prefill_seconds += time.perf_counter() - t0

    def rollback(self, length: int) -> None:
        self.check_rollback(length)
        del self._ids[length:]
        if self._read is not None and self._read[0] > length:
            self._read = None
        if self._shared.owner is self:
            # entries past `length` are removed before the next evaluation
            self._shared.llm.n_tokens = min(self._shared.llm.n_tokens, length)

    def snapshot(self) -> CacheSnapshot:
        """The KV entries of this fork's tokens, copied out of the shared context (sequence 0)."""
        import ctypes

        llama_cpp = import_llama_cpp()
        self._sync()
        ctx = self._shared.llm._ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0)
        if written == 0:
            raise BackendError("llama.cpp could not copy its cache out")
        return CacheSnapshot(tuple(self._ids), bytes(buffer[:written]), int(written))

    def restore(self, snapshot: CacheSnapshot) -> None:
        import ctypes

        llama_cpp = import_llama_cpp()
        if not isinstance(snapshot.state, bytes):
            raise BackendError("this snapshot holds no llama.cpp state; take it with snapshot()")
        llm = self._shared.llm
        data = (ctypes.c_uint8 * len(snapshot.state)).from_buffer_copy(snapshot.state)
        if llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, data, len(snapshot.state), 0) == 0:
            raise BackendError("llama.cpp refused the cached state (made by another model or version?)")
        ids = list(snapshot.ids)
        llm.input_ids[: len(ids)] = ids
        llm.n_tokens = len(ids)
        self._shared.owner = self
        self._ids = ids
        self._logits, self._logits_at, self._read = None, -1, None

    def cache_identity(self) -> str:
        import importlib.metadata

        path = self._shared.path
        stat = path.stat()
        identity = (f"llama.cpp {importlib.metadata.version('llama_cpp_python')}:{path.resolve()}:{stat.st_size}:"
                    f"{int(stat.st_mtime)}:type_k={self._shared.options['type_k']}:n_ctx={self.context_window}")
        lora = self._shared.options.get("lora_path")
        if lora:
            adapter = Path(lora).stat()
            identity += f":lora={Path(lora).resolve()}:{adapter.st_size}:{int(adapter.st_mtime)}"
        return identity

    @property
    def cached_ids(self) -> tuple[int, ...]:
        return tuple(self._ids)

    def drop(self, start: int, end: int) -> None:
        """Remove cells ``[start, end)`` of sequence 0 and shift the later ones down by ``end - start``
        positions (llama.cpp re-rotates their keys, as its own context shift does)."""
        self.check_drop(start, end)
        if start == end:
            return
        llama_cpp = import_llama_cpp()
        self._sync()
        llm = self._shared.llm
        memory = llama_cpp.llama_get_memory(llm._ctx.ctx)
        if not llama_cpp.llama_memory_seq_rm(memory, 0, start, end):
            raise BackendError(f"llama.cpp could not remove cached tokens {start} to {end}")
        llama_cpp.llama_memory_seq_add(memory, 0, end, -1, start - end)
        del self._ids[start:end]
        llm.input_ids[: len(self._ids)] = self._ids
        llm.n_tokens = len(self._ids)
        self._logits, self._logits_at, self._read = None, -1, None

    def state_bytes(self, snapshot: CacheSnapshot) -> bytes:
        return snapshot.state if isinstance(snapshot.state, bytes) else b""

    def snapshot_from_bytes(self, ids: Sequence[int], data: bytes) -> CacheSnapshot:
        if not data:
            raise BackendError("an empty llama.cpp state")
        return CacheSnapshot(tuple(ids), bytes(data), len(data))

    @property
    def max_branches(self) -> int:  # type: ignore[override]
        return self._shared.n_seq_max - 1  # sequence 0 holds the cache itself

    def branches(self, ends: Sequence[int], suffix_ids: Sequence[int],
                 params: GenerationParams) -> list[tuple[str, int]]:
        """Branches as sequences 1..n of the unified cache: each shares the cells of its prefix with
        sequence 0 (no copy), then their prompts are decoded in one batch and their tokens one step at a
        time, all branches in each step.

        One branch at a time gives the tokens a single request gives. Several side by side are computed
        in batches of other shapes, whose sums round differently, so a greedy branch may now and then
        take another token where two were nearly tied.
        """
        llama_cpp = import_llama_cpp()
        ends, suffix = list(ends), list(suffix_ids)
        if not ends:
            return []
        self.check_branches(ends, suffix, params)
        self._sync()
        llm = self._shared.llm
        ctx = llm._ctx.ctx
        memory = llama_cpp.llama_get_memory(ctx)
        n_vocab = llm.n_vocab()
        batch = llama_cpp.llama_batch_init(max(llm.n_batch, len(ends)), 0, 1)
        rng = np.random.default_rng(params.seed if params.seed is not None else 0)

        def decode(items: list[tuple[int, int, int, bool]]) -> dict[int, np.ndarray]:
            rows = self._decode_batch(batch, items)
            return {j: self._row(ctx, row, n_vocab) for j, row in rows.items()}

        def pick(logits: np.ndarray) -> int:
            return _sample(logits, params, rng)

        try:
            for j, end in enumerate(ends):
                llama_cpp.llama_memory_seq_rm(memory, j + 1, -1, -1)
                llama_cpp.llama_memory_seq_cp(memory, 0, j + 1, 0, end)
            return self._decode_branches(ends, suffix, params, decode, pick, llm.n_batch)
        finally:
            for j in range(len(ends)):
                llama_cpp.llama_memory_seq_rm(memory, j + 1, -1, -1)
            llama_cpp.llama_batch_free(batch)

    def score(self, ids: Sequence[int]) -> list[float]:
        """Log-probabilities of ``ids`` after the cache: the first from the cache's last logits, the rest from
        one batch (per ``n_batch`` tokens) of ``ids[:-1]`` on sequence 0 with logits kept for every position,
        whose cells are removed afterwards."""
        ids = [int(i) for i in ids]
        if not ids:
            return []
        self.check_score(ids)
        rows = [_log_softmax(self._pending_logits())]  # also syncs the shared context to this fork
        llama_cpp = import_llama_cpp()
        llm = self._shared.llm
        ctx = llm._ctx.ctx
        start, n_vocab, rest = self.length, llm.n_vocab(), ids[:-1]
        t0 = time.perf_counter()
        # a generation rolled back leaves its cells until llama.cpp's own eval removes them; this decode is not
        # that eval, so they go first
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, start, -1)
        batch = llama_cpp.llama_batch_init(llm.n_batch, 0, 1)
        try:
            for at in range(0, len(rest), llm.n_batch):
                piece = rest[at:at + llm.n_batch]
                for i, token in enumerate(piece):
                    batch.token[i] = token
                    batch.pos[i] = start + at + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = True
                batch.n_tokens = len(piece)
                code = llama_cpp.llama_decode(ctx, batch)
                if code != 0:
                    raise BackendError(f"llama.cpp could not score {len(piece)} tokens (code {code})")
                rows.extend(_log_softmax(self._row(ctx, i, n_vocab)) for i in range(len(piece)))
        finally:
            llama_cpp.llama_batch_free(batch)
            # the scored tokens' cells go; the context's own record (n_tokens, input_ids) never counted them
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, start, -1)
            self.usage.prefilled_tokens += len(rest)
            self.usage.prefill_seconds += time.perf_counter() - t0
        return [float(row[token]) for row, token in zip(rows, ids, strict=True)]

    def _decode_batch(self, batch: Any, items: Sequence[tuple[int, int, int, bool]]) -> dict[int, int]:
        """Decode ``(branch, position, token, wants logits)`` items as one batch (branch j is sequence
        j + 1); return each branch's row of logits."""
        llama_cpp = import_llama_cpp()
        rows: dict[int, int] = {}
        for i, (j, pos, token, logits) in enumerate(items):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = j + 1
            batch.logits[i] = logits
            if logits:
                rows[j] = i
        batch.n_tokens = len(items)
        if (pause := step_pause()) is not None:
            pause()
        code = llama_cpp.llama_decode(self._shared.llm._ctx.ctx, batch)
        if code != 0:
            raise BackendError(f"llama.cpp could not decode a batch of {len(items)} branch tokens (code {code}); "
                               "the cache may be full: use fewer or shorter branches")
        return rows

    @staticmethod
    def _row(ctx: Any, row: int, n_vocab: int) -> np.ndarray:
        llama_cpp = import_llama_cpp()
        pointer = llama_cpp.llama_get_logits_ith(ctx, row)
        return np.ctypeslib.as_array(pointer, shape=(n_vocab,)).copy()

    def fork(self, keep_cache: bool = True) -> LlamaCppGenerator:
        other = LlamaCppGenerator(self._shared.path, self.name, _shared=self._shared)
        other.usage = self.usage
        if keep_cache:
            other._ids = list(self._ids)
            other._read = self._read if self._read is not None and self._read[0] == len(self._ids) else None
        return other

    def _pending_logits(self) -> np.ndarray:
        self._sync()
        if self._logits is not None and self._logits_at == len(self._ids) \
                and self._shared.llm.n_tokens == len(self._ids):
            return self._logits
        if self._read is not None and self._read[0] == len(self._ids) \
                and self._shared.llm.n_tokens == len(self._ids):
            return self._read[1]
        if not self._ids:
            raise BackendError("nothing to generate from: the cache is empty and no prompt was given")
        last = self._ids[-1]
        self._shared.llm.n_tokens = len(self._ids) - 1
        logits = self._eval([last])
        self._read = (len(self._ids), logits)
        self.usage.prefilled_tokens += 1
        self.usage.evaluated(self._ids, len(self._ids) - 1, len(self._ids))
        return logits

    def _next_logits(self, token_ids: Sequence[int]) -> list[float]:
        logits = self._pending_logits()
        return [float(logits[i]) for i in token_ids]

    def _constrain(self, logits: np.ndarray, copying: CopyState | None) -> np.ndarray:
        """``logits`` with all that would break the copy masked (with copy decoding)."""
        if copying is not None:
            logits = _keep(logits, copying.mask(logits, self.eos_ids))
        return logits

    def _sample_tokens(self, params: GenerationParams) -> Iterator[int]:
        rng = np.random.default_rng(params.seed if params.seed is not None else 0)
        copying, guard = self.copy_state(params), self.repeat_guard(params)
        logits = self._constrain(self._pending_logits(), copying)
        while True:
            token = _sample(_unrepeated(logits, guard), params, rng)
            yield token
            if copying is not None:
                copying.feed(token)
            if guard is not None:
                guard.feed(token)
            self._sync()
            logits = self._constrain(self._eval([token]), copying)
            self._ids.append(token)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - np.max(logits)
    return np.asarray(z - np.log(np.sum(np.exp(z))))


def _unrepeated(logits: np.ndarray, guard: NoRepeat | None) -> np.ndarray:
    """``logits`` with the tokens that would repeat a run masked out (unless nothing else is left)."""
    banned = guard.banned() if guard is not None else []
    if not banned:
        return logits
    masked = logits.copy()
    masked[banned] = -np.inf
    return masked if np.isfinite(masked).any() else logits


def _keep(logits: np.ndarray, allowed: Any) -> np.ndarray:
    """``logits`` with every token but ``allowed`` masked out."""
    masked = np.full_like(logits, -np.inf)
    masked[allowed] = logits[allowed]
    return masked


def _sample(logits: np.ndarray, params: GenerationParams, rng: np.random.Generator) -> int:
    if params.temperature <= 0:
        return int(np.argmax(logits))
    z = (logits - np.max(logits)) / params.temperature
    probs = np.exp(z)
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs)
        keep = np.cumsum(probs[order]) - probs[order] < params.top_p
        mask = np.zeros_like(probs, dtype=bool)
        mask[order[keep]] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    return int(rng.choice(len(probs), p=probs))
