"""LoRA tuning of the composition client on tuning examples (peft over transformers, CPU by default).

Each example becomes one training row: the client's own prompt for the example's text and memory
(`ClientPrompt`), then the label's tokens; the loss is on the label tokens only (the prompt's positions are
labelled -100, which the loss ignores). Whole texts are held out (by source) to measure the label loss
before and after. The result is a folder with the adapter (``adapter/``), the merged model
(``model/``, which loads as ``hf:<folder>/model``), ``tuning.json`` (settings, losses, data) and, when the
client came from a GGUF file (``smollm2``, ``gguf:``), the adapter for llama.cpp (``adapter.gguf``). The whole
folder loads as ``tuned:<folder>``: on llama.cpp with the adapter when it can, else the merged model.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import BackendError, MissingDependency, UserError
from ...files import swap_folder
from ...models.base import Generator
from ...models.llamacpp.lora_gguf import ADAPTER_FILE, TUNED_RECORD, write_lora_gguf
from ...models.registry import gguf_file
from ...options import TuneOptions
from ..prompt import ClientPrompt
from . import checkpoint
from .data import TuningExample

TUNE_INSTALL = "pip install 'marginalia[tune]'"
#: the label that the loss ignores (torch's cross-entropy default)
IGNORE_LABEL = -100
#: what a tuned folder's record is called (its presence marks a folder this code may replace)
RECORD = TUNED_RECORD


@dataclass(frozen=True)
class Row:
    """One training sequence: ``input_ids`` and, per position, the token to predict there or `IGNORE_LABEL`."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]


def training_row(prompt: ClientPrompt, example: TuningExample) -> Row | None:
    """The row for an example: the client's prompt, then the label; loss on the label only (None: a blank
    label, nothing to learn)."""
    label_ids = prompt.generator.tokenizer.encode(example.label)
    if not example.label.strip() or not label_ids:
        return None
    prompt_ids = prompt.for_text(example.context, example.memory)
    return Row(tuple(prompt_ids) + tuple(label_ids), (IGNORE_LABEL,) * len(prompt_ids) + tuple(label_ids))


def collate(rows: Sequence[Row], pad_id: int, torch: Any) -> tuple[Any, Any, Any]:
    """(input_ids, attention_mask, labels), each of shape [batch, longest row]: padded on the right, pads
    masked out of attention and labelled `IGNORE_LABEL`."""
    width = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_LABEL, dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row.input_ids)
        ids[i, :n] = torch.tensor(row.input_ids)
        mask[i, :n] = 1
        labels[i, :n] = torch.tensor(row.labels)
    return ids, mask, labels


def split_held_out(examples: Sequence[TuningExample], share: float,
                   seed: int = 0) -> tuple[list[TuningExample], list[TuningExample]]:
    """(training, held out): whole texts held out, by source, about ``share`` of them (at least one when
    the share is above zero and there are two texts or more)."""
    sources = sorted({e.source for e in examples},
                     key=lambda s: hashlib.sha256(f"{seed}:{s}".encode()).hexdigest())
    n = 0 if share <= 0 or len(sources) < 2 else min(max(1, round(share * len(sources))), len(sources) - 1)
    held = set(sources[:n])
    return [e for e in examples if e.source not in held], [e for e in examples if e.source in held]


@dataclass(frozen=True)
class TuneReport:
    """What `tune` did, and where the tuned model is."""

    folder: Path
    spec: str  # loads the merged model: hf:<folder>/model
    base_model: str
    train_examples: int
    held_out_examples: int
    blank_labels: int
    steps: int
    losses: tuple[float, ...]  # the training loss of each step
    held_out_before: float | None  # mean loss per label token on the held-out examples (nats)
    held_out_after: float | None
    label_tokens: int  # label tokens trained on (all rows)
    seconds: float
    kept_step: int = 0  # the step whose adapters were saved (the last, unless eval_every chose an earlier one)
    held_out_curve: tuple[tuple[int, float], ...] = ()  # (step, held-out label loss) at each measurement

    @property
    def perplexity_before(self) -> float | None:
        return None if self.held_out_before is None else math.exp(self.held_out_before)

    @property
    def perplexity_after(self) -> float | None:
        return None if self.held_out_after is None else math.exp(self.held_out_after)


def import_peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise MissingDependency("LoRA tuning (peft)", TUNE_INSTALL) from exc
    return peft


def label_loss(model: Any, rows: Sequence[Row], batch_size: int, pad_id: int, torch: Any) -> float:
    """The mean loss per label token (nats) of ``model`` on ``rows``."""
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        for at in range(0, len(rows), batch_size):
            ids, mask, labels = collate(rows[at:at + batch_size], pad_id, torch)
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
            # position t predicts token t + 1
            target = labels[:, 1:].to(device)
            total += float(torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_LABEL,
                reduction="sum"))
            count += int((target != IGNORE_LABEL).sum())
    model.train(was_training)
    return total / max(count, 1)


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The processor's feature flags as Linux lists them (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text("utf-8", errors="replace")
    except OSError:
        return frozenset()
    return frozenset(word for line in text.splitlines() if line.startswith("flags") for word in line.split())


