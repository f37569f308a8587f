"""WiM on a GPU: the transformers backend in bf16, with a randomly initialised model of a real size.

No weights reach a lent GPU machine (it has no network, and what travels to it is small), so the model is
a real model's shape with random weights (SmolLM2-1.7B's by default, its window raised to hold the
document) and the embedded SmolLM2's tokenizer. Its answers mean nothing; what is measured is what a user
of `--device cuda` gets that does not depend on the weights:

- the load path a user takes: the model saved as a Hugging Face folder and loaded by spec (`hf:DIR`,
  `--device cuda`), which picks bf16;
- exactness in bf16: chunked prefill against one forward pass over the document, and a rollback followed by
  prefilling the same tokens again, against the logits before it (max |difference|, same top token);
- speed over a document of ``--tokens`` tokens (the bundled report, repeated): prefill tokens/s, long
  context's answer, WiM's first question (reading, margins, answer) with margins one after another and
  side by side (`batch_margins`), a second question from the kept reading; peak GPU memory.

Every margin and answer runs to its token limit (random weights seldom stop), so the times are upper
bounds for those lengths.

    python lab/gpu_read.py [--shape smollm2-1.7b] [--tokens 8000] [--rounds 3] [--save F.json]
    python lab/gpu_read.py --measurements F.json    # write the section from a saved run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _lab_common import command_line, finish, git_commit

#: model shapes (from the models' published configs); the window is set from --tokens
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                         num_key_value_heads=32, rope_theta=130000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "smollm2-360m": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                         num_key_value_heads=5, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    # for trying the script on a CPU
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
}
QUESTIONS = ("Which vessel arrived first?", "What was decided about the pier?")


def embedded_tokenizer_dir(out: Path) -> Path:
    """The embedded SmolLM2's tokenizer files, saved under ``out`` from the model loaded on transformers (which
    converts its GGUF once)."""
    from marginalia import load_model

    gen = load_model("smollm2", backend="transformers", device="cpu")
    gen.hf_tokenizer.save_pretrained(out)
    return out


def build_model(shape: str, tokenizer_dir: Path, window: int, out: Path) -> dict[str, Any]:
    """A random ``shape`` model with the tokenizer, saved under ``out`` (bf16); what it is."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = LlamaConfig(vocab_size=len(tok), max_position_embeddings=window, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id, pad_token_id=None, **SHAPES[shape])
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"shape": shape, "params": params, "window": window}


def document(tokenizer: Any, tokens: int) -> str:
    """The bundled report repeated, cut to ``tokens`` tokens."""
    from marginalia import demo

    text, _ = demo()
    parts = [text]
    while len(tokenizer.encode("\n\n".join(parts))) < tokens:
        parts.append(text)
    ids = tokenizer.encode("\n\n".join(parts))[:tokens]
    return str(tokenizer.decode(ids))


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def exactness(gen: Any, ids: list[int]) -> dict[str, Any]:
    """Chunked prefill against one forward pass; a rollback and the same tokens again against the first
    logits."""
    import torch
    from transformers import DynamicCache

    fresh = gen.fork(keep_cache=False)
    fresh.prefill(ids)
    chunked = fresh._pending_logits().float()
    with torch.no_grad():
        out = gen.model(input_ids=torch.tensor([ids], device=gen.device), use_cache=True, logits_to_keep=1,
                        **{cache_keyword(gen.model): DynamicCache(config=gen.model.config)})
    whole = out.logits[0, -1].float()
    back = 300
    fresh.rollback(len(ids) - back)
    fresh.prefill(ids[-back:])
    again = fresh._pending_logits().float()
    scale = float(whole.abs().max())

    def diff(a: Any, b: Any) -> dict[str, Any]:
        return {"max_abs": float((a - b).abs().max()), "same_top": bool(int(a.argmax()) == int(b.argmax()))}

    return {"logit_scale": scale, "chunk": gen.prefill_chunk, "back": back,
            "chunked_vs_whole": diff(chunked, whole), "rollback_vs_first": diff(again, chunked)}


