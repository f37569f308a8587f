"""The ``openai:`` spec's form and option names, apart from the backend so that the
registry can show them in --help without importing httpx."""

from __future__ import annotations

import re

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
