"""The OpenAI-compatible HTTP backend (``openai:`` specs): the generator (`backend`), the replies it accepts
(`replies`), llama-server's slots (`prefix_cache`) and the spec's form (`spec`, importable without httpx)."""
