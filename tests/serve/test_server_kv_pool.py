"""Fast mode's KV pool through a real `fides-rag serve` process: a request that can never fit the pool gets a 400 in
OpenAI's error shape naming the pool, the server keeps answering, and /metrics shows the pool's size and use."""

from __future__ import annotations

import re

import httpx

CHAT = "/v1/chat/completions"


def _metric(server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return float(re.search(rf"^{name} (\S+)$", text, re.MULTILINE).group(1))


def test_a_request_past_the_kv_pool_gets_a_400_and_the_pool_shows_in_metrics(tiny_model_dir, start_server):
    server = start_server(tiny_model_dir, "--mode", "fast", "--kv-pool-tokens", "512", "--max-new-tokens", "4")
    body = {
        "messages": [{"role": "user", "content": "Where is the tower?"}],
        "documents": ["tower " * 400],
        "method": "fides",
    }
    refused = httpx.post(f"{server.url}{CHAT}", json=body, timeout=120)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (
        error["code"] == "kv_pool_exceeded" and error["param"] == "max_tokens" and "kv_pool_tokens" in error["message"]
    )
    answered = httpx.post(
        f"{server.url}{CHAT}", json={"messages": [{"role": "user", "content": "Where?"}], "max_tokens": 3}, timeout=120
    )
    assert answered.status_code == 200, answered.text
    assert _metric(server, "fides_kv_pool_tokens") == 512
    assert _metric(server, "fides_kv_pool_used_tokens") == 0
    assert server.stop() == 0
