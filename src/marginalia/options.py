"""The options records: the base of every way of reading's record (`PatternOptions`; each pattern's own
record lives in its module, `marginalia.patterns.wim` and its siblings), and the records of reading a
collection, ingesting, composing and tuning.

Each option's default, allowed values, bounds and one-line description are written on its record and
nowhere else; the CLI's flags, the benchmark config's tables and the HTTP request bodies are built from
the records (a test checks that every default agrees). Validation errors become one `UserError` naming
each bad field.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import UserError

JudgeMode = Literal["grounded", "separate"]
Scope = Literal["sections", "chunks", "documents"]
SearchMode = Literal["hybrid", "dense", "bm25"]
MemoryMode = Literal["takeaways", "margins"]
EscalateTo = Literal["wim", "lc", "rag"]

JUDGE_MODES: tuple[str, ...] = get_args(JudgeMode)
SCOPES: tuple[str, ...] = get_args(Scope)
SEARCH_MODES: tuple[str, ...] = get_args(SearchMode)
MEMORY_MODES: tuple[str, ...] = get_args(MemoryMode)
#: the grounded judge's least topicality (`grounding.Reading.topic`) for a supported margin's sentence: low,
#: because a multi-hop answer's sentence holds only its own hop's share of the question's words
TOPIC_THRESHOLD = 0.25
#: `AutoOptions.support_threshold`'s default: where a RAG answer's words mostly come from one retrieved sentence
SUPPORT_THRESHOLD = 0.5
#: a reading that names no pattern reads with auto over a collection, or over a text of more than this many
#: model tokens (four of WiM's segments of its default size); a shorter text reads with WiM, which reads all of
#: it for a few margins (`app.default_options`)
ROUTE_TOKENS = 2048
#: the composition client's loop guard where its model can mask tokens (`ComposeOptions.no_repeat_ngram`): a
#: small model decoding greedily falls into loops, and a run this short stops one early while a word may still
#: come back
NO_REPEAT_NGRAM = 3

# Upper bounds, so that no option can ask for work, memory or waiting without end (a request sets many of
# these); far above any useful value.
#: the most tokens a size in tokens may be (a segment, a chunk, an answer, the references read): above the
#: largest window a model has
MAX_TOKENS = 2**24
#: the most items a count may ask for (hits, chunks, memory items, cuts)
MAX_ITEMS = 1000
#: the most steps a count of training steps may be
MAX_STEPS = 1_000_000
#: the longest a time limit may be, in seconds
MAX_SECONDS = 3600.0
#: the largest seed (numpy's generators take seeds below 2**32)
MAX_SEED = 2**32 - 1


class Options(BaseModel):
    """Base of the options records: frozen, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def build(cls, **values: Any) -> Any:
        """A validated record; a bad value is a `UserError` that names the field and what it must be."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise UserError(describe(exc, cls)) from None


class PatternOptions(Options):
    """What every way of reading takes; each pattern's record subclasses it and names its pattern in the class
    attribute ``pattern`` (the registry's name, `marginalia.patterns.registry`)."""

    pattern: ClassVar[str]
    max_new_tokens: int = Field(default=96, gt=0, le=MAX_TOKENS, description="the most tokens of the answer")


class RunSettings(Options):
    """What may change from one run of a built pattern to the next, given to the run (``pattern.run(...,
    settings=...)``) and laid over the pattern's own answer decoding; the pattern itself is never changed."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0,
                                      description="the answer's sampling temperature (0: greedy; default: "
                                                  "the pattern's own)")
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED,
                             description="the answer's sampling seed (default: the pattern's own)")


class ChunkingOptions(Options):
    """Cutting a document's sections into chunks for a collection (sizes in the model's tokens)."""

    min_tokens: int = Field(default=130, gt=0, le=MAX_TOKENS,
                            description="smallest chunk, in model tokens (about 100 words)")
    max_tokens: int = Field(default=260, gt=0, le=MAX_TOKENS,
                            description="largest chunk, in model tokens (about 200 words)")
    overlap_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS,
                                description="tokens each chunk repeats from the one before (same section only)")

    @model_validator(mode="after")
    def _sizes(self) -> ChunkingOptions:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"the smallest chunk ({self.min_tokens}) is larger than the largest ({self.max_tokens})")
        if self.overlap_tokens >= self.max_tokens:
            raise ValueError(f"the overlap ({self.overlap_tokens}) must be below the largest chunk ({self.max_tokens})")
        return self


class IngestOptions(Options):
    """Bounds on reading one document's file. A PDF is converted in a child process that these bound, so that
    a decompression bomb or a pathological file fails with a clear error instead of exhausting the machine;
    each bound's error names the option that raises it."""

    max_pages: int = Field(default=2000, gt=0, le=1_000_000, description="the most pages a PDF may have")
    max_inflated_mb: int = Field(
        default=128, gt=0, le=1_048_576,
        description="the most MiB a PDF's streams may inflate to when decompressed (images aside: they are "
                    "bounded by memory and time)")
    convert_timeout: float = Field(
        default=300.0, gt=0.0, le=86_400.0,
        description="the most seconds converting one PDF may take, its process's start included; past it, the "
                    "process is killed")
    convert_memory_mb: int = Field(
        default=2048, gt=0, le=1_048_576,
        description="the most memory, in MiB of address space, the process converting a PDF may use (where the "
                    "system bounds it: Linux)")


