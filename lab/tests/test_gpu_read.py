"""lab/gpu_read.py on a tiny random Llama on the CPU: the measurements it makes and the section it writes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")


def test_gpu_read_measures_exactness_and_a_kept_reading(load_script: Any, tiny_tokenizer: Any,
                                                        tmp_path: Path) -> None:
    import torch

    if (os.cpu_count() or 1) <= 2:
        torch.set_num_threads(1)  # a second thread fighting other processes is slower, not faster
    gpu_read = load_script("gpu_read")
    tok = tiny_tokenizer
    tok.save_pretrained(tmp_path / "tok")
    args = argparse.Namespace(shape="tiny", tokens=700, rounds=1, device="cpu", tokenizer=str(tmp_path / "tok"))
    m = gpu_read.measure(args)
    assert m["document_tokens"] == 700 and m["dtype"] == "float32" and m["gpu"] is None
    for check in ("chunked_vs_whole", "rollback_vs_first"):
        assert m["exactness"][check]["max_abs"] < 1e-4 and m["exactness"][check]["same_top"]
    runs = {name: r[0] for name, r in m["runs"].items()}
    assert runs["lc"]["prefilled_context"] == 700 and runs["lc"]["margins"] == 0
    assert runs["wim_first"]["prefilled_context"] == 700
    for name in ("wim_second", "wim_second_batched"):  # the kept reading: nothing of the document read again
        assert runs[name]["prefilled_context"] == 0 and runs[name]["cached_context"] == 700
        assert runs[name]["margins"] == runs["wim_first"]["margins"] > 1
    body = gpu_read.render(m)
    assert "Exactness in float32" in body and "No GPU: CPU run." in body
    assert "| WiM, second question from the kept reading, `batch_margins` |" in body
    assert "(the whole document read, then its margins side by side) |" in body
    old = {k: v for k, v in m.items() if k != "first_batched"}  # numbers saved before first readings batched
    assert "one after another either way) |" in gpu_read.render(old)
