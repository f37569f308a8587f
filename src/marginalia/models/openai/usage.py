"""Usage accounting for requests to an OpenAI-compatible server: what it says it took from its prefix cache
and what it evaluated, booked into a generator's `Usage` with the time to the first text and after it."""

from __future__ import annotations

import threading

from ..base import Usage
from .replies import Timings, UsageReport


def server_counts(usage: UsageReport | None, timings: Timings | None, sent: int) -> tuple[int, int] | None:
    """``(cached, evaluated)``: the prompt tokens a server says it took from its prefix cache and those it
    evaluated, or None when its reply says neither.

    llama.cpp's server gives both in ``timings`` (``cache_n``, ``prompt_n``); vLLM (with
    ``--enable-prompt-tokens-details``), SGLang and OpenAI give ``usage.prompt_tokens_details.cached_tokens``
    beside ``usage.prompt_tokens``. Where a reply gives one of the two, the other is the rest of the prompt
    (its length as the server counts it, else ``sent``, the tokens sent). A bare ``usage.prompt_tokens``
    says how long the prompt was, not what the server computed of it: None.
    """
    cached = timings.cache_n if timings else None
    if cached is None and usage is not None and usage.prompt_tokens_details is not None:
        cached = usage.prompt_tokens_details.cached_tokens
    evaluated = timings.prompt_n if timings else None
    if cached is None and evaluated is None:
        return None
    whole = usage.prompt_tokens if usage is not None and usage.prompt_tokens is not None else None
    if evaluated is None:
        evaluated = (sent if whole is None else whole) - (cached or 0)
    if cached is None:
        cached = (sent if whole is None else whole) - evaluated
    return max(cached, 0), max(evaluated, 0)


def book(account: Usage, lock: threading.Lock, ids: list[int], usage: UsageReport | None,
         timings: Timings | None, generated: int, t0: float, first: float | None, end: float) -> None:
    """Add one request for the prompt ``ids`` to ``account`` (under ``lock``), with the server's own counts of
    its prompt cache; ``generated`` tokens came back. The request began at ``t0``, its first text arrived at
    ``first`` (None: no text) and its last at ``end`` (`time.perf_counter` readings).

    The prompt tokens the server evaluated are taken to be its last ones (a prefix cache serves a
    prefix); in chat mode the server's own tokens may differ from ours, so their positions are ours.
    A reply that says neither how many prompt tokens the server took from its cache nor how many it
    evaluated leaves both unknown: the request is counted in ``cache_unreported`` and in neither
    count (nor in the ledger), never as a prompt evaluated in full.
    """
    sent = len(ids)
    counts = server_counts(usage, timings, sent)
    with lock:
        account.requests += 1
        account.prompt_tokens_sent += sent
        if counts is None:
            account.cache_unreported += 1
        else:
            cached, evaluated = counts
            account.prompt_tokens_cached += cached
            account.prefilled_tokens += evaluated
            account.evaluated(ids, sent - min(evaluated, sent), sent)
        account.generated_tokens += generated
        account.prefill_seconds += (first or end) - t0
        account.decode_seconds += end - (first or end)
