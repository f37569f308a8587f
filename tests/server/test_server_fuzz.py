"""Whatever a client sends, the service answers with a status below 500 and, for an error, the one JSON
shape; and a reading that is refused leaves the model free for the next request (hypothesis)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fuzz_support import ask_bodies as bodies
from fuzz_support import post_json, readings, scalars, values
from marginalia.server.schemas import MAX_NAME
from server_support import QUESTION, REPORT, make_client

pytest.importorskip("lancedb")


@pytest.fixture(scope="module")
def client():
    from server_support import index_text

    client = make_client()
    index_text(client, "docs", "report.md", REPORT)
    return client


def check(reply) -> None:
    event(f"status {reply.status_code}")
    assert reply.status_code < 500, reply.text
    if reply.status_code >= 400:
        error = reply.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str) and error["message"]
    elif reply.headers["content-type"].startswith("application/json"):
        data = reply.json()
        assert isinstance(data.get("text", data.get("choices")), str | list)
    else:
        assert any(end in reply.text for end in ("event: done", "event: error", "data: [DONE]"))


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=bodies)
def test_any_ask_body_is_answered_or_refused_cleanly(client, body):
    check(post_json(client, "/v1/ask", body))


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=st.fixed_dictionaries(
    {"message": st.sampled_from([QUESTION, "", "zebra?"]) | scalars},
    optional={"temperature": st.floats(0, 2) | scalars, "certainty_threshold": st.floats(-1, 1) | scalars,
              "uncertainty_threshold": st.floats(-1, 1), "collection": st.just("nowhere") | scalars,
              "openai_model": scalars}))
def test_any_docqa_body_is_answered_or_refused_cleanly(client, body):
    check(post_json(client, "/chat", {"collection": "docs", **body}))


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=st.fixed_dictionaries(
    {"model": st.sampled_from(["marginalia:docs", "marginalia:", "gpt"]) | scalars,
     "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool"]),
                                                 "content": st.sampled_from([QUESTION, ""]) | scalars}),
                          max_size=3) | values},
    optional={"stream": st.booleans() | scalars, "n": scalars, "max_tokens": st.integers(-1, 50) | scalars,
              "temperature": scalars, "marginalia": st.fixed_dictionaries({"reading": readings}) | values}))
def test_any_chat_completion_body_is_answered_or_refused_cleanly(client, body):
    check(post_json(client, "/v1/chat/completions", body))


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=st.binary(max_size=200))
def test_any_bytes_as_a_body_are_refused_cleanly(client, raw):
    reply = client.post("/v1/ask", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code < 500
    if reply.status_code >= 400:
        assert json.loads(reply.text)["error"]["code"]


@pytest.mark.parametrize(("route", "body", "where"), [
    ("/v1/ask", '{"question": "q?", "text": "a \\ud800 b"}', "text, at character 2"),
    ("/v1/ask", '{"question": "q?", "text": "x", "reading": {"pattern": "lc", "\\udc00": 1}}',
     "a field name in reading"),
    ("/v1/sessions", '{"text": "\\udfff"}', "text, at character 0"),
    ("/v1/collections", '{"name": "docs\\ud800"}', "name"),
    ("/v1/chat/completions", '{"model": "marginalia:docs", "messages": [{"role": "user", "content": '
                             '[{"type": "text", "text": "\\ud83d"}]}]}', "messages.0.content.0.text"),
    ("/chat", '{"message": "q?", "openai_model": "\\ud800"}', "openai_model"),
])
def test_a_lone_surrogate_is_refused_as_invalid_unicode(client, route, body, where):
    # JSON's \ud800 escapes decode to strings UTF-8 cannot encode: a pasted text with one was a 500
    reply = client.post(route, content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "validation_error" and "not valid Unicode" in error["message"]
    assert where in error["message"]


def test_a_surrogate_pair_is_valid_unicode(client):
    body = '{"question": "Which pier? \\ud83d\\ude00", "text": "pier 47 \\ud83d\\ude00", "reading": {"pattern": "lc"}}'
    reply = client.post("/v1/ask", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("name", ["a" * 300, "a" * 5000, ".hidden", "a b", "é"])
def test_a_name_no_collection_may_have_is_not_found(client, name):
    # a long one made the file system refuse the path: an unhandled OSError, a 500
    for method, url, body in [("GET", f"/v1/collections/{name}", None),
                              ("DELETE", f"/v1/collections/{name}", None),
                              ("GET", f"/v1/collections/{name}/documents/report.md", None),
                              ("POST", "/v1/ask", {"question": "q?", "collection": name}),
                              ("POST", "/v1/sessions", {"collection": name})]:
        reply = client.request(method, url, json=body)
        if body is not None and len(name) > MAX_NAME:  # a body's name field is bounded: refused as invalid
            assert reply.status_code == 422, (method, url, reply.text)
            assert f"at most {MAX_NAME} characters" in reply.json()["error"]["message"]
            continue
        assert reply.status_code == 404, (method, url, reply.text)
        assert reply.json()["error"]["code"] == "not_found"


# -- the fuzz benchmark's parts that count time and memory, against the service in its own process -------------

MAX_CONNECTIONS = 6


@pytest.fixture(scope="module")
def fuzz():
    from benchmark_scripts import load

    return load("server_fuzz")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from fuzz_support import LiveService, MemoryWatch

    with LiveService(tmp_path_factory.mktemp("live"), header_timeout=1.0, body_timeout=1.0, body_total_timeout=3.0,
                     max_connections=MAX_CONNECTIONS, body_rate_grace=1.0, body_bytes_in_flight=100 * 2**20) as service:
        watch = MemoryWatch(service.pid)
        yield service, watch
        watch.close()


def statuses(part) -> dict[str, int]:
    """A part's outcomes by status alone, whatever their kind."""
    out: dict[str, int] = {}
    for outcome, count in part.outcomes.items():
        status = outcome.rpartition(": ")[2]
        out[status] = out.get(status, 0) + count
    return out


