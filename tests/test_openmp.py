"""How the OpenMP runtime waits: set on import unless the environment says, and a composer that says so
when the runtime was loaded too early to take it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from marginalia import openmp
from marginalia.openmp import WAIT_DEFAULTS, late_notice, runtime_loaded, tune_wait


def test_the_defaults_are_set_where_the_environment_says_nothing() -> None:
    env: dict[str, str] = {"PATH": "/bin"}
    assert tune_wait(env, loaded=False) == "set"
    assert env == {"PATH": "/bin", **WAIT_DEFAULTS}
    # the active policy alone spins idle teams for minutes: the spin count always comes with it
    assert env["OMP_WAIT_POLICY"] == "active" and int(env["GOMP_SPINCOUNT"]) <= 1_000_000


@pytest.mark.parametrize("given", [{"OMP_WAIT_POLICY": "passive"}, {"GOMP_SPINCOUNT": "300000"}])
def test_a_setting_of_the_users_leaves_both_alone(given: dict[str, str]) -> None:
    env = dict(given)
    assert tune_wait(env, loaded=False) == "user"
    assert env == given


def test_a_runtime_loaded_before_is_reported(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0\n")
    assert runtime_loaded(maps)
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert not runtime_loaded(maps)
    assert not runtime_loaded(tmp_path / "missing")
    env: dict[str, str] = {}
    assert tune_wait(env, loaded=True) == "late"
    assert env == WAIT_DEFAULTS  # still set, for the processes it starts


def importing(code: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in WAIT_DEFAULTS}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.split()


SHOW = "import os, marginalia; print(marginalia.openmp.state, os.environ.get('OMP_WAIT_POLICY'), " \
       "os.environ.get('GOMP_SPINCOUNT'))"


def test_importing_the_package_sets_them_before_any_backend_loads() -> None:
    assert importing(SHOW) == ["set", "active", "300000"]
    assert importing(SHOW, GOMP_SPINCOUNT="5") == ["user", "None", "5"]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux only: /proc/self/maps")
def test_torch_imported_first_is_too_late() -> None:
    pytest.importorskip("torch")
    assert importing("import torch; " + SHOW)[0] == "late"


def test_a_composer_says_once_when_the_setting_came_too_late(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openmp, "state", "set")
    assert late_notice() is None
    monkeypatch.setattr(openmp, "state", "late")
    notice = late_notice()
    assert notice is not None and "import marginalia first" in notice and "OMP_WAIT_POLICY=active" in notice
