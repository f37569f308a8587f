"""The benchmark run config: a TOML file, validated strictly (unknown keys are errors) and resolved.

A config names the model, the tasks (which items to build) and the patterns (ways of reading) to compare;
optionally a model judge and medoid voting. `load_config` reads and validates a file; the result's
`resolved()` dict (absolute paths, defaults filled) is what a run stores next to its results.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from ..app import BACKENDS, DEFAULT_EMBEDDER, DEVICES, PatternSpec, pattern_options, pattern_specs
from ..errors import UserError
from ..options import PatternOptions
from .items import TaskSpec

Backend = Literal[BACKENDS]  # type: ignore[valid-type]
Device = Literal[DEVICES]  # type: ignore[valid-type]

SCHEMA = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JudgeConfig(_Strict):
    """``[judge]``: a model that says whether a prediction answers the question."""

    model: str = Field(min_length=1)
    backend: Backend = "auto"
    device: Device = "auto"
    method: Literal["verdict", "probability"] = "verdict"  # a JSON verdict, or P(YES) against a threshold
    threshold: float = Field(default=0.5, gt=0.0, lt=1.0)  # probability: P(YES) from which an answer is right
    retries: int = Field(default=2, ge=0, le=10)  # verdict: tries after an unreadable reply
    max_new_tokens: int = Field(default=96, gt=0)  # verdict: the longest reply
    # a yes/no question answered yes or no: settled by comparing the word with the gold one, or asked of the model
    yes_no: Literal["rule", "model"] = "rule"


class VotingConfig(_Strict):
    """``[voting]``: sample several answers per (item, pattern) and keep the medoid."""

    samples: int = Field(ge=2, le=50)
    temperature: float = Field(default=0.7, gt=0.0, le=2.0)


class TaskConfig(_Strict):
    """``[[tasks]]``: what to build; the fields of `TaskSpec`."""

    dataset: str = Field(min_length=1)
    path: str | None = None
    pool: str | None = None
    limit: int = Field(default=10, gt=0)
    lengths: tuple[Annotated[int, Field(gt=0)], ...] = (4096,)
    depths: tuple[Annotated[float, Field(ge=0.0, le=1.0)], ...] = (0.5,)
    distractor_fractions: tuple[Annotated[float, Field(ge=0.0, le=1.0)], ...] = ()
    seed: int | None = None  # default: the run's seed
    name: str | None = None  # default: the dataset
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("lengths", "depths")
    @classmethod
    def _not_empty(cls, value: tuple[Any, ...]) -> tuple[Any, ...]:
        if not value:
            raise ValueError("give at least one value")
        return value

    def spec(self, limit: int | None = None) -> TaskSpec:
        """The `TaskSpec` for the data side (``limit`` caps the examples further)."""
        return TaskSpec(
            dataset=self.dataset, path=self.path, pool=self.pool,
            limit=min(self.limit, limit) if limit else self.limit,
            lengths=tuple(self.lengths), depths=tuple(self.depths),
            distractor_fractions=tuple(self.distractor_fractions),
            seed=self.seed if self.seed is not None else 0, name=self.name or self.dataset,
            options=dict(self.options),
        )


# A ``[[patterns]]`` table is its pattern's options record plus its kind and its name: the fields, their
# defaults and their bounds are the record's own. Every registered pattern is a kind.

#: what a kind's table takes besides its record's fields: lc may answer from the reading of a wim pattern of
#: the config, named here (one prefill of the context for both; the prompt then opens with WiM's intro
#: instead of long context's)
_TABLE_EXTRAS: dict[str, dict[str, Any]] = {"lc": {"reading": (str | None, None)}}


class PatternTable(BaseModel):
    """What every ``[[patterns]]`` table adds to its pattern's options record: its kind, and its name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    name: str | None = None  # default: the kind


def pattern_config(spec: PatternSpec) -> type[PatternTable]:
    """The ``[[patterns]]`` table of kind ``spec.name`` (``WimPatternConfig`` for wim): its options record, a
    ``kind`` naming it and an optional ``name``."""
    bases: Any = (spec.options, PatternTable)
    fields: dict[str, Any] = {"kind": (Literal[spec.name], ...), **_TABLE_EXTRAS.get(spec.name, {})}
    model: type[PatternTable] = create_model(
        f"{spec.name.title().replace('_', '')}PatternConfig", __base__=bases, __module__=__name__,
        __doc__=f"``[[patterns]]`` with ``kind = \"{spec.name}\"``: {spec.description}.", **fields)
    return model


#: every registered pattern's table, by kind (the registry as it stood when the config module was loaded)
PATTERN_CONFIGS: dict[str, type[PatternTable]] = {spec.name: pattern_config(spec) for spec in pattern_specs()}
# module attributes by their names, so that a config pickles (`bench --jobs` hands it to its workers)
globals().update({model.__name__: model for model in PATTERN_CONFIGS.values()})
if TYPE_CHECKING:
    PatternConfig = PatternTable
else:
    PatternConfig = Annotated[Union[tuple(PATTERN_CONFIGS.values())], Field(discriminator="kind")]  # noqa: UP007


def pattern_record(table: PatternTable) -> PatternOptions:
    """The options record of a ``[[patterns]]`` table (the table without its kind, its name and its extras)."""
    extras = {"kind", "name", *_TABLE_EXTRAS.get(table.kind, {})}
    return pattern_options(table.kind, **table.model_dump(exclude=extras))


class RunConfig(_Strict):
    """The whole file."""

    name: str | None = None  # default: the config file's stem
    seed: int = 0
    model: str = Field(default="smollm2", min_length=1)
    backend: Backend = "auto"
    device: Device = "auto"
    embedder: str = Field(default=DEFAULT_EMBEDDER, min_length=1)
    max_new_tokens: int | None = Field(default=None, gt=0)  # for patterns that set none (default: their own)
    judge: JudgeConfig | None = None
    voting: VotingConfig | None = None
    tasks: tuple[TaskConfig, ...] = Field(min_length=1)
    patterns: tuple[PatternConfig, ...] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError("use letters, digits, '.', '_' and '-' only (it names a folder)")
        return value

    @model_validator(mode="after")
    def _unique_labels(self) -> RunConfig:
        for what, labels in (("task", [t.name or t.dataset for t in self.tasks]),
                             ("pattern", [p.name or p.kind for p in self.patterns])):
            seen: set[str] = set()
            for label in labels:
                if label in seen:
                    raise ValueError(f"two {what}s are called {label!r}; give each a distinct name = \"...\"")
                seen.add(label)
                if not _NAME.match(label):
                    raise ValueError(f"{what} name {label!r}: use letters, digits, '.', '_' and '-' only")
        wims = [p.name or p.kind for p in self.patterns if p.kind == "wim"]
        for p in self.patterns:
            reading = getattr(p, "reading", None)
            if reading is not None and reading not in wims:
                raise ValueError(f"pattern {p.name or p.kind!r} answers from the reading of {reading!r}, which is "
                                 f"not a wim pattern of this config (its wim patterns: {', '.join(wims) or 'none'})")
        return self

    def pattern_names(self) -> list[str]:
        return [p.name or p.kind for p in self.patterns]

    def task_names(self) -> list[str]:
        return [t.name or t.dataset for t in self.tasks]

    def resolved(self) -> dict[str, Any]:
        """A JSON-ready dict with every default filled (what a run stores and compares)."""
        data = self.model_dump(mode="json")
        data["schema"] = SCHEMA
        return data


