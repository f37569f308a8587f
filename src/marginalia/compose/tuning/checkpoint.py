"""Resuming a LoRA tuning after a crash or a stop: the training state saved beside the output folder.

A tuning of a few hundred steps runs for an hour or more on CPU. Every `TuneOptions.checkpoint_every` steps
`tune` writes what it needs to go on from that step as if it had never stopped: the adapters, the optimizer's
moments, the example order still to come, the random states (the example order's and torch's, which drives
dropout), the losses so far and the best held-out measurement with its adapters. Run the same tuning again and
it picks up there; the result is the one an uninterrupted run gives.

The file is ``.<folder>.checkpoint.pt`` beside the output folder, written whole or not at all (to a temporary
file, then renamed), and removed once the tuned model is saved. A checkpoint of other examples, another client
or other settings is not used (more steps is not another setting: a finished count of steps can be extended
only while its checkpoint exists, i.e. not after the model was saved).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...files import atomic_rename
from ...options import TuneOptions

#: the options a checkpoint does not depend on: how long to train and how often to save
_FREE_OPTIONS = ("steps", "checkpoint_every")
_VERSION = 1


def checkpoint_path(folder: Path) -> Path:
    """Where the tuning into ``folder`` keeps its training state."""
    return folder.with_name(f".{folder.name}.checkpoint.pt")


def fingerprint(client: str, options: TuneOptions, rows: Sequence[Any], held_rows: Sequence[Any]) -> str:
    """What a checkpoint must match to be resumed: the client, the settings that shape training and the
    exact token rows (the examples as the client's prompt builds them). More steps extend a tuning only at a
    constant learning rate: a schedule that decays towards the last step sets every step by the total."""
    digest = hashlib.sha256()
    free = _FREE_OPTIONS if options.schedule == "constant" else tuple(k for k in _FREE_OPTIONS if k != "steps")
    settings = {k: v for k, v in options.model_dump().items() if k not in free}
    digest.update(json.dumps({"version": _VERSION, "client": client, "options": settings}, sort_keys=True).encode())
    for part in (rows, held_rows):
        digest.update(b"|")
        for row in part:
            digest.update(repr((row.input_ids, row.labels)).encode())
    return digest.hexdigest()


@dataclass
class TrainingState:
    """Everything the training loop carries from one step to the next."""

    step: int = 0
    losses: list[float] = field(default_factory=list)
    curve: list[tuple[int, float]] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    best: tuple[float, int, dict[str, Any]] | None = None  # (held-out loss, step, adapter weights)
    held_out_before: float | None = None
    seconds: float = 0.0  # training time of the runs before this one


def save(path: Path, key: str, state: TrainingState, adapters: dict[str, Any], optimizer: Any,
         rng_state: Any, torch: Any) -> None:
    """Write the checkpoint whole (temporary file, then rename): a crash while saving keeps the last one."""
    payload = {
        "version": _VERSION, "fingerprint": key, "step": state.step, "losses": list(state.losses),
        "curve": [list(p) for p in state.curve], "order": list(state.order),
        "best": None if state.best is None else [state.best[0], state.best[1], state.best[2]],
        "held_out_before": state.held_out_before, "seconds": state.seconds,
        "adapters": adapters, "optimizer": optimizer.state_dict(),
        "rng": rng_state, "torch_rng": torch.get_rng_state(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    os.close(fd)
    try:
        torch.save(payload, tmp)
        atomic_rename(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path, key: str, steps: int, torch: Any) -> tuple[dict[str, Any] | None, str]:
    """The checkpoint at ``path`` if it can be resumed (same fingerprint, fewer steps done than ``steps``),
    else None; and a line saying what was found."""
    if not path.is_file():
        return None, ""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a torn or foreign file: start over, it is only a shortcut
        return None, f"ignoring the unreadable checkpoint {path} ({type(exc).__name__}); starting over"
    if not isinstance(payload, dict) or payload.get("version") != _VERSION or payload.get("fingerprint") != key:
        return None, (f"ignoring the checkpoint {path}: it is of other examples, another client or other "
                      "settings; starting over")
    if payload["step"] >= steps:
        return None, (f"ignoring the checkpoint {path}: it is at step {payload['step']}, not before step "
                      f"{steps}; starting over")
    return payload, f"resuming from the checkpoint at step {payload['step']} of {steps} ({path})"


def restored(payload: dict[str, Any]) -> TrainingState:
    """The loop's state as a checkpoint holds it."""
    best = payload["best"]
    return TrainingState(
        step=payload["step"], losses=list(payload["losses"]),
        curve=[(int(s), float(v)) for s, v in payload["curve"]], order=list(payload["order"]),
        best=None if best is None else (float(best[0]), int(best[1]), best[2]),
        held_out_before=payload["held_out_before"], seconds=float(payload["seconds"]))


def python_rng_state(value: Any) -> tuple[Any, ...]:
    """`random.Random.setstate`'s argument from what a checkpoint kept (lists where the state had tuples)."""
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


__all__ = ["TrainingState", "checkpoint_path", "fingerprint", "load", "python_rng_state", "restored", "save"]
