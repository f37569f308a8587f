"""`import marginalia` (and its light subpackages) must not import torch or transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHECK = """
import json, sys
import marginalia, marginalia.patterns, marginalia.models, marginalia.ingest, marginalia.records
import marginalia.patterns.wim, marginalia.patterns.rag, marginalia.patterns.long_context
import marginalia.models.fake, marginalia.models.registry
print(json.dumps({m: m in sys.modules for m in ("torch", "transformers", "sentence_transformers")}))
"""


def test_import_does_not_load_torch() -> None:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                         check=True, timeout=120)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {"torch": False, "transformers": False, "sentence_transformers": False}


def test_the_check_can_fail() -> None:
    """The same probe sees torch once a backend module that needs it is used."""
    pytest.importorskip("torch")
    probe = ("import sys, marginalia.models.hf.backend as t; t.import_torch(); "
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "True"


def test_lazy_top_level_names() -> None:
    import marginalia
    from marginalia.ingest.segment import segment_text
    from marginalia.models import load_generator

    assert marginalia.segment_text is segment_text
    assert marginalia.load_generator is load_generator
    with pytest.raises(AttributeError):
        marginalia.no_such_name  # noqa: B018
