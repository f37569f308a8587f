"""Reading profiles: what a measurement on a collection's own questions chose for auto (its thresholds, what it
escalates to), stored with the collection per model and read as that collection's defaults.

A profile is made by `marginalia bench calibrate` from a run's per-item results. A reading over the collection
that names no pattern and sets no option reads with the profile of the model it reads with; a profile made with
another model is not used (what suits one model's answers need not suit another's), and the route says why.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import UserError
from ..files import atomic_write_json
from ..patterns.auto import AutoOptions

if TYPE_CHECKING:
    from ..index.store import Collection

log = logging.getLogger(__name__)

#: the file, in the collection's folder, that holds its profiles
PROFILES = "profiles.json"
#: the layout of that file; another is refused with what to do
SCHEMA = 1


class Profile(BaseModel):
    """One model's reading profile of a collection."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(description="the model the run answered with (its name)")
    run: str = Field(description="the benchmark run the profile was chosen from")
    made: str = Field(description="when (UTC, ISO 8601)")
    options: dict[str, Any] = Field(description="auto's options the profile sets (the rest stay at their defaults)")
    measured: dict[str, Any] = Field(default_factory=dict,
                                     description="what the choice rests on: scores and seconds of the readings")

    def auto_options(self) -> AutoOptions:
        """The profile's options as auto's record (a `UserError` when a stored option is not auto's)."""
        result: AutoOptions = AutoOptions.build(**self.options)
        return result


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_: int = Field(alias="schema")
    profiles: dict[str, Profile] = Field(default_factory=dict)


def profiles_path(collection: Collection) -> Path:
    return Path(collection.path) / PROFILES


def load_profiles(collection: Collection) -> dict[str, Profile]:
    """The collection's profiles, by model name ({} when it has none).

    Raises:
        UserError: the file is not one this version reads.
    """
    path = profiles_path(collection)
    if not path.is_file():
        return {}
    try:
        data = _File.model_validate(json.loads(path.read_text("utf-8")))
    except (ValueError, ValidationError) as exc:
        raise UserError(f"{path} is not a reading profile file this version reads ({exc.__class__.__name__}); "
                        "delete it and run 'marginalia bench calibrate' again") from None
    if data.schema_ != SCHEMA:
        raise UserError(f"{path} has profile schema {data.schema_}, this version reads {SCHEMA}; delete it and "
                        "run 'marginalia bench calibrate' again")
    return data.profiles


def save_profile(collection: Collection, profile: Profile) -> Path:
    """Store ``profile`` with the collection (replacing the one of its model), atomically."""
    profile.auto_options()  # refuse what could not be read back
    profiles = load_profiles(collection)
    profiles[profile.model] = profile
    path = profiles_path(collection)
    atomic_write_json(path, {"schema": SCHEMA,
                             "profiles": {name: p.model_dump() for name, p in sorted(profiles.items())}})
    return path


@dataclass(frozen=True)
class Chosen:
    """The options a reading of a collection takes by default, and the words the route says about them."""

    options: AutoOptions
    note: str | None


def default_reading(collection: Collection, model: str) -> Chosen:
    """Auto's options for reading ``collection`` with the model named ``model``: its profile's where the
    collection has one for that model, else the defaults (the note says why where it has profiles)."""
    profiles = load_profiles(collection)
    profile = profiles.get(model)
    if profile is not None:
        return Chosen(profile.auto_options(), f"profile from run {profile.run}")
    if not profiles:
        return Chosen(AutoOptions(), None)
    others = ", ".join(f"{p.model} (run {p.run})" for p in profiles.values())
    note = (f"default options: the collection's reading profile was made with another model ({others}), not "
            f"{model}; run 'marginalia bench calibrate' on a run with {model} to make one")
    log.info("collection %s: %s", collection.name, note)
    return Chosen(AutoOptions(), note)
