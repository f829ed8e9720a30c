"""Logprobs agree with usage as OpenAI's API has them: one `logprobs` entry per completion token, the end-of-turn
token that ended the answer included (its token string as the tokenizer writes it; it is not part of the text).
In-process
app, tiny model steered to write "Z" three times and then its end token: a 4-token answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fides_rag import FidesDecoder
from fides_rag.serve.app import build_app
from fides_rag.testing import build_tiny_model

ANSWER_TOKENS = 4
ASK = [{"role": "user", "content": "Where is the Eiffel Tower?"}]
DOCS = ["The Eiffel Tower is in Rome."]


class Steered:
    """A test client whose model writes "Z", "Z", "Z", then its end token (counted from `reset`, one head call a
    token)."""

    def __init__(self, tokenizer: Any) -> None:
        model = build_tiny_model("llama", len(tokenizer))
        self.z = tokenizer("Z", add_special_tokens=False)["input_ids"][0]
        self.eos = tokenizer.eos_token
        self.calls = 0
        eos_id = tokenizer.eos_token_id

        def steer(_module: Any, _inputs: Any, logits: Any) -> Any:
            logits = logits.clone()
            logits[..., eos_id if self.calls % ANSWER_TOKENS == ANSWER_TOKENS - 1 else self.z] += 1000.0
            self.calls += 1
            return logits

        model.lm_head.register_forward_hook(steer)
        self.client = TestClient(build_app(FidesDecoder(model, tokenizer, max_new_tokens=8), model_name="tiny"))

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls = 0
        response = self.client.post(path, json={"model": "tiny", "method": "standard", "max_tokens": 8, **body})
        assert response.status_code == 200, response.text
        return response.json()

    def stream(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        self.calls = 0
        body = {
            "model": "tiny",
            "method": "standard",
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
            **body,
        }
        with self.client.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            return [json.loads(line[len("data: ") :]) for line in response.iter_lines() if line.startswith("data: {")]


@pytest.fixture(scope="module")
def steered(chat_tokenizer) -> Steered:
    return Steered(chat_tokenizer)


def test_chat_logprobs_have_one_entry_per_completion_token_the_end_token_included(steered):
    body = steered.post(
        "/v1/chat/completions", {"messages": ASK, "documents": DOCS, "logprobs": True, "top_logprobs": 2}
    )
    choice, usage = body["choices"][0], body["usage"]
    content = choice["logprobs"]["content"]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "ZZZ"
    assert usage["completion_tokens"] == ANSWER_TOKENS and len(content) == ANSWER_TOKENS
    assert [e["token"] for e in content] == ["Z", "Z", "Z", steered.eos]
    assert "".join(e["token"] for e in content[:-1]) == choice["message"]["content"]
    assert content[-1]["bytes"] == list(steered.eos.encode()) and content[-1]["logprob"] <= 0
    assert len(content[-1]["top_logprobs"]) == 2 and content[-1]["top_logprobs"][0]["token"] == steered.eos


def test_streamed_chat_logprobs_agree_with_its_usage(steered):
    chunks = steered.stream("/v1/chat/completions", {"messages": ASK, "documents": DOCS, "logprobs": True})
    entries = [
        e
        for c in chunks
        if c.get("choices") and c["choices"][0].get("logprobs")
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert (
        usage["completion_tokens"] == ANSWER_TOKENS
        and len(entries) == ANSWER_TOKENS
        and entries[-1]["token"] == steered.eos
    )


def test_completions_logprobs_have_one_token_per_completion_token_the_end_token_at_the_texts_end(steered):
    body = steered.post("/v1/completions", {"prompt": "Where is the Eiffel Tower?", "documents": DOCS, "logprobs": 2})
    choice, usage = body["choices"][0], body["usage"]
    logprobs = choice["logprobs"]
    assert usage["completion_tokens"] == ANSWER_TOKENS and choice["text"] == "ZZZ"
    assert (
        logprobs["tokens"] == ["Z", "Z", "Z", steered.eos]
        and len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == ANSWER_TOKENS
    )
    assert logprobs["text_offset"] == [0, 1, 2, 3]


def test_streamed_completions_logprobs_agree_with_its_usage(steered):
    chunks = steered.stream(
        "/v1/completions", {"prompt": "Where is the Eiffel Tower?", "documents": DOCS, "logprobs": 1}
    )
    tokens = [
        t
        for c in chunks
        if c.get("choices") and c["choices"][0].get("logprobs")
        for t in c["choices"][0]["logprobs"]["tokens"]
    ]
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert usage["completion_tokens"] == ANSWER_TOKENS and tokens == ["Z", "Z", "Z", steered.eos]
