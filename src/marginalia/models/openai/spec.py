"""The ``openai:`` spec's form, option names and server checks, apart from the backend so that the
registry can show them in --help without importing httpx."""

from __future__ import annotations

import re

from ...errors import UserError

#: the spec's form, for --help's model list and the backend's errors
OPENAI_SPEC_FORM = ("openai:<base-url>#<model>[;mode=completions|chat][;prompt=tokens|text]"
                    "[;tokenizer=<spec>][;window=<tokens>][;timeout=<seconds>][;concurrency=<n>]"
                    "[;x-<body field>=<value>]")
#: the APIs the backend speaks: /completions (token prompts) or /chat/completions
MODES = ("completions", "chat")
#: the ``;key=value`` options after the model id (``x-<field>`` ones aside)
OPTIONS = ("mode", "prompt", "tokenizer", "window", "timeout", "concurrency")


#: a URL's scheme, the user name and password before its host, its address, and its query string
_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s'\"]*@)?"
                  r"(?P<address>[^?#\s'\"]*)(?P<query>\?[^#\s'\"]*)?")


def public_spec(text: str) -> str:
    """``text`` (a model spec, or a message that quotes one or its URL) with every URL's credentials
    (``user:password@``) and query string (``?key=...``) taken out: what may be shown to anyone, logged or
    sent in a reply."""
    return _URL.sub(lambda m: m["scheme"] + m["address"], text)


def check_server(base_url: str, mode: str) -> None:
    """Reject a URL that is not http(s) or an unknown mode, with what to write instead."""
    if not re.match(r"https?://[^/]", base_url):
        raise UserError(f"the server URL {base_url!r} must start with http:// or https://")
    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r} for {public_spec(base_url)}; choose one of {', '.join(MODES)}")