def test_a_bomb_upload_is_followed_to_its_end_and_timed(fuzz, live):
    service, watch = live
    part = fuzz.run_bombs(service, watch, 1, kinds=fuzz.BOMBS[:1])  # the bomb: 200 MB of operators
    assert part.where == "own process"
    assert dict(part.outcomes) == {"document_too_large": 1}
    assert part.inputs == len(part.times) == 1 and 0 < part.times[0] < 60
    assert part.probes and part.server_errors == 0 and part.unhandled == 0
    assert part.peak_rss_mb > 50  # the server process at least
    summary = part.summary(time_bound=60)
    assert summary["slowest_s"] == summary["p99_s"] == part.times[0] and summary["over_time_bound"] == 0
    assert summary["health_slowest_s"] == max(part.probes)


def test_slow_clients_end_at_the_servers_bounds(fuzz, live):
    service, watch = live
    part = fuzz.run_slow(service, watch, 2)
    outcomes = dict(part.outcomes)
    for kind in ("body shorter than declared", "headers trickled", "body trickled"):
        assert outcomes.pop(f"{kind}: 408") == 2, part.outcomes
    assert outcomes.pop("past the connection limit: 503") == 2, part.outcomes
    # the connections held open past the limit: one of them may be refused at once (the health checks' is open)
    assert sum(outcomes.values()) == MAX_CONNECTIONS and set(outcomes) <= {"held open: 408", "held open: 503"}
    assert max(part.times) < 3.0 + 5  # the whole body's bound, and a margin for a busy machine
    assert part.server_errors == 0 and service.tally.busy >= 2  # a 503 past the limit is a refusal


def test_wide_bodies_are_refused_cleanly(fuzz, live):
    service, watch = live
    part = fuzz.run_wide(service, watch, 1, scale=0.01)
    assert part.inputs == len(fuzz.WIDE_KINDS) == len(part.times)
    assert {o.split(": ")[0] for o in part.outcomes} == set(fuzz.WIDE_KINDS)
    assert all(400 <= int(status) < 500 for status in statuses(part)), part.outcomes
    assert part.server_errors == 0 and part.notes["largest_reply_mb"] > 0


def test_wide_bodies_are_what_they_say(fuzz):
    route, body = fuzz.wide_body("unknown keys", 0, scale=0.01)
    data = json.loads(body)
    assert route == "/v1/ask" and len(data) == 2 + 20_000
    _, body = fuzz.wide_body("deep arrays", 0, scale=0.01)
    assert body.count(b"[") == 10_000
    _, body = fuzz.wide_body("huge strings", 1, scale=1.0)
    assert max(len(v) for v in json.loads(body).values() if isinstance(v, str)) >= 1_000_000


def test_foreign_origins_and_hosts_are_counted_by_status(fuzz, live):
    service, watch = live
    part = fuzz.run_origins(service, watch, 12)
    assert part.inputs == 12 and sum(part.outcomes.values()) == 12
    kinds = {o.split(": ")[0] for o in part.outcomes}
    assert kinds == {"Origin", "Host", "own"}
    own = [int(o.split(": ")[1]) for o in part.outcomes if o.startswith("own")]
    assert all(200 <= status < 300 for status in own), part.outcomes  # the page's own origin is served
    assert all(int(status) < 500 for status in statuses(part)) and part.server_errors == 0


