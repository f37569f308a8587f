"""The OpenAI-compatible HTTP backend (``openai:`` specs), along its seams.

`backend` holds the generator, whose KV cache is a local token prefix, and the spec's parser; `requests` builds
and sends its requests (retries, errors); `streaming` reads a reply's event stream; `usage` books what a server
says it computed; `prefix_cache` steers llama-server's slots so that a reading finds its prefix; `replies`
validates what servers send and `spec` holds the spec's form. Only `spec` is imported before an ``openai:``
spec is loaded: it needs no HTTP library.
"""
