"""A few hundred random and mutated bodies (seeded, bounded in count and time) never get a 5xx, and the server stays
up and answers a good request afterwards."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

BODIES = 300
BUDGET_S = 240
EXTREMES: list[Any] = [None, True, False, 0, -1, 1, 2**31, 2**63, 2**64, -(2**63), 10**400, 0.0, -0.0, 1e-300, 1e308, -1e308,
                       "", "12", "yes", "\u0000", "\ud800", "<|end|>", "x" * 5000, [], [None], {}, {"a": {}}, [[[[[]]]]], "NaN"]
FIELDS = ["messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options",
          "documents", "method", "fides_config", "no_context_path", "user", "model", "prompt", "unknown_field"]
GOOD = {"messages": [{"role": "user", "content": "Where is the tower?"}], "documents": ["The tower is in Rome."], "max_tokens": 3}


def _mutated(rng: random.Random) -> bytes:
    body: Any = json.loads(json.dumps(GOOD))
    for _ in range(rng.randint(1, 3)):
        if not isinstance(body, dict):
            break
        kind = rng.random()
        if kind < 0.5:
            body[rng.choice(FIELDS)] = rng.choice(EXTREMES)
        elif kind < 0.7:
            message = {"role": rng.choice(["user", "assistant", "system", "tool", "developer", "robot", 7]),
                       "content": rng.choice(EXTREMES + ["fine", [{"type": "text", "text": "hi"}], [{"type": "image"}]])}
            if rng.random() < 0.3:
                message["tool_calls"] = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": rng.choice(["{}", "[1]", "{", "7"])}}]
            earlier = body.get("messages") if isinstance(body.get("messages"), list) else []
            body["messages"] = [*earlier, message] if rng.random() < 0.7 else [message]
        elif kind < 0.8:
            body.pop(rng.choice(FIELDS), None)
        else:
            body = rng.choice(EXTREMES)
    if isinstance(body, dict) and isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool) and 3 < body["max_tokens"] < 2**20:
        body["max_tokens"] = 3  # a valid budget stays short; the extremes past the window are refused before decoding
    text = json.dumps(body, allow_nan=True)
    if rng.random() < 0.15:  # broken bytes: cut, spliced, or a random byte flipped
        raw = bytearray(text.encode("utf-8", "surrogatepass"))
        at = rng.randrange(len(raw))
        raw[at] = rng.randrange(256)
        return bytes(raw[: rng.randint(at, len(raw))])
    return text.encode("utf-8", "surrogatepass")


def test_random_and_mutated_bodies_never_get_a_5xx(server):
    rng = random.Random(2026)
    bodies = [_mutated(rng) for _ in range(BODIES)]
    deadline = time.monotonic() + BUDGET_S

    def send(raw: bytes) -> tuple[int, bytes]:
        if time.monotonic() > deadline:
            return 0, raw
        path = "/v1/completions" if b'"prompt"' in raw else "/v1/chat/completions"
        response = httpx.post(f"{server.url}{path}", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
        if 400 <= response.status_code < 500:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}, response.text[:300]
        return response.status_code, raw

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(send, bodies))
    sent = [status for status, _ in outcomes if status]
    failures = [(status, raw[:300]) for status, raw in outcomes if status >= 500]
    assert not failures, failures[:5]
    assert len(sent) >= BODIES // 2 and {200, 400} <= set(sent), sorted(set(sent))
    assert httpx.get(f"{server.url}/health").status_code == 200
    good = httpx.post(f"{server.url}/v1/chat/completions", json=GOOD, timeout=60)
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] is not None


@pytest.fixture(scope="module")
def server(tiny_model_dir, start_server_module):
    return start_server_module(tiny_model_dir, "--max-new-tokens", "3")