def test_a_question_over_text_without_full_stops_is_timed(fuzz, live):
    service, watch = live
    part = fuzz.run_unpunctuated(service, watch, 1, kb=3)
    assert part.notes["kb"] == 3 and dict(part.outcomes) == {"200": 1} and len(part.times) == 1
    text = fuzz.unpunctuated(3000, seed=0)
    assert len(text) == 3000 and fuzz.FERRY in text and not set(".!?\n") & set(text)


def test_pages_of_unterminated_tags_are_indexed_or_refused_in_time(fuzz, live):
    service, watch = live
    part = fuzz.run_hostile_html(service, watch, 30)
    assert part.inputs == len(fuzz.HOSTILE_UNITS) and part.bound == fuzz.HTML_BOUND
    assert {o.split(": ")[1] for o in part.outcomes} <= {"indexed", "empty_document"}, part.outcomes
    assert max(part.times) < fuzz.HTML_BOUND and part.server_errors == 0


def test_bodies_past_the_bytes_in_flight_are_refused_at_once(fuzz, live):
    service, watch = live
    part = fuzz.run_in_flight(service, watch, 2)  # 100 MiB in flight hold two bodies of 40 MB
    assert dict(part.outcomes) == {"past the bound: 503": 2, "held: 408": 2}, part.outcomes
    assert part.broken == 0 and part.server_errors == 0, part.problems


def test_huge_names_are_not_echoed(fuzz, live):
    service, watch = live
    part = fuzz.run_echoes(service, watch, 1)
    assert part.inputs == len(fuzz.ECHOED) and all(400 <= int(s) < 500 for s in statuses(part)), part.outcomes
    assert part.notes["largest_reply_bytes"] < fuzz.SMALL_REPLY and part.broken == 0


def test_bodies_that_could_freeze_the_loop_are_refused(fuzz, live):
    service, watch = live
    part = fuzz.run_frozen(service, watch, 1, millions=0.2)
    assert {o.split(": ")[0] for o in part.outcomes} == set(fuzz.FROZEN_KINDS)
    assert all(400 <= int(s) < 500 for s in statuses(part)) and part.server_errors == 0, part.outcomes
    assert json.loads(fuzz.frozen_body("many unknown keys", 0.012)).keys() >= {"question", "k0", "k999"}


def test_trickled_bodies_are_cut_by_the_minimum_rate(fuzz, live):
    service, watch = live
    part = fuzz.run_trickle(service, watch, 2)
    assert dict(part.outcomes) == {"408 (rate)": 2} and part.broken == 0, part.problems
    assert max(part.times) < 3.0  # the rate's grace (1 s), before the whole body's bound


def test_only_leaves_out_the_parts_it_does_not_name(fuzz, monkeypatch):
    import argparse

    args = argparse.Namespace(**{name.replace("-", "_"): 3 for name in fuzz.PART_OPTIONS}, keyless_mb=50,
                              only=["kills", "echo-mb"])
    fuzz.only(argparse.ArgumentParser(), args)
    assert (args.kills, args.echo_mb, args.keyless_mb, args.requests, args.html_kb) == (3, 3, 50, 0, 0)
    with pytest.raises(SystemExit):
        fuzz.only(argparse.ArgumentParser(), argparse.Namespace(only=["nothing"]))


def test_a_part_counts_inputs_and_health_checks_over_the_time_bound(fuzz):
    part = fuzz.Part("p")
    for seconds in [0.1] * 98 + [2.0, 3.0]:
        part.took("200", seconds)
    part.probes = [0.01, 5.0]
    summary = part.summary(time_bound=1.0)
    assert summary["slowest_s"] == 3.0 and summary["p99_s"] == 2.0 and summary["over_time_bound"] == 3
    assert summary["health_slowest_s"] == 5.0 and summary["outcomes"] == {"200": 100}
    assert fuzz.percentile([], 99) is None


def test_the_memory_watch_counts_children_and_peaks_between_samples():
    import os
    import subprocess
    import sys

    from fuzz_support import MIB, MemoryWatch
    from server_support import wait_for

    watch = MemoryWatch(os.getpid(), interval=0.01)
    try:
        watch.reset()
        base = watch.rss() / MIB
        child = subprocess.Popen([sys.executable, "-c", "import sys; x = bytearray(200 * 2**20); x[::4096] = "
                                  "b'1' * len(x[::4096]); print('ready', flush=True); sys.stdin.read()"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert child.stdout.readline() == b"ready\n"
            wait_for(lambda: watch.peak_mb() > base + 190, timeout=10)  # the child's memory counts
        finally:
            child.communicate(b"")
        if sys.platform.startswith("linux"):  # the high-water mark: a peak no sample may have seen
            watch.reset()
            block = bytearray(300 * MIB)
            block[::4096] = b"1" * len(block[::4096])
            del block
            assert watch.peak_mb() > 300
    finally:
        watch.close()