def step_precision(choice: str, device: Any, torch: Any) -> str:
    """``fp32`` or ``bf16``: what a training step computes in under the option ``choice`` on ``device``."""
    if choice != "auto":
        return choice
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    flags = _cpu_flags()
    return "bf16" if device.type == "cpu" and "avx512_bf16" in flags and "amx_bf16" not in flags else "fp32"


def learning_rate(step: int, options: TuneOptions) -> float:
    """The learning rate of optimizer step ``step`` (1-based) under ``options.schedule``: it rises over the
    warmup steps, then falls towards zero, which it would reach one step after the last (linear, cosine), or
    stays (constant). A pure function of the step, so a resumed tuning takes up the schedule where it stopped."""
    peak, warmup, steps = options.learning_rate, options.warmup_steps, options.steps
    if step <= warmup:
        return peak * step / (warmup + 1)
    if options.schedule == "constant":
        return peak
    done = (step - warmup - 1) / max(1, steps - warmup)  # 0 at the first step after warmup
    if options.schedule == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * done))
    return peak * (1.0 - done)


def tune(examples: Sequence[TuningExample], generator: Generator, out: str | Path,
         options: TuneOptions | None = None, *, data_path: str | Path | None = None,
         on_step: Callable[[int, int, float], None] | None = None,
         log: Callable[[str], None] | None = None) -> TuneReport:
    """Tune the client ``generator`` with LoRA on ``examples``; write the adapter, the merged model and the
    record into the folder ``out`` (written beside it, then renamed into place: a crash never leaves half a
    folder).

    The generator's own weights are not touched (training runs on a copy). Every
    ``options.checkpoint_every`` steps the training state is saved beside ``out``; the same tuning run again
    after a crash or Ctrl-C goes on from there and ends as an uninterrupted run would (`checkpoint`).

    Args:
        examples: the tuning examples (see `make_examples`).
        generator: the client, in process on transformers (``smollm2`` with ``backend="transformers"``,
            ``hf:<folder>``).
        out: the folder to write; an earlier tuning's folder there is replaced.
        options: LoRA settings, steps, batch, held-out share.
        data_path: where the examples came from (kept in the record).
        on_step: ``(step, steps, loss)`` after each step.
        log: one line per stage.

    Raises:
        UserError: a model that is not on transformers, no usable examples, or ``out`` is a folder of
            something else.
        MissingDependency: peft (the ``tune`` extra) or torch is missing.
    """
    from ...models.hf.backend import TransformersGenerator, import_torch

    options = options or TuneOptions()
    if not isinstance(generator, TransformersGenerator):
        raise UserError(f"tuning needs the client in process on transformers; {generator.name} is a "
                        f"{type(generator).__name__}: load it with backend 'transformers' (smollm2, gguf:<file>) "
                        "or give an hf:<folder>")
    torch = import_torch()
    peft = import_peft()
    folder = Path(out).expanduser()
    _check_out(folder)
    say = log or (lambda _: None)
    t0 = time.perf_counter()

    train, held = split_held_out(examples, options.held_out, options.seed)
    longest = max((len(generator.tokenizer.encode(e.label)) for e in examples), default=0)
    prompt = ClientPrompt(generator, suggestion_tokens=longest,
                          window=min(options.max_tokens, generator.context_window))
    train_rows = [r for e in train if (r := training_row(prompt, e)) is not None]
    held_rows = [r for e in held if (r := training_row(prompt, e)) is not None]
    blank = len(train) + len(held) - len(train_rows) - len(held_rows)
    if not train_rows:
        raise UserError(f"no examples to train on ({len(examples)} given, {blank} with a blank label, "
                        f"{len(held_rows)} held out); make more tuning data")
    tok = generator.hf_tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    torch.manual_seed(options.seed)
    model = copy.deepcopy(generator.model)
    device = next(model.parameters()).device
    precision = step_precision(options.precision, device, torch)
    options = options.model_copy(update={"precision": precision})  # a checkpoint resumes in the same format
    say(f"training steps in {precision}" + (" (autocast; adapters, optimizer and held-out loss in fp32)"
                                            if precision == "bf16" else ""))
    key = checkpoint.fingerprint(generator.name, options, train_rows, held_rows)
    saved_at = checkpoint.checkpoint_path(folder)
    payload, found = checkpoint.load(saved_at, key, options.steps, torch)
    if found:
        say(found)
    state = checkpoint.restored(payload) if payload is not None else checkpoint.TrainingState()
    if payload is None and held_rows:
        state.held_out_before = label_loss(model, held_rows, options.batch_size, pad_id, torch)
        say(f"held-out label loss before: {state.held_out_before:.3f} ({len(held_rows)} examples)")
    modules: str | list[str] = options.modules if options.modules == "all-linear" else \
        [m.strip() for m in options.modules.split(",") if m.strip()]
    config = peft.LoraConfig(r=options.rank, lora_alpha=options.alpha, lora_dropout=options.dropout,
                             target_modules=modules, task_type="CAUSAL_LM")
    try:
        lora = peft.get_peft_model(model, config)
    except ValueError as exc:  # peft names the modules it could not find
        raise UserError(f"cannot put LoRA adapters on {options.modules!r}: {exc}") from exc
    optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=options.learning_rate)
    rng = random.Random(options.seed)
    if payload is not None:  # go on as if the run had never stopped
        peft.set_peft_model_state_dict(lora, payload["adapters"])
        optimizer.load_state_dict(payload["optimizer"])
        rng.setstate(checkpoint.python_rng_state(payload["rng"]))
        torch.set_rng_state(payload["torch_rng"])
    measure = bool(options.eval_every and held_rows)
    lora.train()
    for step in range(state.step + 1, options.steps + 1):
        batch: list[Row] = []
        while len(batch) < min(options.batch_size, len(train_rows)):
            if not state.order:
                state.order = list(range(len(train_rows)))
                rng.shuffle(state.order)
            batch.append(train_rows[state.order.pop()])
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, options)
        ids, mask, labels = collate(batch, pad_id, torch)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = lora(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lora.parameters(), 1.0)
        optimizer.step()
        state.losses.append(round(loss.item(), 4))
        state.step = step
        if measure and (step % options.eval_every == 0 or step == options.steps):
            held_loss = label_loss(lora, held_rows, options.batch_size, pad_id, torch)
            state.curve.append((step, round(held_loss, 4)))
            say(f"step {step}: held-out label loss {held_loss:.3f}")
            if state.best is None or held_loss < state.best[0]:
                state.best = (held_loss, step, {k: v.detach().clone()
                                                for k, v in peft.get_peft_model_state_dict(lora).items()})
        if options.checkpoint_every and step % options.checkpoint_every == 0 and step < options.steps:
            checkpoint.save(saved_at, key, replace(state, seconds=state.seconds + time.perf_counter() - t0),
                            peft.get_peft_model_state_dict(lora), optimizer, rng.getstate(), torch)
        if on_step:
            on_step(step, options.steps, state.losses[-1])
    best = state.best
    kept_step = options.steps
    if best is not None and best[1] != options.steps:
        peft.set_peft_model_state_dict(lora, best[2])
        kept_step = best[1]
        say(f"kept the adapters of step {kept_step}, where the held-out label loss was lowest")
    lora.eval()
    before = state.held_out_before
    if best is not None:  # the kept step's adapters were measured already
        after: float | None = best[0]
    else:
        after = label_loss(lora, held_rows, options.batch_size, pad_id, torch) if held_rows else None
    if after is not None:
        say(f"held-out label loss after: {after:.3f}")

    report = TuneReport(folder, f"tuned:{folder}", generator.name, len(train_rows), len(held_rows), blank,
                        options.steps, tuple(state.losses), before, after,
                        sum(sum(t != IGNORE_LABEL for t in r.labels) for r in train_rows),
                        round(state.seconds + time.perf_counter() - t0, 2), kept_step, tuple(state.curve))
    _save(lora, tok, folder, report, options, data_path, gguf_file(generator.name), say)
    saved_at.unlink(missing_ok=True)  # the model is saved: the state that led to it is not needed
    say(f"tuned model in {folder} (spec {report.spec})")
    return report