def cache_keyword(model: Any) -> str:
    """The name ``model``'s forward takes its KV cache by (``cache`` in newer transformers, where
    ``past_key_values`` is deprecated)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def timed(fn: Any) -> tuple[Any, float]:
    sync()
    t0 = time.perf_counter()
    result = fn()
    sync()
    return result, time.perf_counter() - t0


def stats_of(answer: Any, wall: float) -> dict[str, Any]:
    s = answer.stats
    return {"wall_s": wall, "context_tokens": s.context_tokens, "prefilled_context": s.prefilled_context_tokens,
            "cached_context": s.cached_context_tokens, "margin_s": s.margin_seconds,
            "margin_tokens": s.generated_margin_tokens, "answer_tokens": s.generated_answer_tokens,
            "margins": len(answer.margins)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    from marginalia import load_model, make_pattern

    t_start = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="gpu-read-"))
    tok_dir = Path(args.tokenizer) if args.tokenizer else embedded_tokenizer_dir(Path(tempfile.mkdtemp(prefix="gpu-read-tok-")))
    model_info = build_model(args.shape, tok_dir, args.tokens + 2048, folder)
    gen, load_s = timed(lambda: load_model(f"hf:{folder}", device=args.device, backend="transformers"))
    dtype = str(next(gen.model.parameters()).dtype).replace("torch.", "")
    print(f"loaded {args.shape} ({model_info['params'] / 1e9:.2f} B parameters) on {gen.device} as {dtype} "
          f"in {load_s:.1f} s", flush=True)
    text = document(gen.hf_tokenizer, args.tokens)
    ids = gen.tokenizer.encode(text)
    exact = exactness(gen, ids)
    print(f"exactness: {json.dumps(exact)}", flush=True)

    prefill_s = []
    for _ in range(args.rounds):
        fresh = gen.fork(keep_cache=False)
        _, seconds = timed(lambda f=fresh: f.prefill(ids))
        prefill_s.append(seconds)
        del fresh
    lc = make_pattern("lc", gen.fork(keep_cache=False))
    runs: dict[str, list[dict[str, Any]]] = {"lc": [], "wim_first": [], "wim_first_batched": [],
                                             "wim_second": [], "wim_second_batched": []}
    for r in range(args.rounds):  # interleaved, so a slow moment hurts every pattern
        answer, wall = timed(lambda: lc.answer(text, QUESTIONS[0]))
        runs["lc"].append(stats_of(answer, wall))
        for batched in (False, True):
            suffix = "_batched" if batched else ""
            reader = make_pattern("wim", gen.fork(keep_cache=False), batch_margins=batched).reader(text)
            answer, wall = timed(lambda rd=reader: rd.answer(QUESTIONS[0]))
            runs["wim_first" + suffix].append(stats_of(answer, wall))
            answer, wall = timed(lambda rd=reader: rd.answer(QUESTIONS[1]))
            runs["wim_second" + suffix].append(stats_of(answer, wall))
            del reader
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]['wall_s']:.2f} s" for k, v in runs.items()), flush=True)
    return {
        "model": model_info, "dtype": dtype, "device": str(gen.device), "load_s": load_s,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "document_tokens": len(ids), "exactness": exact,
        "prefill_s": prefill_s, "runs": runs, "rounds": args.rounds, "command": command_line(),
        "first_batched": True,  # batch_margins batches a first reading's margins too
        "commit": git_commit(), "total_min": (time.perf_counter() - t_start) / 60,
    }


def render(m: dict[str, Any]) -> str:
    def med(name: str, key: str = "wall_s") -> float:
        return statistics.median(r[key] for r in m["runs"][name])

    def row(label: str, name: str) -> str:
        r = m["runs"][name][0]
        return (f"| {label} | {med(name):.2f} | {r['prefilled_context']} | {r['cached_context']} | "
                f"{med(name, 'margin_s'):.2f} | {r['margin_tokens']} | {r['answer_tokens']} |")

    ex = m["exactness"]
    doc = m["document_tokens"]
    prefill = statistics.median(m["prefill_s"])
    seq, bat = med("wim_second", "margin_s"), med("wim_second_batched", "margin_s")
    per_token = {name: 1000 * med(name, "margin_s") / max(m["runs"][name][0]["margin_tokens"], 1)
                 for name in ("wim_second", "wim_second_batched")}
    where = f"{m['gpu']}" if m["gpu"] else "CPU"
    return "\n".join([
        "## WiM on a GPU, random weights of a real size (`lab/gpu_read.py`)",
        "",
        f"Command: `{m['command']}` · commit {m['commit']} · {where}, {m['cores']} cores, Python {m['python']}, "
        f"torch {m['torch']}, transformers {m['transformers']} · total {m['total_min']:.1f} min"
        + (f" · this section written from its saved numbers by `{m['written_by']}`" if "written_by" in m else ""),
        "",
        f"Model: {m['model']['shape']}'s shape, {m['model']['params'] / 1e9:.2f} B parameters, random weights "
        f"(the embedded SmolLM2's tokenizer), window {m['model']['window']}; saved as a folder and loaded by "
        f"spec `hf:DIR --device {m['device'].split(':')[0]}`: it came up as {m['dtype']} on {m['device']} "
        f"in {m['load_s']:.1f} s. The document: the bundled report repeated, {doc} tokens. Each time is the "
        f"median of {m['rounds']} rounds, the patterns interleaved. Random weights seldom stop, so every margin "
        "and answer runs to its token limit: the times are for those lengths.",
        "",
        "| | wall (s) | document tokens prefilled | from the kept reading | margin phase (s) | margin tokens "
        "| answer tokens |",
        "|---|---:|---:|---:|---:|---:|---:|",
        row("long context", "lc"),
        row("WiM, first question, margins one after another (the default)", "wim_first"),
        row("WiM, first question, `batch_margins` (the whole document read, then its margins side by side)"
            if m.get("first_batched") else  # measured before a first reading batched its margins
            "WiM, first question, `batch_margins` (a first reading writes its margins one after another "
            "either way)", "wim_first_batched"),
        row("WiM, second question from the kept reading", "wim_second"),
        row("WiM, second question from the kept reading, `batch_margins`", "wim_second_batched"),
        "",
        f"- Prefill of the document alone: {prefill:.3f} s, {doc / prefill:,.0f} tokens/s "
        f"({ex['chunk']}-token chunks).",
        f"- WiM's first question against long context's: {med('wim_first') / med('lc'):.1f}x the wall time "
        "(every segment's margin written as it is read, so a reader can stop early)"
        + (f"; {med('wim_first_batched') / med('lc'):.1f}x with `batch_margins`." if m.get("first_batched") else "."),
        f"- The second question from the kept reading: {med('wim_second') / med('wim_first'):.2f}x the first's "
        f"wall time by default, {med('wim_second_batched') / med('wim_first'):.2f}x with `batch_margins` "
        f"({m['runs']['wim_second'][0]['prefilled_context']} of {doc} document tokens prefilled again). Its "
        f"margin phase side by side against one after another: {bat / seq:.2f}x "
        f"({per_token['wim_second_batched']:.1f} against {per_token['wim_second']:.1f} ms per margin token, "
        f"{m['runs']['wim_second'][0]['margins']} margins).",
        f"- Exactness in {m['dtype']} (logits span ±{ex['logit_scale']:.1f}): chunked prefill against one forward pass, "
        f"max |difference| {ex['chunked_vs_whole']['max_abs']:.3f}, same top token: "
        f"{'yes' if ex['chunked_vs_whole']['same_top'] else 'NO'}; rolled back {ex['back']} tokens and "
        f"prefilled them again, against the first logits: {ex['rollback_vs_first']['max_abs']:.3f}, same top "
        f"token: {'yes' if ex['rollback_vs_first']['same_top'] else 'NO'}.",
        f"- Peak GPU memory: {m['peak_gib']:.1f} GiB." if m["peak_gib"] is not None else "- No GPU: CPU run.",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-1.7b")
    ap.add_argument("--tokens", type=int, default=8000, help="document tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to try the script")
    ap.add_argument("--tokenizer", help="a folder with the tokenizer files (default: the embedded SmolLM2's)")
    ap.add_argument("--save", help="also write the measurements to this JSON file")
    ap.add_argument("--measurements", help="write the section from this saved JSON instead of measuring")
    ap.add_argument("--section", default="gpu_read")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave lab/findings alone")
    args = ap.parse_args()
    if args.tokenizer and not Path(args.tokenizer, "tokenizer.json").is_file():
        ap.error(f"no tokenizer.json in {args.tokenizer}; give a folder with the tokenizer files")
    if args.measurements:
        try:
            m = json.loads(Path(args.measurements).read_text("utf-8"))
        except (OSError, ValueError) as exc:
            sys.exit(f"gpu_read.py: cannot read the measurements in {args.measurements} ({exc}); give the JSON "
                     "a run saved with --save")
        m["written_by"] = command_line()
    else:
        m = measure(args)
        if args.save:
            Path(args.save).write_text(json.dumps(m, indent=1), "utf-8")
    body = render(m)
    finish("gpu_read", body, write=not args.no_write, section=args.section)


if __name__ == "__main__":
    main()
