"""The OpenAI-compatible server as a real process, driven by the official `openai` client and raw HTTP: answers,
streams, FIDES's record, tool messages as documents, concurrency, bad requests, the queue bound, disconnects."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

DOCS = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]
QUESTION = "Where is the Eiffel Tower?"


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _ask(client: openai.OpenAI, question: str = QUESTION, documents=DOCS, extra: dict | None = None, **kwargs):
    return client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": question}],
        extra_body={"documents": documents, **(extra or {})},
        **kwargs,
    )


def test_chat_completion_carries_the_answer_usage_and_fides_record(server):
    response = _ask(_client(server), max_tokens=6)
    record = response.model_extra["fides"]
    assert response.object == "chat.completion" and response.choices[0].message.role == "assistant"
    assert response.choices[0].finish_reason in ("stop", "length")
    assert record["method"] == "fides" and record["documents_source"] == "documents" and record["fallback"] is None
    assert len(record["alphas"]) == response.usage.completion_tokens <= 6
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens > 0


def test_stream_chunks_join_to_the_unstreamed_answer(server):
    client = _client(server)
    whole = _ask(client, max_tokens=10).choices[0].message.content
    chunks = list(_ask(client, max_tokens=10, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and "fides" not in finals[0].model_extra
    record = chunks[-1].model_extra["fides"]  # the record rides in the last chunk, here the usage chunk
    assert (
        record["method"] == "fides"
        and chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == len(record["alphas"])
    )
    without_usage = list(_ask(client, max_tokens=10, stream=True))
    assert without_usage[-1].choices[0].finish_reason and without_usage[-1].model_extra["fides"]["method"] == "fides"


def test_completions_endpoint_streamed_and_not(server):
    client = _client(server)
    prompt = f"Document: {DOCS[0]}\nQuestion: {QUESTION}\nAnswer:"
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, extra_body={"documents": DOCS})
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="tiny", prompt=prompt, max_tokens=8, stream=True, extra_body={"documents": DOCS}
        )
    )
    assert whole.object == "text_completion" and streamed == whole.choices[0].text
    assert whole.model_extra["fides"]["documents_source"] == "documents"  # found in the prompt: contrasted in place


def test_method_and_no_documents_are_recorded(server):
    client = _client(server)
    cad = _ask(client, max_tokens=4, extra={"method": "cad"})
    assert cad.model_extra["fides"]["method"] == "cad"
    gated = _ask(client, max_tokens=4, extra={"method": "fides+agree"}).model_extra["fides"]
    assert (
        gated["method"] == "fides+agree"
        and all(step["gate"] in (0, 1, 3) for step in gated["steps"])
        and gated["steps"]
    )
    plain = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}], max_tokens=4)
    record = plain.model_extra["fides"]
    assert (
        record["method"] == "standard" and record["documents_source"] == "none" and "no documents" in record["fallback"]
    )


def test_a_system_message_with_context_is_the_context_as_in_process(server):
    messages = [{"role": "system", "content": f"Context: {DOCS[0]}"}, {"role": "user", "content": QUESTION}]
    record = _client(server).chat.completions.create(model="tiny", messages=messages, max_tokens=4).model_extra["fides"]
    assert record["method"] == "fides" and record["documents_source"] == "system_message" and record["fallback"] is None
    assert DOCS[0] in record["context_prompt"] and DOCS[0] not in record["no_context_prompt"]


def test_tool_messages_are_the_documents(server):
    messages = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search", "arguments": json.dumps({"query": "Eiffel Tower"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": DOCS[0]},
    ]
    response = _client(server).chat.completions.create(model="tiny", messages=messages, max_tokens=4)
    record = response.model_extra["fides"]
    assert (
        record["documents_source"] == "tool_messages" and record["method"] == "fides" and record["num_documents"] == 1
    )
    assert DOCS[0] in record["context_prompt"] and DOCS[0] not in record["no_context_prompt"]


def test_sixteen_concurrent_requests_each_equal_their_sequential_answer(server):
    client = _client(server)
    questions = [f"Question number {i}: where is it?" for i in range(16)]
    budgets = [4 + (i % 5) * 2 for i in range(16)]
    alone = [_ask(client, q, max_tokens=n).choices[0].message.content for q, n in zip(questions, budgets)]
    with ThreadPoolExecutor(16) as pool:
        together = list(
            pool.map(
                lambda qn: _ask(client, qn[0], max_tokens=qn[1]).choices[0].message.content, zip(questions, budgets)
            )
        )
    assert together == alone


@pytest.mark.parametrize(
    "body, param",
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "method": "no-such-method"}, "method"),
        ({"messages": [{"role": "user", "content": "hi"}], "method": "standard+agree"}, "method"),
        ({"messages": [{"role": "user", "content": "hi"}], "method": "fides+agree+nwcad"}, "method"),
        ({"messages": [{"role": "user", "content": "hi"}], "documents": ["fine", 7]}, "documents.1"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "best_of": 2}, "best_of"),
        ({"messages": [{"role": "system", "content": "only a system turn"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "fides_config": {"no_such_constant": 1}}, "fides_config"),
    ],
)
def test_bad_requests_get_a_400_in_openai_shape(server, body, param):
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    error = response.json()["error"]
    assert response.status_code == 400 and error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"]


def test_malformed_json_and_the_openai_client_error(server):
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.BadRequestError, match="unknown method"):
        _ask(_client(server), extra={"method": "nope"})


def test_models_health_and_metrics(server):
    assert httpx.get(f"{server.url}/v1/models").json()["data"][0]["object"] == "model"
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    metrics = httpx.get(f"{server.url}/metrics").text
    for name in (
        "fides_requests_total",
        "fides_completion_tokens_total",
        "fides_queue_length",
        "fides_rows_in_flight",
        "fides_request_latency_seconds_bucket",
        "fides_time_to_first_token_seconds_bucket",
    ):
        assert name in metrics
    assert 'fides_requests_total{endpoint="chat",status="200"}' in metrics


LONG = "Tell me a long story."


def test_a_client_that_disconnects_frees_its_rows(server):
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": LONG}], "documents": DOCS, "max_tokens": 6000, "stream": True},
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/health").json()["requests_in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(f"{server.url}/health").json()["requests_in_flight"] == 0
    assert 'fides_requests_total{endpoint="chat",status="499"} 1.0' in httpx.get(f"{server.url}/metrics").text


def test_full_queue_gets_429_with_retry_after_and_others_are_unharmed(tiny_model_dir, start_server):
    server = start_server(tiny_model_dir, "--max-batch-size", "1", "--max-queue", "1")

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"messages": [{"role": "user", "content": LONG}], "documents": DOCS, "max_tokens": 400}
            return await asyncio.gather(
                *(client.post(f"{server.url}/v1/chat/completions", json=body) for _ in range(6))
            )

    try:
        responses = asyncio.run(fire())
        refused = [r for r in responses if r.status_code == 429]
        served = [r for r in responses if r.status_code == 200]
        assert refused and served and len(refused) + len(served) == 6
        assert all(r.headers["retry-after"] and r.json()["error"]["code"] == "queue_full" for r in refused)
        assert len({r.json()["choices"][0]["message"]["content"] for r in served}) == 1  # the same greedy answer
    finally:
        assert server.stop() == 0


def test_sigterm_finishes_the_requests_in_flight_then_exits(tiny_model_dir, start_server):
    server = start_server(tiny_model_dir)
    body = {"messages": [{"role": "user", "content": LONG}], "documents": DOCS, "max_tokens": 1500}
    with ThreadPoolExecutor(2) as pool:
        pending = [
            pool.submit(httpx.post, f"{server.url}/v1/chat/completions", json=body, timeout=120) for _ in range(2)
        ]
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/health").json()["requests_in_flight"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.stop() == 0
        answers = [p.result() for p in pending]
    assert all(a.status_code == 200 for a in answers)
    assert all(a.json()["usage"]["completion_tokens"] > 0 and a.json()["choices"][0]["finish_reason"] for a in answers)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=2)