class CollectionOptions(Options):
    """Reading a collection: the retrieval policy, and how much of what it finds is read."""

    certain: float = Field(default=0.9, ge=-1.0, le=1.0,
                           description="a question-bank entry at least this similar (cosine) answers directly")
    uncertain: float = Field(default=0.3, ge=-1.0, le=1.0,
                             description="below this similarity for every hit: 'no relevant references found'")
    scope: Scope | None = Field(
        default=None, description="what lc and wim read around each hit (default: sections; rag reads chunks)")
    search: SearchMode = Field(default="hybrid", description="how the collection is searched")
    use_questions: bool = Field(default=True, description="answer from the question bank when a stored "
                                                          "question matches closely")
    max_context_tokens: int | None = Field(
        default=None, gt=0, le=MAX_TOKENS,
        description="the most tokens of references wim reads (lc and rag: what fits the window)")
    hits: int = Field(default=5, gt=0, le=MAX_ITEMS,
                      description="how many search hits lc and wim gather (rag: its top-k)")

    @model_validator(mode="after")
    def _ordered(self) -> CollectionOptions:
        if self.uncertain > self.certain:
            raise ValueError(f"uncertain ({self.uncertain}) must not be above certain ({self.certain})")
        return self


class ComposeOptions(Options):
    """Composition assistance: when memory is refreshed, what it holds, and the suggestions."""

    threshold: int = Field(
        default=20, gt=0, le=MAX_TOKENS,
        description="ask for new memory once the text is this many token edits (Levenshtein, on the client "
                    "model's tokens) away from the text at the last request")
    memory_size: int = Field(default=6, gt=0, le=MAX_ITEMS,
                             description="the most memory items kept; the oldest go first")
    memory_mode: MemoryMode = Field(
        default="takeaways",
        description="how retrieved chunks become memory: a key takeaway the memory model writes per chunk, or "
                    "WiM margins (the supporting sentence, exactly as the source has it)")
    memory_model: str | None = Field(
        default=None, description="the model that writes memory, a spec (default: the client's model, loaded "
                                  "again)")
    hits: int = Field(default=3, gt=0, le=MAX_ITEMS,
                      description="how many retrieved chunks each memory request compresses")
    search: SearchMode = Field(default="hybrid", description="how the collection is searched for memory")
    min_similarity: float = Field(
        default=0.2, ge=-1.0, le=1.0,
        description="retrieved chunks less similar than this to the new text (cosine) are not used")
    item_tokens: int = Field(default=48, gt=0, le=MAX_TOKENS,
                             description="the most tokens the memory model writes per item")
    memory_timeout: float = Field(
        default=60.0, gt=0.0, le=MAX_SECONDS,
        description="seconds a memory request may take; past it, suggestions go on without its memory")
    suggestion_tokens: int = Field(default=15, gt=0, le=MAX_TOKENS, description="the most tokens per suggestion")
    no_repeat_ngram: int | None = Field(
        default=None, ge=0, le=MAX_TOKENS,
        description="no run of this many tokens is written twice in one suggestion (a loop guard for greedy "
                    "decoding; needs an in-process client model); 0: plain greedy suggestions; default: "
                    f"{NO_REPEAT_NGRAM} where the client model can mask tokens (in-process), else 0")
    debounce: float = Field(default=0.15, ge=0.0, le=5.0,
                            description="seconds of no typing before a suggestion is written")
    give_way: bool = Field(
        default=True,
        description="the memory model pauses while a suggestion is being written, so that a refresh does not "
                    "slow suggestions down (memory comes later while the writer types); off: it goes on with the "
                    "CPU the suggestions leave it")


