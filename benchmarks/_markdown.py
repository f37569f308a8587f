"""The markdown BENCHMARKS.md is written in: numbers, intervals and ratios as text, tables, and a measurement's
provenance (what made it, where and when). Each script's `summary` and `section` use these."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

Record = dict[str, Any]


def num(value: Any, digits: int = 1, suffix: str = "") -> str:
    """A number with ``digits`` decimals (thousands grouped when it has none), or "–" for none."""
    if value is None:
        return "–"
    if digits == 0:
        return f"{value:,.0f}{suffix}"
    return f"{value:.{digits}f}{suffix}"


def ratio(a: Any, b: Any, digits: int = 2) -> str:
    """``a / b`` as "1.23x", or "–" when either is missing or ``b`` is zero."""
    return "–" if a is None or not b else f"{a / b:.{digits}f}x"


def met(ok: bool) -> str:
    """A goal's verdict: "met" or "not met"."""
    return "met" if ok else "not met"


def estimate(e: dict[str, Any] | None) -> str:
    """A mean with its 95% interval: "0.38 [0.25, 0.52]"."""
    if not e or e.get("mean") is None:
        return "–"
    if e.get("low") is None:
        return f"{e['mean']:.2f}"
    return f"{e['mean']:.2f} [{e['low']:.2f}, {e['high']:.2f}]"


def difference(d: dict[str, Any] | None) -> str:
    """A paired difference with its 95% interval: "+0.12 [+0.00, +0.24]"."""
    if not d or d.get("mean") is None:
        return "–"
    if d.get("low") is None:
        return f"{d['mean']:+.2f}"
    return f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"


def times_interval(r: Sequence[float | None] | None) -> str:
    """A ratio with its paired 95% interval: "1.54x [1.24, 1.87]"."""
    if not r or r[0] is None:
        return "–"
    return f"{r[0]:.2f}x" + (f" [{r[1]:.2f}, {r[2]:.2f}]" if len(r) > 2 and r[1] is not None else "")


def tokens(lengths: Sequence[int]) -> str:
    """Context lengths in thousands of tokens: "8k", "7.5k"."""
    return "/".join(f"{x / 1024:g}k" for x in lengths)


#: short names of the models the runs used (a spec not named here shows as its file's stem)
MODEL_NAMES = {"smollm2": "SmolLM2-135M", "qwen2.5-coder-0.5b-instruct-q4_k_m": "Qwen2.5-Coder-0.5B (Q4_K_M)"}


def model_name(spec: str) -> str:
    """A model spec as a short name."""
    stem = spec.rsplit("/", 1)[-1].removesuffix(".gguf")
    return MODEL_NAMES.get(stem, stem)


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> list[str]:
    """A markdown table; ``align`` holds one letter per column, "l" or "r" (default: the first left, the rest
    right)."""
    align = align or "l" + "r" * (len(header) - 1)
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|",
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def short_commit(commit: str) -> str:
    """A commit as 7 hex digits, with its "+dirty" mark if it has one."""
    head, plus, rest = str(commit).partition("+")
    return head[:7] + plus + rest


def made_by(m: Record) -> str:
    """The command and commit that made a measurement, for a summary row: the script or config the command runs
    (the table says which program runs it; the section quotes the command whole) and the commit."""
    words = str(m["command"]).split()
    named = next((w for w in words if w.endswith((".py", ".toml"))), " ".join(words))
    return f"`{named.rsplit('/', 1)[-1]}` · {short_commit(m['commit'])}"


def provenance(m: Record) -> str:
    """A section's opening line: command, commit (and how many later ones a resumed run went on at), machine,
    date, and where transcribed numbers come from."""
    hardware = str(m["machine"]).split(", Python")[0]  # the software versions stay in the file
    resumed = len(m["numbers"].get("resumed_at") or [])
    line = (f"Made by `{m['command']}` at {short_commit(m['commit'])}"
            + (f" (resumed at {resumed} later commit{'s' * (resumed > 1)})" if resumed else "") + f" on {hardware}, {str(m['date'])[:10]}.")
    if m.get("source"):
        line += f" {m['source']}"
    return line
