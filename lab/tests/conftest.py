"""The lab's test fixtures: a hermetic environment, a lab script loaded as a module, a tiny random Llama."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

LAB = Path(__file__).resolve().parent.parent

# huggingface_hub reads these when it is imported, so set them before any test imports it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own MARGINALIA_HOME and MARGINALIA_CACHE, and no other MARGINALIA_* variable."""
    for name in list(os.environ):
        if name.startswith("MARGINALIA_"):
            monkeypatch.delenv(name)
    home = tmp_path / "marginalia-home"
    monkeypatch.setenv("MARGINALIA_HOME", str(home))
    monkeypatch.setenv("MARGINALIA_CACHE", str(tmp_path / "marginalia-cache"))
    return home


@pytest.fixture
def load_script() -> Any:
    """``load_script(name)``: ``lab/<name>.py`` as a module (the lab folder on the path while it imports
    ``_lab_common``)."""

    def load(name: str) -> Any:
        sys.path.insert(0, str(LAB))
        try:
            spec = importlib.util.spec_from_file_location(f"lab_{name}", LAB / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # its dataclasses look their module up
            spec.loader.exec_module(module)
            return module
        finally:
            sys.path.remove(str(LAB))

    return load


TINY_CORPUS = [
    "The harbour opens at dawn and closes at dusk.",
    "Fact 17: the value is 1717.",
    "Rain fell on the market square all week, and the road to the mill flooded.",
    "What is the answer? The answer is written in the margin.",
    "Ships, carts and bicycles crowd the bridge every morning.",
]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    """A byte-level BPE trained here, with a chat template: what a tiny random Llama reads with."""
    pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        TINY_CORPUS * 4, vocab_size=300, min_frequency=1,
        special_tokens=["<|eos|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|eos|>")
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok
