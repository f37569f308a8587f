"""Every number an options record or a request body holds has an upper bound, so that no request (and no
flag) can ask for work, memory or waiting without end."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Annotated, Any, Union, get_args, get_origin

import annotated_types
import pytest
from pydantic import BaseModel

from marginalia import WimOptions
from marginalia.errors import UserError
from marginalia.options import ComposeOptions, Options

#: numbers that are neither a time, a size nor a count, or are bounded where they are used, and why
UNBOUNDED = {
    ("TuneOptions", "alpha"): "a scale of the adapters' update, set on the command line only",
    ("TuneOptions", "learning_rate"): "a rate, set on the command line only",
    ("DocqaChatRequest", "certainty_threshold"): "checked as CollectionOptions.certain, which it builds",
    ("DocqaChatRequest", "uncertainty_threshold"): "checked as CollectionOptions.uncertain, which it builds",
}


def _types(annotation: Any) -> Iterator[Any]:
    """The types an annotation holds: through unions, Annotated, lists and dicts."""
    origin = get_origin(annotation)
    if origin is Annotated:
        yield from _types(get_args(annotation)[0])
    elif origin in (Union, types.UnionType, list, tuple, dict):
        for arg in get_args(annotation):
            yield from _types(arg)
    else:
        yield annotation


def models_in(roots: list[type[BaseModel]]) -> list[type[BaseModel]]:
    """``roots`` and every model their fields hold, each once."""
    seen: list[type[BaseModel]] = []
    todo = list(roots)
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for info in model.model_fields.values():
            todo.extend(t for t in _types(info.annotation) if isinstance(t, type) and issubclass(t, BaseModel))
    return seen


def unbounded_numbers(models: list[type[BaseModel]]) -> set[tuple[str, str]]:
    """(model, field) of each int or float field without an upper bound (``le`` or ``lt``)."""
    found = set()
    for model in models:
        for name, info in model.model_fields.items():
            kinds = [t for t in _types(info.annotation) if t in (int, float)]
            bounded = any(isinstance(m, annotated_types.Le | annotated_types.Lt) for m in info.metadata)
            if kinds and not bounded:
                found.add((model.__name__, name))
    return found


def all_records() -> list[type[BaseModel]]:
    records: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [Options]
    while todo:
        cls = todo.pop()
        records.append(cls)
        todo.extend(cls.__subclasses__())
    return models_in(records)


def test_every_number_of_every_options_record_has_an_upper_bound():
    unbounded = unbounded_numbers(all_records())
    assert unbounded <= set(UNBOUNDED), sorted(unbounded - set(UNBOUNDED))
    assert {("TuneOptions", "alpha"), ("TuneOptions", "learning_rate")} <= unbounded  # the list is not stale


def test_every_number_a_request_body_holds_has_an_upper_bound():
    pytest.importorskip("fastapi")
    from marginalia.server import schemas

    bodies = [cls for cls in vars(schemas).values()
              if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ == schemas.__name__]
    found = models_in(bodies)
    assert {"AskRequest", "ComposeOptions", "ChatCompletionRequest", "CollectionOptions"} <= {m.__name__ for m in found}
    unbounded = unbounded_numbers(found)
    assert unbounded <= set(UNBOUNDED), sorted(unbounded - set(UNBOUNDED))
    assert ("DocqaChatRequest", "certainty_threshold") in unbounded


@pytest.mark.parametrize(("record", "field", "value"), [
    (ComposeOptions, "memory_timeout", 1e308),
    (ComposeOptions, "memory_timeout", float("inf")),
    (ComposeOptions, "memory_timeout", 10.0**7),
    (WimOptions, "segment_tokens", 10**9),
    (WimOptions, "max_new_tokens", 10**30),
])
def test_a_number_past_its_bound_is_refused_naming_it(record, field, value):
    with pytest.raises(UserError, match=f"{field}: Input should be less than or equal to"):
        record.build(**{field: value})
    assert record.build(**{field: record.model_fields[field].default}) == record()


def test_the_bounds_are_far_above_every_default():
    for model in all_records():
        for name, info in model.model_fields.items():
            for bound in info.metadata:
                limit = getattr(bound, "le", None)
                if limit is not None and isinstance(info.default, int | float) and limit > 1:
                    assert info.default * 10 <= limit, (model.__name__, name)
