"""`marginalia keys`: make, list, rotate and revoke keys and proxy users in the home's key store; a token shown
once and never stored; the audit log; and `serve` with the access options."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest

from marginalia.cli import main
from marginalia.server.keys import DATABASE, KeyStore, token_hash


def keys(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["keys", *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_create_prints_the_token_once_and_stores_only_its_hash(hermetic: Path):
    code, out, err = keys("create", "alice", "--read", "handbook", "--write", "drafts")
    token = out.strip()
    assert code == 0 and token.startswith("mgl_") and len(token) >= 4 + 43  # 256 bits, URL-safe
    assert "shown once" in err and "read handbook" in err and "write drafts" in err
    record = KeyStore.of_home(hermetic).find(token)
    assert record is not None and record.name == "alice"
    assert record.grants.can_read("handbook") and record.grants.can_write("drafts")
    assert not record.grants.can_write("handbook") and not record.grants.can_read("other")
    with sqlite3.connect(hermetic / DATABASE) as db:
        assert db.execute("SELECT hash FROM keys").fetchone()[0] == token_hash(token)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    code, out, err = keys("list")
    assert code == 0 and "alice" in out and token not in out + err and "last used" in out


def test_two_keys_get_different_tokens_and_a_name_is_taken_once(hermetic: Path):
    a = keys("create", "a", "--admin")[1].strip()
    b = keys("create", "b", "--admin")[1].strip()
    assert a != b
    code, _, err = keys("create", "a", "--read", "x")
    assert code == 2 and "exists already" in err and "rotate" in err


def test_a_key_must_be_given_something_to_do():
    code, _, err = keys("create", "idle")
    assert code == 2 and "--read COLLECTION" in err


def test_rotate_and_revoke(hermetic: Path):
    old = keys("create", "bot", "--read", "docs")[1].strip()
    code, out, _ = keys("rotate", "bot", "--json")
    new = json.loads(out)["token"]
    store = KeyStore.of_home(hermetic)
    assert code == 0 and new != old and store.find(old) is None and store.find(new) is not None
    assert json.loads(out)["read"] == ["docs"]
    assert keys("revoke", "bot")[0] == 0
    assert store.find(new) is None
    code, _, err = keys("revoke", "bot")
    assert code == 2 and "no key named 'bot'" in err


def test_users_a_proxy_signs_in(hermetic: Path):
    assert keys("grant-user", "ana@example.org", "--read", "docs")[0] == 0
    user = KeyStore.of_home(hermetic).user("ana@example.org")
    assert user is not None and user.grants.can_read("docs") and not user.grants.can_write("docs")
    code, out, _ = keys("list", "--json")
    assert json.loads(out)["users"][0]["user"] == "ana@example.org"
    assert keys("revoke-user", "ana@example.org")[0] == 0
    assert KeyStore.of_home(hermetic).user("ana@example.org") is None


def test_bad_names_are_refused_saying_what_a_name_may_hold():
    code, _, err = keys("create", "has space", "--admin")
    assert code == 2 and "letters, digits" in err


def test_the_cli_writes_key_changes_to_the_audit_log(hermetic: Path):
    token = keys("create", "carol", "--read", "docs")[1].strip()
    keys("revoke", "carol")
    lines = [json.loads(line) for line in (hermetic / "audit.jsonl").read_text().splitlines()]
    assert [(r["actor"], r["action"], r["key"]) for r in lines] == [("cli", "create_key", "carol"),
                                                                    ("cli", "revoke_key", "carol")]
    assert token not in (hermetic / "audit.jsonl").read_text()


def test_a_home_with_keys_may_serve_beyond_loopback_without_a_server_key():
    pytest.importorskip("uvicorn")
    from marginalia.server.settings import check_binding

    assert check_binding("0.0.0.0", None, False, keys_stored=True) is None
    with pytest.raises(Exception, match="needs a key"):
        check_binding("0.0.0.0", None, False, keys_stored=False)


def test_serve_takes_the_access_options(monkeypatch):
    pytest.importorskip("uvicorn")
    import uvicorn

    started = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets: started.append(server.config.app))
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    err = io.StringIO()
    code = main(["serve", "--model", "scripted:ok", "--port", port, "--trusted-header", "X-Forwarded-User",
                 "--trusted-proxy", "10.0.0.5", "--key-rate", "30", "--key-readings", "2", "--audit-questions"],
                out=io.StringIO(), err=err)
    assert code == 0, err.getvalue()
    settings = started[0].state.service.settings
    assert (settings.trusted_header, settings.trusted_proxies) == ("X-Forwarded-User", ("10.0.0.5",))
    assert (settings.key_rate, settings.key_readings, settings.audit_questions) == (30, 2, True)
    assert "a key is needed" in err.getvalue()


def test_a_grant_on_a_collection_the_home_lacks_is_noted(hermetic: Path):
    (hermetic / "collections" / "handbook").mkdir(parents=True)
    (hermetic / "collections" / "handbook" / "collection.json").write_text("{}", encoding="utf-8")
    code, _, err = keys("create", "bob", "--read", "handbook", "--write", "handbok")
    assert code == 0
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "'handbok'" in notes[0] and "marginalia collections list" in notes[0]
    code, _, err = keys("grant-user", "carol", "--read", "handbook")
    assert code == 0 and "note:" not in err
