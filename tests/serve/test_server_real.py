"""The server on the bundled SmolLM2 as a real process: the three client quick starts (openai, LangChain's
ChatOpenAI in a RAG chain, LlamaIndex's OpenAILike in a query engine) run as written, and greedy answers through
the server equal the in-process ChatFides answers for the same messages and documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2_server(request):
    start = request.getfixturevalue("start_server_module")
    return start(MODEL, "--max-new-tokens", "16")


def _run_example(name: str, url: str) -> list[str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "FIDES_RAG_URL": url,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-3000:]}"
    return done.stdout.splitlines()


@pytest.mark.parametrize("name", ["serve_openai.py", "serve_langchain.py", "serve_llamaindex.py"])
def test_client_quick_starts_run_and_follow_the_document(smollm2_server, name):
    lines = _run_example(name, f"{smollm2_server.url}/v1")
    assert "rome" in lines[0].lower(), lines
    if name == "serve_openai.py":
        assert lines[1].startswith("fides [")


def test_greedy_answers_equal_in_process_chat_fides(smollm2_server):
    from langchain_fides import ChatFides

    chat = ChatFides.from_model_id(MODEL, method="fides", max_new_tokens=16)
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    documents = [
        "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.",
        "Hamlet was written by Christopher Marlowe.",
    ]
    conversations = [
        [("user", "In which city is the Eiffel Tower located?")],
        [("system", "You answer in one short sentence."), ("user", "Who wrote Hamlet?")],
        [("user", "Hello!"), ("assistant", "Hi! Ask me anything."), ("user", "Who wrote Hamlet?")],
    ]
    for turns in conversations:
        for method in ("fides", "cad"):
            local = chat.invoke(turns, documents=documents, method=method)
            remote = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": r, "content": c} for r, c in turns],
                max_tokens=16,
                extra_body={"documents": documents, "method": method},
            )
            assert remote.choices[0].message.content == local.text, (turns, method)
            record = remote.model_extra["fides"]
            assert record["alphas"] == pytest.approx(local.response_metadata["alphas"], abs=1e-5)
            assert record["documents_source"] == local.response_metadata["documents_source"] == "documents"


def test_agents_over_http_examples_run_and_follow_the_tool_result(smollm2_server):
    url = f"{smollm2_server.url}/v1"
    lines = _run_example("agents_http_openai.py", url)
    assert lines[0] == "tool_calls search_documents" and "Rome" in lines[1], lines
    assert lines[2].startswith("tool_messages ") and lines[3] == "{'city': 'Rome'}", lines
    lines = _run_example("agents_http_langchain.py", url)
    assert "Rome" in lines[0] and lines[1] == "tool_messages fides none" and lines[2] == "Place(city='Rome')", lines
    lines = _run_example("agents_http_llamaindex.py", url)
    assert "Rome" in lines[0] and lines[1] == "search_documents tool_messages", lines


SEARCH = {
    "type": "function",
    "function": {
        "name": "search_documents",
        "description": "Search the documents.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 24}},
            "required": ["query"],
        },
    },
}
EIFFEL = "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."


def _call_turns(call_id: str, arguments: str) -> list[dict]:
    return [
        {"role": "user", "content": "Where is the Eiffel Tower?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "search_documents", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": EIFFEL},
    ]


def test_greedy_tool_turns_over_http_equal_in_process_chat_fides(smollm2_server):
    """A forced call, then the answer on the tool's result: the same call and the same answer as ChatFides."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from langchain_fides import ChatFides

    chat = ChatFides.from_model_id(MODEL, method="fides", max_new_tokens=40)
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    question = "Where is the Eiffel Tower?"
    local = chat.bind_tools([SEARCH], tool_choice="required").invoke([HumanMessage(question)])
    remote = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        tools=[SEARCH],
        tool_choice="required",
        max_tokens=40,
    )
    call = remote.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        local.tool_calls[0]["name"],
        local.tool_calls[0]["args"],
    )
    streamed = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            tools=[SEARCH],
            tool_choice="required",
            max_tokens=40,
            stream=True,
        )
    )
    pieces = [c.choices[0].delta.tool_calls[0] for c in streamed if c.choices and c.choices[0].delta.tool_calls]
    assert (
        pieces[0].function.name == call.function.name
        and "".join(p.function.arguments for p in pieces) == call.function.arguments
    )
    for choice in ("none", "auto"):
        turns = _call_turns(call.id, call.function.arguments)
        local_final = chat.bind_tools([SEARCH], tool_choice=choice).invoke(
            [
                HumanMessage(question),
                AIMessage(
                    "",
                    tool_calls=[
                        {"name": call.function.name, "args": json.loads(call.function.arguments), "id": call.id}
                    ],
                ),
                ToolMessage(EIFFEL, tool_call_id=call.id),
            ]
        )
        remote_final = client.chat.completions.create(
            model=MODEL, messages=turns, tools=[SEARCH], tool_choice=choice, max_tokens=40
        )
        message = remote_final.choices[0].message
        assert (message.content or "") == local_final.content and bool(message.tool_calls) == bool(
            local_final.tool_calls
        ), choice
        record = remote_final.model_extra["fides"]
        assert record["documents_source"] == local_final.response_metadata["documents_source"] == "tool_messages"
        assert record["alphas"] == pytest.approx(local_final.response_metadata["alphas"], abs=1e-5)