class TuneDataOptions(Options):
    """Tuning data for the composition client: where texts are cut, and how long the labels are."""

    cuts: int = Field(default=4, gt=0, le=MAX_ITEMS,
                      description="places each text is cut, at word ends spread evenly over the text")
    min_words: int = Field(default=20, gt=0, le=MAX_TOKENS, description="the fewest words of text before a cut")
    max_words: int = Field(default=300, gt=0, le=MAX_TOKENS,
                           description="the most words of text before a cut kept as its context (after the text's "
                                       "title, when they leave it out)")
    label_tokens: int = Field(
        default=15, gt=0, le=MAX_TOKENS,
        description="the most tokens of a label: the larger model's continuation of the prefix (greedy, "
                    "ended at a line break, which it keeps)")
    reference_words: int = Field(
        default=15, gt=0, le=MAX_TOKENS,
        description="words of the true continuation kept beside each label (for comparison; not trained on)")
    label_guard: int = Field(
        default=0, ge=0, le=MAX_TOKENS,
        description="the larger model writes no run of this many tokens twice in a label (the client's loop "
                    "guard, numbers apart), so that the client is not tuned on loops; 0: plain greedy labels")


class TuneOptions(Options):
    """LoRA tuning of the composition client on tuning data (transformers, CPU by default)."""

    rank: int = Field(default=8, gt=0, le=MAX_TOKENS, description="LoRA rank")
    alpha: float = Field(default=16.0, gt=0.0, description="LoRA alpha (the update is scaled by alpha / rank)")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="dropout on the LoRA inputs while training")
    modules: str = Field(default="q_proj,k_proj,v_proj,o_proj",
                         description="the linear layers that get adapters, comma-separated, or all-linear")
    steps: int = Field(default=60, gt=0, le=MAX_STEPS, description="optimizer steps")
    learning_rate: float = Field(default=2e-4, gt=0.0, description="AdamW learning rate (the peak, with a schedule)")
    schedule: Literal["linear", "cosine", "constant"] = Field(
        default="linear",
        description="how the learning rate goes over the steps: up over the warmup steps, then down to zero along "
                    "a line or a half cosine, or held")
    warmup_steps: int = Field(default=0, ge=0, le=MAX_STEPS,
                              description="steps over which the learning rate rises from zero")
    batch_size: int = Field(default=4, gt=0, le=MAX_ITEMS, description="examples per step")
    max_tokens: int = Field(
        default=768, ge=64, le=MAX_TOKENS,
        description="the longest training sequence; a longer text loses its start, cut as the client cuts it")
    held_out: float = Field(
        default=0.1, ge=0.0, lt=1.0,
        description="share of the texts (whole texts, by source) kept out of training to measure the label "
                    "loss before and after")
    eval_every: int = Field(
        default=0, ge=0, le=MAX_STEPS,
        description="measure the held-out label loss every this many steps and keep the adapters of the step "
                    "where it was lowest (early stopping; 0: measure only at the end and keep the last step)")
    seed: int = Field(default=0, ge=0, le=MAX_SEED,
                      description="seed of the example order, the held-out split and the adapters")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="the number format of the training steps' matrix work: bf16 (autocast; the adapters, the "
                    "optimizer and the held-out loss stay fp32) is faster where the processor has bf16 "
                    "instructions; auto takes it on a CPU with AVX-512 BF16 and no AMX (some virtual machines "
                    "advertise AMX and fault on it) or a CUDA device with bf16, else fp32")
    checkpoint_every: int = Field(
        default=10, ge=0, le=MAX_STEPS,
        description="save the training state every this many steps beside the output folder, so that running the "
                    "same tuning again after a crash or Ctrl-C goes on from there (0: never)")


def describe(exc: ValidationError, cls: type[BaseModel]) -> str:
    """A validation error as one line per field, in the record's own terms."""
    what = cls.__name__.removesuffix("Options").lower() or "reading"
    problems = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = ", ".join(cls.model_fields)
            problems.append(f"{what} has no option {field!r} (its options: {known})")
        elif err["type"] == "literal_error":
            problems.append(f"unknown {field} {err['input']!r}; choose {err.get('ctx', {}).get('expected', message)}")
        elif field:
            problems.append(f"{field}: {message}, got {err['input']!r}")
        else:
            problems.append(message)
    return f"bad {what} options: " + "; ".join(problems)