def _check_out(folder: Path) -> None:
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not (folder / RECORD).is_file())):
        raise UserError(f"{folder} exists and is not a tuned model's folder; give another output folder")


def _save(lora: Any, tokenizer: Any, folder: Path, report: TuneReport, options: TuneOptions,
          data_path: str | Path | None, base_gguf: Path | None, say: Callable[[str], None]) -> None:
    """Write adapter/, model/, the record and, for a GGUF base, the llama.cpp adapter into a temporary
    folder beside ``folder``, then swap it in."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp's folder is private; a model folder is read like any other
    try:
        lora.save_pretrained(tmp / "adapter")
        if base_gguf is not None:
            try:
                write_lora_gguf(tmp / "adapter", base_gguf, tmp / ADAPTER_FILE)
            except UserError as exc:  # an architecture llama.cpp adapters are not written for
                say(f"no llama.cpp adapter: {exc}")
        merged = lora.merge_and_unload()
        merged.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        record = {k: v for k, v in asdict(report).items() if k != "folder"}
        record.update(options=options.model_dump(), data=str(data_path) if data_path else None,
                      perplexity_before=report.perplexity_before, perplexity_after=report.perplexity_after)
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n", "utf-8")
        swap_folder(tmp, folder)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, (UserError, MissingDependency)) or not isinstance(exc, Exception):
            raise
        raise BackendError(f"could not save the tuned model in {folder}: {exc}") from exc
