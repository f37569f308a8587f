"""LoRA adapters for llama.cpp: a peft adapter written as a GGUF adapter moves llama.cpp's logits to those of
the merged model on transformers (an oracle test), and a tuned folder loads by spec on either backend."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marginalia.errors import UserError
from marginalia.models import load_generator

pytest.importorskip("llama_cpp")
pytest.importorskip("peft")
pytest.importorskip("gguf")

pytestmark = pytest.mark.slow  # every test here loads the embedded model

TEXT = "The harbour opens at dawn and closes at dusk. Rain fell on the market square"
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def adapted(smollm2: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """A peft adapter with random weights large enough to move every logit, written as a llama.cpp adapter;
    (folder, the merged model's last logits on transformers, the base model's)."""
    import peft
    import torch

    from marginalia.models.llamacpp.lora_gguf import write_lora_gguf
    from marginalia.models.weights import embedded_gguf

    folder = tmp_path_factory.mktemp("tuned")
    ids = torch.tensor([smollm2.tokenizer.encode(TEXT)])
    lora = peft.get_peft_model(copy.deepcopy(smollm2.model),
                               peft.LoraConfig(r=4, lora_alpha=8, target_modules=MODULES, init_lora_weights=False))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.05)
    lora.save_pretrained(folder / "adapter")
    write_lora_gguf(folder / "adapter", embedded_gguf(), folder / "adapter.gguf")
    with torch.no_grad():
        merged = lora.merge_and_unload()(input_ids=ids).logits[0, -1].float().numpy()
        base = smollm2.model(input_ids=ids).logits[0, -1].float().numpy()
    (folder / "tuning.json").write_text(json.dumps({"base_model": "smollm2"}), "utf-8")
    return folder, merged, base


def _last_logits(gen: Any) -> np.ndarray:
    gen.prefill(gen.tokenizer.encode(TEXT))
    return np.asarray(gen._pending_logits()).copy()


def test_the_adapter_on_llama_cpp_gives_the_merged_models_logits(adapted: Any) -> None:
    from marginalia.models.llamacpp.backend import LlamaCppGenerator
    from marginalia.models.weights import embedded_gguf

    folder, merged, base = adapted
    assert np.abs(merged - base).max() > 2.0  # the adapter moves the logits far
    with_lora = _last_logits(LlamaCppGenerator(embedded_gguf(), lora=folder / "adapter.gguf"))
    without = _last_logits(LlamaCppGenerator(embedded_gguf()))
    # llama.cpp's quantised arithmetic differs from transformers' fp32 a little, so the adapter must bring
    # llama.cpp most of the way to the merged model; with the query and key rows left in peft's order it
    # did not (it stayed several times further off)
    assert np.abs(with_lora - merged).max() < 0.35 * np.abs(without - merged).max()
    assert np.corrcoef(with_lora, merged)[0, 1] > 0.999


def test_a_tuned_folder_loads_on_llama_cpp_with_its_adapter(adapted: Any) -> None:
    from marginalia.models.llamacpp.backend import LlamaCppGenerator

    folder, merged, _ = adapted
    gen = load_generator(f"tuned:{folder}", backend="llamacpp")
    assert isinstance(gen, LlamaCppGenerator) and gen.name == f"tuned:{folder}"
    assert "lora=" in gen.cache_identity()  # stored readings of the base model are not reused
    # on the weights `smollm2` reads there (its Q8_0 copy), with the adapter most of the way to the merged model
    base = load_generator("smollm2", backend="llamacpp")
    assert gen._shared.path == base._shared.path
    without = _last_logits(base)
    # (Q8_0 rounds the weights once more, so it stays a little further off than the file as shipped in the test
    # above; an adapter not applied, or applied wrong, stays about as far as the base model or further)
    assert np.abs(_last_logits(gen) - merged).max() < 0.5 * np.abs(without - merged).max()


def test_tuned_spec_errors_say_what_to_do(adapted: Any, tmp_path: Path) -> None:
    folder, _, _ = adapted
    with pytest.raises(UserError, match="marginalia tune train"):
        load_generator(f"tuned:{tmp_path}")
    hf_base = tmp_path / "other"
    hf_base.mkdir()
    (hf_base / "tuning.json").write_text(json.dumps({"base_model": "hf:/somewhere"}), "utf-8")
    with pytest.raises(UserError, match="no llama.cpp adapter"):
        load_generator(f"tuned:{hf_base}", backend="llamacpp")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tuning.json").write_text(json.dumps({"base_model": "smollm2"}), "utf-8")
    (broken / "adapter.gguf").write_text("not an adapter", "utf-8")
    with pytest.raises(UserError, match="not a llama.cpp LoRA adapter"):  # llama-cpp-python alone loads without it
        load_generator(f"tuned:{broken}", backend="llamacpp")


def test_other_architectures_are_refused(tmp_path: Path, adapted: Any) -> None:
    import gguf

    from marginalia.models.llamacpp.lora_gguf import write_lora_gguf

    folder, _, _ = adapted
    other = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(other), "qwen2")
    for key, value in (("block_count", 2), ("attention.head_count", 2), ("attention.head_count_kv", 1)):
        writer.add_uint32(f"qwen2.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UserError, match="'qwen2'"):
        write_lora_gguf(folder / "adapter", other, tmp_path / "out.gguf")
    with pytest.raises(UserError, match="no peft LoRA adapter"):
        write_lora_gguf(tmp_path, other, tmp_path / "out.gguf")
