"""`marginalia serve`: its options reach the server's settings, and it refuses to expose a server without
a key beyond this machine."""

from __future__ import annotations

import io

import pytest

from marginalia.cli import main
from marginalia.server.settings import ENV_ALLOWED_HOSTS, ENV_SERVER_KEY, Settings, check_binding, is_loopback

pytest.importorskip("uvicorn")


@pytest.fixture
def started(monkeypatch):
    """uvicorn's Server.run replaced by a recorder: what serve would have started, on which socket."""
    import socket

    import uvicorn

    calls = []

    def run(server, sockets):
        (sock,) = sockets
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)  # streamed events leave at once
        host, port = sock.getsockname()[:2]
        calls.append((server.config.app, {"host": server.config.host, "port": server.config.port,
                                          "bound": (host, port), "http": server.config.http}))

    monkeypatch.setattr(uvicorn.Server, "run", run)
    return calls


def serve(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    if "--port" not in argv:
        argv = (*argv, "--port", str(free_port()))
    code = main(["serve", "--model", "scripted:ok", *argv], out=io.StringIO(), err=err)
    return code, err.getvalue()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_binds_loopback_by_default_without_a_key(started):
    port = free_port()
    code, err = serve("--port", str(port))
    assert code == 0 and f"on http://127.0.0.1:{port} (web page at /, API at /v1, docs at /docs; no key)" in err
    ((app, kw),) = started
    assert kw["bound"] == ("127.0.0.1", port)
    settings = app.state.service.settings
    assert settings.api_key is None and settings.cors_origins == ()
    assert settings.max_upload_bytes == Settings().max_upload_bytes
    assert app.state.service.model_name == "scripted"  # loaded before the server starts
    assert settings.cache_readings and app.state.service.readings is not None


def test_serve_passes_its_document_limits_to_the_server(started):
    from marginalia.options import IngestOptions

    assert serve()[0] == 0
    assert serve("--max-pages", "5", "--max-inflated-mb", "20", "--convert-timeout", "2.5",
                 "--convert-memory-mb", "900")[0] == 0
    (default, given) = (app.state.service.settings.ingest for app, _ in started)
    assert default == IngestOptions()
    assert given == IngestOptions(max_pages=5, max_inflated_mb=20, convert_timeout=2.5, convert_memory_mb=900)


def test_serve_answers_to_its_address_and_the_hosts_it_is_given(started, monkeypatch):
    from marginalia.server.net import send_json_400

    assert serve()[0] == 0
    assert serve("--allowed-host", "notes.example.org", "--allowed-host", "*.lan.example")[0] == 0
    monkeypatch.setenv(ENV_ALLOWED_HOSTS, "a.example, b.example")
    assert serve("--host", "::1")[0] == 0
    assert serve("--allowed-host", "c.example")[0] == 0  # the option over the environment
    settings = [app.state.service.settings for app, _ in started]
    assert [(s.host, s.allowed_hosts) for s in settings] == [
        ("127.0.0.1", ()), ("127.0.0.1", ("notes.example.org", "*.lan.example")), ("::1", ("a.example", "b.example")),
        ("127.0.0.1", ("c.example",))]
    # a request uvicorn cannot parse is answered in the JSON error shape (tests/server/test_server_edge.py)
    assert started[0][1]["http"].send_400_response is send_json_400


def test_serve_refuses_an_allowed_host_that_is_not_a_name(started):
    code, err = serve("--allowed-host", "https://notes.example.org")
    assert code == 2 and "not a host name" in err and not started


def test_serve_without_the_reading_cache(started):
    assert serve("--no-cache")[0] == 0
    ((app, _),) = started
    assert not app.state.service.settings.cache_readings and app.state.service.readings is None


def test_serve_refuses_another_address_without_a_key(started):
    code, err = serve("--host", "0.0.0.0")
    assert code == 2 and not started
    assert "--server-key" in err and "--no-auth" in err and ENV_SERVER_KEY in err


def test_serve_with_no_auth_warns(started):
    code, err = serve("--host", "0.0.0.0", "--no-auth")
    assert code == 0 and "warning" in err and "without a key" in err
    assert started[0][0].state.service.settings.api_key is None


def test_serve_takes_the_key_from_the_option_or_the_environment(started, monkeypatch):
    assert serve("--host", "0.0.0.0", "--server-key", "sesame")[0] == 0
    monkeypatch.setenv(ENV_SERVER_KEY, "from-env")
    assert serve("--host", "::", "--cors-origin", "https://a.example", "--cors-origin", "https://b.example",
                 "--queue", "3", "--max-upload-mb", "2")[0] == 0
    first, second = (app.state.service.settings for app, _ in started)
    assert first.api_key == "sesame" and second.api_key == "from-env"
    assert second.cors_origins == ("https://a.example", "https://b.example")
    assert (second.queue_size, second.max_upload_bytes) == (3, 2 * 1024 * 1024)
    code, err = serve("--server-key", "k", "--no-auth")
    assert code == 2 and "not both" in err


def test_serve_refuses_api_key_naming_both_keys(started):
    # --api-key was the model server's key: a user who meant to protect the server would get an open one
    code, err = serve("--api-key", "sesame")
    assert code == 2 and not started
    assert "--server-key" in err and "--model-api-key" in err and ENV_SERVER_KEY in err, err
    assert serve("--server-key", "sesame", "--model-api-key", "sk-model")[0] == 0
    settings = started[0][0].state.service.settings
    assert (settings.api_key, settings.model_api_key) == ("sesame", "sk-model")


def test_serve_says_when_its_port_is_taken(started):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        code, err = serve("--port", str(taken.getsockname()[1]))
    assert code == 2 and "cannot listen" in err and "--port" in err and not started


@pytest.mark.parametrize("port", ["65536", "99999", "0", "-1", "http"])
def test_a_port_that_cannot_be_is_a_usage_error(started, port, capsys):
    with pytest.raises(SystemExit) as exit_:
        serve("--port", port)
    assert exit_.value.code == 2 and "--port" in capsys.readouterr().err and not started


def test_the_default_port_is_8000():
    from marginalia.cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port) == ("127.0.0.1", 8000)


