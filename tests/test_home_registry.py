"""The home directory, the error tree and the backend registry (no model is loaded here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marginalia.errors import (
    BackendError,
    BadInput,
    ContextOverflow,
    IngestError,
    MarginaliaError,
    MissingDependency,
    UserError,
)
from marginalia.home import ENV_HOME, resolve_home
from marginalia.models import known_specs, load_generator, register_backend
from marginalia.models.fake import ScriptedGenerator

# -- home ------------------------------------------------------------------------


def test_explicit_home_beats_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_HOME, str(tmp_path / "from-env"))
    got = resolve_home(tmp_path / "explicit")
    assert got == tmp_path / "explicit"
    assert got.is_dir()
    assert not (tmp_path / "from-env").exists()


def test_env_home_beats_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(ENV_HOME, str(tmp_path / "from-env"))
    assert resolve_home() == tmp_path / "from-env"
    assert resolve_home(None) == tmp_path / "from-env"
    assert (tmp_path / "from-env").is_dir()
    assert not (tmp_path / "xdg").exists()


def test_default_home_is_the_user_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_HOME, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert resolve_home() == tmp_path / "xdg" / "marginalia"
    assert (tmp_path / "xdg" / "marginalia").is_dir()


def test_home_expands_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_home("~/mhome") == tmp_path / "mhome"


def test_hermetic_fixture_sets_env(hermetic: Path) -> None:
    import os

    assert os.environ[ENV_HOME] == str(hermetic)
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert sorted(k for k in os.environ if k.startswith("MARGINALIA_")) == ["MARGINALIA_CACHE", ENV_HOME]
    assert "marginalia-model-cache" in os.environ["MARGINALIA_CACHE"]  # the session's, not the user's


# -- errors ----------------------------------------------------------------------


def test_error_tree_and_exit_codes() -> None:
    overflow = ContextOverflow(300, 200, "the thing")
    assert isinstance(overflow, UserError) and isinstance(overflow, MarginaliaError)
    assert (overflow.needed, overflow.window) == (300, 200)
    assert "300" in str(overflow) and "200" in str(overflow) and "the thing" in str(overflow)
    bad = BadInput("nope", path="/x.txt")
    assert isinstance(bad, IngestError) and isinstance(bad, UserError)
    assert bad.exit_code == 2 and bad.path == "/x.txt"
    assert UserError("x").exit_code == 2
    assert BackendError("x").exit_code == 1
    missing = MissingDependency("torch", "pip install 'marginalia[hf]'")
    assert missing.command == "pip install 'marginalia[hf]'"
    assert "pip install 'marginalia[hf]'" in str(missing)


# -- registry --------------------------------------------------------------------


def test_typo_gets_did_you_mean() -> None:
    with pytest.raises(UserError) as info:
        load_generator("smolm2")
    assert "did you mean 'smollm2'" in str(info.value)


def test_typo_in_prefix_gets_did_you_mean() -> None:
    with pytest.raises(UserError) as info:
        load_generator("ggfu:/x.gguf")
    assert "did you mean 'gguf:'" in str(info.value)


def test_unknown_spec_without_close_match_lists_forms() -> None:
    with pytest.raises(UserError) as info:
        load_generator("qqqqqqqqqqqq")
    msg = str(info.value)
    assert "did you mean" not in msg
    assert "smollm2" in msg and "hf:<arg>" in msg and "gguf:<arg>" in msg


@pytest.mark.parametrize("spec", ["", "   "])
def test_empty_spec(spec: str) -> None:
    with pytest.raises(UserError):
        load_generator(spec)


@pytest.mark.parametrize("spec", ["hf:", "gguf:"])
def test_prefix_without_argument(spec: str) -> None:
    with pytest.raises(UserError) as info:
        load_generator(spec)
    assert "needs something after" in str(info.value)


def test_missing_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "nonexistent.gguf"
    with pytest.raises(UserError) as info:
        load_generator(f"gguf:{path}")
    assert str(path) in str(info.value)
    assert not isinstance(info.value, BackendError)
    with pytest.raises(UserError):
        load_generator("gguf:/nonexistent.gguf")


def test_missing_hf_dir(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        load_generator("hf:/nonexistent")
    assert "/nonexistent" in str(info.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError) as info:
        load_generator(f"hf:{tmp_path / 'empty'}")
    assert "config.json" in str(info.value)


def test_scripted_spec_and_third_party_registration() -> None:
    gen = load_generator("scripted:hello there")
    assert isinstance(gen, ScriptedGenerator)
    assert gen.generate("question?") == "hello there"

    made: list[str] = []

    def factory(arg: str, ctx: object) -> ScriptedGenerator:
        made.append(arg)
        return ScriptedGenerator(default=f"echo {arg}")

    register_backend("testecho", factory, "a test backend")
    try:
        assert load_generator("testecho:abc").generate("x") == "echo abc"
        assert made == ["abc"]
        assert ("testecho:<arg>", "a test backend") in known_specs()
    finally:
        from marginalia.models import registry

        registry._PREFIXED.pop("testecho", None)


def test_load_generator_creates_home(tmp_path: Path) -> None:
    load_generator("scripted:x", home=tmp_path / "h")
    assert (tmp_path / "h").is_dir()


def test_broken_gguf_is_a_backend_error_and_leaves_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    home = tmp_path / "home"
    with pytest.raises(BackendError) as info:
        load_generator(f"gguf:{bogus}", home=home)
    assert str(bogus) in str(info.value)
    assert info.value.__cause__ is not None
    models = home / "models"
    assert not models.exists() or list(models.iterdir()) == []  # no half-written cache


def test_hf_dir_without_weights_is_a_backend_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(BackendError) as info:
        load_generator(f"hf:{tmp_path / 'm'}")
    assert str(tmp_path / "m") in str(info.value)
