"""The ``openai:`` spec's form and option names, apart from the backend so that the
registry can show them in --help without importing httpx."""

from __future__ import annotations

#: the spec's form, for --help's model list and the backend's errors
OPENAI_SPEC_FORM = ("openai:<base-url>#<model>[;mode=completions|chat][;prompt=tokens|text]"
                    "[;tokenizer=<spec>][;window=<tokens>][;timeout=<seconds>][;concurrency=<n>]"
                    "[;x-<body field>=<value>]")
#: the APIs the backend speaks: /completions (token prompts) or /chat/completions
MODES = ("completions", "chat")
#: the ``;key=value`` options after the model id (``x-<field>`` ones aside)
OPTIONS = ("mode", "prompt", "tokenizer", "window", "timeout", "concurrency")