def test_serve_checks_its_collection_before_starting(started):
    code, err = serve("--collection", "nowhere")
    assert code == 2 and "nowhere" in err and not started


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("[::1]", True), ("127.0.0.2", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.4", False), ("example.org", False),
])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback
    if loopback:
        assert check_binding(host, None, False) is None


def test_serve_passes_its_bounds_to_the_settings_and_uvicorn(monkeypatch):
    import uvicorn

    configs = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets: configs.append(server.config))
    code, _ = serve("--max-connections", "7", "--header-timeout", "2.5", "--body-timeout", "3",
                    "--body-total-timeout", "40", "--keep-alive", "2", "--shutdown-timeout", "4", "--max-header-kb",
                    "8", "--upload-queue", "3", "--upload-queue-mb", "9", "--session-mb", "11")
    assert code == 0
    (config,) = configs
    s = config.app.state.service.settings
    assert (s.max_connections, s.header_timeout, s.body_timeout, s.body_total_timeout) == (7, 2.5, 3.0, 40.0)
    assert (s.upload_queue, s.upload_queue_bytes, s.session_bytes) == (3, 9 * 1024 * 1024, 11 * 1024 * 1024)
    assert (config.timeout_keep_alive, config.timeout_graceful_shutdown) == (2, 4)
    assert config.h11_max_incomplete_event_size == 8 * 1024
    assert config.http.__name__ == "BoundedH11"  # headers' deadline and the connection limit


def test_serve_defaults_bound_every_connection(started):
    assert serve()[0] == 0
    ((app, _),) = started
    s = app.state.service.settings
    assert s == Settings(home=s.home, model=s.model, device=s.device, backend=s.backend, embedder=s.embedder)


@pytest.mark.parametrize("flag", ["--body-timeout", "--header-timeout", "--body-total-timeout"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "1e308", "soon"])
def test_a_timeout_that_is_no_time_or_unbounded_is_a_usage_error(started, flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        serve(flag, value)
    assert exit_.value.code == 2 and flag in capsys.readouterr().err