def test_openai_client_tools_auto_streamed_equals_unstreamed_and_logprobs(smollm2_server):
    """Unforced (tool_choice auto), a 135M model rarely calls: whatever it answers, streamed equals unstreamed."""
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Search the documents: where is the Eiffel Tower?"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, tools=[SEARCH], max_tokens=30)
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=messages, tools=[SEARCH], max_tokens=30, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    names = [
        d.function.name
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for d in c.choices[0].delta.tool_calls
        if d.function.name
    ]
    assert text == (whole.choices[0].message.content or "")
    assert names == [c.function.name for c in whole.choices[0].message.tool_calls or []]
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    scored = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, logprobs=True, top_logprobs=3, extra_body={"documents": [EIFFEL]}
    )
    content = scored.choices[0].logprobs.content
    ended = (
        scored.choices[0].finish_reason == "stop" and content[-1].token == "<|im_end|>"
    )  # the end token's entry, not text
    assert "".join(e.token for e in content[: -1 if ended else None]).strip() == scored.choices[0].message.content
    assert len(content) == scored.usage.completion_tokens
    assert all(
        e.top_logprobs[0].logprob == pytest.approx(e.logprob) and e.logprob <= 0 for e in content
    )  # greedy: the top token


def test_langchain_chat_openai_bind_tools_and_structured_output(smollm2_server):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    llm = ChatOpenAI(
        base_url=f"{smollm2_server.url}/v1",
        api_key="unused",
        model=MODEL,
        temperature=0,
        max_tokens=40,
        include_response_headers=True,
    )

    class Query(BaseModel):
        """Search the documents."""

        query: str = Field(max_length=24)

    bound = llm.bind_tools([Query], tool_choice="Query")
    message = bound.invoke("Where is the Eiffel Tower?")
    assert message.tool_calls[0]["name"] == "Query" and isinstance(message.tool_calls[0]["args"]["query"], str)
    assert (
        message.response_metadata["finish_reason"] == "tool_calls"
        and message.response_metadata["headers"]["x-fides-method"]
    )
    streamed = None
    for chunk in bound.stream("Where is the Eiffel Tower?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.tool_calls[0]["name"] == "Query" and streamed.tool_calls[0]["args"] == message.tool_calls[0]["args"]

    class Place(BaseModel):
        city: str = Field(max_length=20)

    with_documents = llm.model_copy(update={"extra_body": {"documents": [EIFFEL]}})  # include_raw drops invoke's kwargs
    raw = with_documents.with_structured_output(Place, method="json_schema", include_raw=True).invoke(
        "Where is the Eiffel Tower?"
    )
    assert raw["parsing_error"] is None and raw["parsed"] == Place(city="Rome"), raw
    headers = raw["raw"].response_metadata["headers"]
    assert headers["x-fides-method"] == "fides" and headers["x-fides-documents-source"] == "documents"
    assert headers["x-fides-fallback"] == "none" and 0 <= float(headers["x-fides-mean-alpha"]) <= 1


def test_langchain_completions_class_works_against_the_server(smollm2_server):
    """`langchain_openai.OpenAI` always sends frequency_penalty and presence_penalty 0: accepted as no-ops."""
    from langchain_openai import OpenAI

    llm = OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=12)
    assert llm.invoke(f"Document: {EIFFEL}\nQuestion: Where is the Eiffel Tower?\nAnswer:").strip()
