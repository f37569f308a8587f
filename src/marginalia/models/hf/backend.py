"""In-process transformers backend: a CachingGenerator over one `DynamicCache`.

CPU and fp32 by default; CUDA and bf16 when a GPU is present. Prefill is chunked
(``prefill_chunk`` tokens per forward) so activation memory stays bounded on long
documents, and rollback is exact (`DynamicCache.crop`).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import BackendError, MissingDependency
from ..base import YIELD_STEP, CacheSnapshot, CachingGenerator, GenerationParams, Message, Tokenizer, step_pause
from ..copying import CopyState
from ..repeats import NoRepeat

HF_INSTALL = "pip install torch==2.13.0 && pip install 'marginalia[hf]'"


def import_torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise MissingDependency("the transformers backend (torch, transformers)", HF_INSTALL) from exc
    return torch


class HFTokenizer(Tokenizer):
    """Adapter over a Hugging Face fast tokenizer, safe to share between threads.

    A call that encodes sets whether special-token strings are parsed on the shared Rust tokenizer before it
    encodes, so two threads' calls must not interleave: one encoding a document's text would meet the other's
    setting and parse a forged turn boundary in it (readings side by side, an upload indexed beside a reading).
    """

    def __init__(self, tok: Any) -> None:
        self.hf = tok
        self._lock = threading.Lock()

    def encode_with_offsets(
        self, text: str, allow_special: bool = False
    ) -> tuple[list[int], list[tuple[int, int]]]:
        if not text:
            return [], []
        with self._lock:
            enc = self.hf(
                text,
                add_special_tokens=False,
                return_offsets_mapping=True,
                split_special_tokens=not allow_special,
            )
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def decode(self, ids: Sequence[int]) -> str:
        with self._lock:  # not while an encoding call changes the tokenizer's settings
            return str(
                self.hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
            )


def pick_device(device: str = "auto") -> tuple[str, Any]:
    """(device, dtype): CUDA + bf16 when available (or asked), else CPU + fp32."""
    torch = import_torch()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return device, dtype


def cache_keyword(model: Any) -> str:
    """The name ``model``'s forward takes its KV cache by: ``cache`` from transformers 5.24 on (where
    ``past_key_values`` is deprecated), ``past_key_values`` before. A wrapper (peft) is asked for its base."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class TransformersGenerator(CachingGenerator):
    """A causal LM from transformers with one KV cache.

    Args:
        model: a loaded ``PreTrainedModel`` (eval mode, on its device).
        tokenizer: the matching Hugging Face tokenizer (it must have a chat template
            for chat use).
        name: the spec it was loaded from, for reports.
        prefill_chunk: tokens per forward pass during prefill.
    """

    supports_copy = True  # every token's logits are masked to keep a copy (`_constrain`)
    supports_choice_probabilities = True

    def __init__(
        self, model: Any, tokenizer: Any, name: str = "hf", prefill_chunk: int = 512,
        _cache: Any = None, _ids: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.torch = import_torch()
        from transformers import DynamicCache

        self.model = model
        self.hf_tokenizer = tokenizer
        self._tokenizer = HFTokenizer(tokenizer)
        self.name = name
        self.prefill_chunk = prefill_chunk
        self.device = next(model.parameters()).device
        self._cache_kw = cache_keyword(model)
        cfg = model.config
        self.context_window = int(getattr(cfg, "max_position_embeddings", 2048))
        eos = set()
        for source in (getattr(model, "generation_config", None), cfg):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, (list, tuple)):
                eos.update(int(v) for v in value)
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_ids: frozenset[int] = frozenset(eos)
        self._cache = _cache if _cache is not None else DynamicCache(config=cfg)
        self._ids: list[int] = list(_ids or [])
        # logits after the cache's last token, valid while _logits_at == len(_ids)
        self._logits: Any = None
        self._logits_at = -1

    # -- Generator ---------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        if not getattr(self.hf_tokenizer, "chat_template", None):
            raise BackendError(
                f"{self.name} has no chat template; use an instruct model, or give raw prompts"
            )
        return str(
            self.hf_tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )

    # -- CachingGenerator --------------------------------------------------

    @property
    def length(self) -> int:
        return len(self._ids)

    @property
    def cached_ids(self) -> tuple[int, ...]:
        return tuple(self._ids)

    def _forward(self, ids: Sequence[int]) -> Any:
        """Run ``ids`` through the model on top of the cache; return the last logits."""
        torch = self.torch
        if (pause := step_pause()) is not None:
            pause()
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        with torch.no_grad():
            out = self.model(input_ids=x, use_cache=True, logits_to_keep=1, **{self._cache_kw: self._cache})
        self._ids.extend(int(i) for i in ids)
        self._logits = out.logits[0, -1].float()
        self._logits_at = len(self._ids)
        return self._logits

    def prefill(self, ids: Sequence[int]) -> None:
        ids = list(ids)
        if not ids:
            return
        self.check_fits(self.length + len(ids), what="the prefilled context")
        t0 = time.perf_counter()
        step = self.prefill_chunk if step_pause() is None else min(self.prefill_chunk, YIELD_STEP)
        for i in range(0, len(ids), step):
            self._forward(ids[i:i + step])
        self.usage.prefilled_tokens += len(ids)
        self.usage.evaluated(self._ids, len(self._ids) - len(ids), len(self._ids))
        self.usage.prefill_seconds += time.perf_counter() - t0

    def rollback(self, length: int) -> None:
        self.check_rollback(length)
        if length == self.length:
            return
        if length == 0:
            from transformers import DynamicCache

            self._cache = DynamicCache(config=self.model.config)
        else:
            self._cache.crop(length - len(self._ids))  # transformers 5: negative = tokens to drop
        del self._ids[length:]

    def snapshot(self) -> CacheSnapshot:
        """A copy of the KV tensors of every layer (keys, values)."""
        cache: Any = self._cache  # a DynamicCache of full-attention layers (keys, values per layer)
        layers = tuple((layer.keys.clone(), layer.values.clone()) for layer in cache.layers
                       if getattr(layer, "keys", None) is not None)
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        return CacheSnapshot(tuple(self._ids), layers, int(size))

    def restore(self, snapshot: CacheSnapshot) -> None:
        from transformers import DynamicCache

        layers = snapshot.state
        if not isinstance(layers, tuple):
            raise BackendError("this snapshot holds no transformers cache; take it with snapshot()")
        if snapshot.ids and not layers:
            raise BackendError("this snapshot holds tokens but no cache entries")
        data = [(k.clone().to(self.device), v.clone().to(self.device)) for k, v in layers]
        self._cache = DynamicCache(data, config=self.model.config) if data \
            else DynamicCache(config=self.model.config)
        self._ids = list(snapshot.ids)
        self._logits, self._logits_at = None, -1

    def cache_identity(self) -> str:
        import transformers

        return (f"transformers {transformers.__version__}:{self.name}:{self.model.config._name_or_path}:"
                f"{self.model.dtype}:{self.device}")

    def state_bytes(self, snapshot: CacheSnapshot) -> bytes:
        from safetensors.torch import save

        tensors = {}
        for i, (k, v) in enumerate(snapshot.state or ()):
            tensors[f"k{i}"], tensors[f"v{i}"] = k.contiguous().cpu(), v.contiguous().cpu()
        return bytes(save(tensors))

    def snapshot_from_bytes(self, ids: Sequence[int], data: bytes) -> CacheSnapshot:
        from safetensors.torch import load

        try:
            tensors = load(data)
            layers = tuple((tensors[f"k{i}"], tensors[f"v{i}"]) for i in range(len(tensors) // 2))
        except Exception as exc:  # safetensors raises its own error types for damaged data
            raise BackendError(f"not a stored transformers cache: {exc}") from exc
        if any(k.shape[-2] != len(ids) for k, _ in layers):
            raise BackendError("the stored cache does not hold the stored tokens")
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        return CacheSnapshot(tuple(ids), layers, int(size))

    def fork(self, keep_cache: bool = True) -> TransformersGenerator:
        import copy

        other = TransformersGenerator(
            self.model, self.hf_tokenizer, name=self.name, prefill_chunk=self.prefill_chunk,
            _cache=copy.deepcopy(self._cache) if keep_cache and self._ids else None,
            _ids=self._ids if keep_cache else None,
        )
        if keep_cache and self._logits_at == len(self._ids):
            other._logits, other._logits_at = self._logits, self._logits_at
        other.usage = self.usage  # one account per loaded model
        return other

    def _pending_logits(self) -> Any:
        if self._logits_at == len(self._ids) and self._logits is not None:
            return self._logits
        if not self._ids:
            raise BackendError("nothing to generate from: the cache is empty and no prompt was given")
        # the logits of the last token were lost by a rollback: recompute them
        last = self._ids[-1]
        self.rollback(len(self._ids) - 1)
        self.usage.prefilled_tokens += 1
        logits = self._forward([last])
        self.usage.evaluated(self._ids, len(self._ids) - 1, len(self._ids))
        return logits

    def _next_logits(self, token_ids: Sequence[int]) -> list[float]:
        logits = self._pending_logits()
        return [float(v) for v in logits[list(token_ids)].tolist()]

    def score(self, ids: Sequence[int]) -> list[float]:
        """Log-probabilities of ``ids`` after the cache: the first from the cache's last logits, the rest from
        forward passes over ``ids[:-1]`` with every position's logits, cropped off the cache afterwards."""
        ids = [int(i) for i in ids]
        if not ids:
            return []
        self.check_score(ids)
        torch = self.torch
        first = torch.log_softmax(self._pending_logits().float(), dim=-1)[ids[0]]
        out = [float(first.item())]
        rest, added = ids[:-1], 0
        t0 = time.perf_counter()
        try:
            for at in range(0, len(rest), self.prefill_chunk):
                piece = rest[at:at + self.prefill_chunk]
                x = torch.tensor([piece], dtype=torch.long, device=self.device)
                with torch.no_grad():
                    logits = self.model(input_ids=x, use_cache=True, **{self._cache_kw: self._cache}).logits[0]
                added += len(piece)
                lp = torch.log_softmax(logits.float(), dim=-1)
                targets = torch.tensor(ids[at + 1:at + 1 + len(piece)], device=lp.device)
                out.extend(float(v) for v in lp.gather(1, targets[:, None])[:, 0].tolist())
        finally:
            if added:
                self._cache.crop(-added)  # the cache's own record (_ids, _logits) never counted them
            self.usage.prefilled_tokens += added
            self.usage.prefill_seconds += time.perf_counter() - t0
        return out

    #: attention paths that honour the custom 4D additive mask `branches` passes (flash-attention kernels take
    #: no such mask: a model loaded with one decodes its margins one after another)
    MASKED_ATTENTION = ("eager", "sdpa")

    @property
    def max_branches(self) -> int:  # type: ignore[override]
        """Branches decoded side by side (`branches`); each step's attention mask grows with them and the
        cache. 1 when the model's attention path would ignore the mask."""
        path = getattr(self.model.config, "_attn_implementation", None) or "eager"
        return 16 if path in self.MASKED_ATTENTION else 1

    def branches(self, ends: Sequence[int], suffix_ids: Sequence[int],
                 params: GenerationParams) -> list[tuple[str, int]]:
        """Branches appended to the one cache, each token at its branch's own position and masked to see only
        the first ``end`` cached tokens and its own branch (a custom 4D attention mask): one forward pass a
        step for all of them, no copy of the cache. The branches' entries are cropped off afterwards.

        One branch alone gives the tokens `generate_from_cache` gives, up to rounding: the attention
        covers the masked entries too, so its sums are taken over other shapes.
        """
        ends, suffix = [int(e) for e in ends], [int(t) for t in suffix_ids]
        if not ends:
            return []
        self.check_branches(ends, suffix, params)
        torch = self.torch
        base = self.length
        dtype = next(self.model.parameters()).dtype
        blocked = torch.finfo(dtype).min
        end_of = torch.tensor(ends, device=self.device)
        # every cache entry: the branch it belongs to (-1: the shared tokens) and its position
        owner = torch.full((base,), -1, dtype=torch.long, device=self.device)
        position = torch.arange(base, device=self.device)
        rng = self._rng(params)

        def decode(items: list[tuple[int, int, int, bool]]) -> dict[int, Any]:
            nonlocal owner, position
            branch = torch.tensor([j for j, _, _, _ in items], device=self.device)
            at = torch.tensor([p for _, p, _, _ in items], device=self.device)
            owner, position = torch.cat([owner, branch]), torch.cat([position, at])
            sees = ((owner[None, :] < 0) & (position[None, :] < end_of[branch][:, None])) \
                | ((owner[None, :] == branch[:, None]) & (position[None, :] <= at[:, None]))
            mask = torch.zeros(sees.shape, dtype=dtype, device=self.device).masked_fill_(~sees, blocked)
            wanted = [i for i, item in enumerate(items) if item[3]]
            with torch.no_grad():
                out = self.model(input_ids=torch.tensor([[t for _, _, t, _ in items]], device=self.device),
                                 position_ids=at[None, :], attention_mask=mask[None, None],
                                 use_cache=True, **{self._cache_kw: self._cache},
                                 logits_to_keep=torch.tensor(wanted or [0], dtype=torch.long,
                                                               device=self.device))
            return {items[i][0]: out.logits[0, r].float() for r, i in enumerate(wanted)}

        def pick(logits: Any) -> int:
            return self._sample(logits.cpu() if rng is not None else logits, params, rng)

        try:
            return self._decode_branches(ends, suffix, params, decode, pick, self.prefill_chunk)
        finally:
            added = self._cache.get_seq_length() - base
            if added > 0:
                self._cache.crop(-added)  # the branches' entries; _ids and _logits never counted them

    def _sample(self, logits: Any, params: GenerationParams, rng: Any) -> int:
        torch = self.torch
        if params.temperature <= 0:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < params.top_p
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=rng).item())

    def _unrepeated(self, logits: Any, guard: NoRepeat | None) -> Any:
        """``logits`` with the tokens that would repeat a run masked out (unless nothing else is left)."""
        banned = guard.banned() if guard is not None else []
        if not banned:
            return logits
        masked = logits.clone()
        masked[banned] = float("-inf")
        return masked if bool(self.torch.isfinite(masked).any()) else logits

    def _keep(self, logits: Any, allowed: list[int]) -> Any:
        """``logits`` with every token but ``allowed`` masked out."""
        masked = self.torch.full_like(logits, float("-inf"))
        masked[allowed] = logits[allowed]
        return masked

    def _constrain(self, logits: Any, copying: CopyState | None) -> Any:
        """``logits`` with all that would break the copy masked (with copy decoding)."""
        if copying is not None:
            logits = self._keep(logits, copying.mask(logits.float().cpu().numpy(), self.eos_ids).tolist())
        return logits

    def _rng(self, params: GenerationParams) -> Any:
        """The seeded generator sampling draws from (None for greedy decoding)."""
        if params.temperature <= 0:
            return None
        rng = self.torch.Generator(device="cpu")
        rng.manual_seed(params.seed if params.seed is not None else 0)
        return rng

    def _sample_tokens(self, params: GenerationParams) -> Iterator[int]:
        rng = self._rng(params)
        copying, guard = self.copy_state(params), self.repeat_guard(params)
        logits = self._constrain(self._pending_logits(), copying)
        while True:
            logits = self._unrepeated(logits, guard)
            token = self._sample(logits.cpu() if rng is not None else logits, params, rng)
            yield token
            if copying is not None:
                copying.feed(token)
            if guard is not None:
                guard.feed(token)
            logits = self._constrain(self._forward([token]), copying)
