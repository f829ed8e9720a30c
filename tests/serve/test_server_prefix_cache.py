"""The prefix cache through a real `fides-rag serve` process: a second chat request with the same system prompt and
documents as the first reuses its blocks, and `/metrics` shows the hit."""

from __future__ import annotations

import re

import httpx

SYSTEM = (
    "You are a careful assistant. Answer from the documents, in one short sentence, and say so when they do not tell. "
    * 6
)
DOCS = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.", "It was built for the 1889 World's Fair."]


def _metric(server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return float(re.search(rf"^{name} (\S+)$", text, re.MULTILINE).group(1))


def _ask(server, question: str) -> dict:
    body = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "documents": DOCS,
        "max_tokens": 4,
        "method": "fides",
    }
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_second_request_with_the_same_system_prompt_and_documents_hits_the_prefix_cache(tiny_model_dir, start_server):
    server = start_server(tiny_model_dir, "--max-num-batched-tokens", "64")
    _ask(server, "Where is the Eiffel Tower?")
    hits, hit_tokens = _metric(server, "fides_prefix_cache_hits"), _metric(server, "fides_prefix_cache_hit_tokens")
    second = _ask(server, "When was the tower built?")
    assert second["usage"]["prompt_tokens"] > 200
    assert _metric(server, "fides_prefix_cache_hits") >= hits + 2  # both paths
    assert _metric(server, "fides_prefix_cache_hit_tokens") - hit_tokens >= 200
    assert _metric(server, "fides_prefix_cache_bytes") > 0
    assert server.stop() == 0