def load_config(path: str | Path) -> RunConfig:
    """Read, validate and resolve a run config.

    Relative dataset paths resolve against the config file's folder; names, task seeds and
    per-pattern token budgets get their defaults, so `RunConfig.resolved` is complete.

    Raises:
        UserError: the file is missing or not TOML, has unknown keys or bad values (the message names
            the file, the table and the key), or names a dataset file that does not exist.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"no run config at {path}; give the path of a .toml file (see configs/bench/)")
    try:
        raw = tomllib.loads(path.read_text("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; save it as UTF-8") from None
    return parse_config(raw, path)


def parse_config(raw: dict[str, Any], path: Path) -> RunConfig:
    """Validate a parsed TOML table (see `load_config`); ``path`` places relative paths and names the file."""
    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [_describe(err, raw) for err in exc.errors()]
        raise UserError(f"{path}: " + ("; ".join(problems) if len(problems) > 1 else problems[0])) from None
    base = path.resolve().parent
    tasks = []
    for i, task in enumerate(config.tasks):
        paths: dict[str, Any] = {}
        for key in ("path", "pool"):
            value = getattr(task, key)
            if value is None:
                continue
            resolved = (base / Path(value).expanduser()).resolve()
            if not resolved.exists():
                raise UserError(f"{path}: [[tasks]] #{i + 1} ({task.name or task.dataset}): {key} {value!r} "
                                f"resolves to {resolved}, which does not exist; relative paths are read from "
                                "the config file's folder")
            paths[key] = str(resolved)
        tasks.append(task.model_copy(update={
            **paths, "name": task.name or task.dataset,
            "seed": task.seed if task.seed is not None else config.seed,
        }))
    patterns = [p.model_copy(update={
        "name": p.name or p.kind,
        **({"max_new_tokens": config.max_new_tokens}
           if config.max_new_tokens and "max_new_tokens" not in p.model_fields_set else {}),
    }) for p in config.patterns]
    return config.model_copy(update={"name": config.name or _stem_name(path), "tasks": tuple(tasks),
                                     "patterns": tuple(patterns)})


def _stem_name(path: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-.") or "run"
    return name


_TABLE_MODELS: dict[str, type[BaseModel]] = {
    "judge": JudgeConfig, "voting": VotingConfig, "tasks": TaskConfig,
}
_PATTERN_MODELS: dict[str, type[BaseModel]] = dict(PATTERN_CONFIGS)


def _describe(err: Any, raw: dict[str, Any]) -> str:
    """One validation error in the file's own terms: table, key, what is wrong."""
    loc = list(err["loc"])
    kind = err["type"]
    model: type[BaseModel] = RunConfig
    where = "top level"
    if loc and loc[0] in ("judge", "voting"):
        where = f"[{loc[0]}]"
        model = _TABLE_MODELS[str(loc[0])]
        loc = loc[1:]
    elif loc and loc[0] in ("tasks", "patterns") and len(loc) >= 2 and isinstance(loc[1], int):
        table, index = str(loc[0]), loc[1]
        entry = raw.get(table, [])[index] if isinstance(raw.get(table), list) else {}
        label = entry.get("name") or entry.get("dataset" if table == "tasks" else "kind") \
            if isinstance(entry, dict) else None
        where = f"[[{table}]] #{index + 1}" + (f" ({label})" if label else "")
        loc = loc[2:]
        if table == "tasks":
            model = TaskConfig
        else:
            if loc and loc[0] in _PATTERN_MODELS:
                model = _PATTERN_MODELS[str(loc[0])]
                loc = loc[1:]
            if kind in ("union_tag_not_found", "union_tag_invalid"):
                return f"{where}: kind must be one of {', '.join(_PATTERN_MODELS)}"
    key = ".".join(str(part) for part in loc)
    if kind == "extra_forbidden":
        known = list(model.model_fields)
        other = sorted((k for k, m in _PATTERN_MODELS.items() if model in _PATTERN_MODELS.values()
                        and m is not model and loc and loc[-1] in m.model_fields),
                       key=lambda k: len(_PATTERN_MODELS[k].model_fields))  # the record that adds it first
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.75) if loc else []
        hint = (f" (an option of kind = \"{other[0]}\")" if other else f"; did you mean {close[0]!r}?" if close
                else f" (known keys: {', '.join(known)})")
        return f"{where}: unknown key {key!r}{hint}"
    if kind == "missing":
        return f"{where}: {key!r} is required"
    message = err["msg"].removeprefix("Value error, ")
    return f"{where}: {key}: {message}" if key else f"{where}: {message}"
