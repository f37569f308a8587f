"""Instruction tuning of the composition client: tuning data labelled by a larger model, and LoRA tuning.

- `make_examples` cuts real texts into prefixes, retrieves the memory the composer would hold for each,
  and labels each with the larger model's continuation, given the client's own prompt (instruction,
  memory, text) in the larger model's template: the true continuation often disagrees with the memory,
  and the client should learn to use the memory; `relabel_examples` labels them again (another label
  model or length) on the same prefixes and memory;
- `tune` fine-tunes the client with LoRA (peft, over transformers) on those labels, the loss on the label
  tokens only, and saves the adapter and a merged model folder that loads by spec (``hf:<folder>``); a
  stopped tuning goes on from its last checkpoint when run again (`checkpoint`).

peft and torch are imported only when tuning starts (the ``tune`` and ``hf`` extras).
"""

from __future__ import annotations

from .data import (
    Cut,
    DataReport,
    TuningExample,
    cut_text,
    label_continuation,
    make_examples,
    read_examples,
    relabel_examples,
)
from .train import IGNORE_LABEL, Row, TuneReport, collate, label_loss, split_held_out, training_row, tune

__all__ = [
    "IGNORE_LABEL", "Cut", "DataReport", "Row", "TuneReport", "TuningExample", "collate", "cut_text",
    "label_continuation", "label_loss", "make_examples", "read_examples", "relabel_examples",
    "split_held_out", "training_row", "tune",
]
