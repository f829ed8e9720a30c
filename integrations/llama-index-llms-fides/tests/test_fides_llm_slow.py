"""Real backbone (smollm2-135m-instruct) + real FaissVectorStore with MiniLM embeddings.

The index holds invented documents that contradict common knowledge. Measured with LlamaIndex's own
QA prompts (not fides-rag's 2-shot template): `standard` answers "Paris" and `cad` answers "Rome";
`fides` (default constants) stays with "Paris" on smollm2 under these prompts; its per-token alphas
stay small (~0.2-0.45). The tests assert exactly that, plus that the retrieved nodes reached the
context path (and not the no-context path) in every response mode, streaming, aquery and both chat
modes. With the chat engines' context system messages even `cad` keeps "Paris" (or has not named
the city within 8 tokens), so those tests assert only the plumbing. Run with `-s` to see the alphas.
"""

from __future__ import annotations

import asyncio

import pytest
from llama_index.llms.fides import FidesLLM

from .conftest import CONFLICT_DOCUMENTS, QUESTION

pytestmark = pytest.mark.slow
EIFFEL = CONFLICT_DOCUMENTS[0]


@pytest.fixture(scope="module")
def llms(smollm_decoder):
    return {m: FidesLLM.from_decoder(smollm_decoder, method=m, max_new_tokens=8) for m in ("standard", "fides", "cad")}


def show(label, llm):
    result = llm.last_result
    print(f"\n[{label}] method={result.method} answer={result.text!r}")
    for step in result.steps:
        alpha = "-" if step.alpha is None else f"{step.alpha:.3f}"
        print(f"    {step.token!r:>14} alpha={alpha}")


def assert_node_in_context_path(llm):
    info = llm.history[-1]["info"]
    assert EIFFEL in info["context_prompt"], info["context_prompt"]
    if info["prompt_type"] != "refine":
        assert EIFFEL not in info["no_context_prompt"]
    assert QUESTION in info["no_context_prompt"]
    return info


def test_compact_standard_vs_fides_vs_cad(faiss_index, llms):
    answers = {}
    for method, llm in llms.items():
        answers[method] = str(faiss_index.as_query_engine(llm=llm, similarity_top_k=1).query(QUESTION))
        show(f"compact/{method}", llm)
        info = assert_node_in_context_path(llm) if method != "standard" else llm.history[-1]["info"]
        assert info["method"] == method
    print("\nanswers:", answers)
    assert "Paris" in answers["standard"]  # the model's memory
    assert "Rome" in answers["cad"]  # the contrast reaches the decoder through the query engine
    alphas = llms["fides"].last_result.alphas
    assert all(a is not None and a >= 0.1 for a in alphas)  # FIDES ran, with alpha_min=0.1 as floor
    assert "Paris" in answers["fides"] or "Rome" in answers["fides"]


@pytest.mark.parametrize("mode", ["refine", "simple_summarize", "tree_summarize"])
def test_other_response_modes(faiss_index, llms, mode):
    llm = llms["fides"]
    start = len(llm.history)
    answer = str(
        faiss_index.as_query_engine(llm=llm, response_mode=mode, similarity_top_k=2 if mode == "refine" else 1).query(
            QUESTION
        )
    )
    show(mode, llm)
    calls = llm.history[start:]
    assert calls and all(c["info"]["method"] == "fides" for c in calls)
    assert any(EIFFEL in c["info"]["context_prompt"] for c in calls)
    assert all(c["info"]["context_prompt"] != c["info"]["no_context_prompt"] for c in calls)
    if mode == "refine" and len(calls) > 1:  # the first answer is kept in both paths of the refine stage
        refine = calls[-1]["info"]
        assert refine["prompt_type"] == "refine"
        first = calls[0]["result"].text
        assert first in refine["context_prompt"] and first in refine["no_context_prompt"]
    assert answer.strip()


def test_streaming_and_aquery(faiss_index, llms):
    llm = llms["cad"]
    streamed = "".join(
        faiss_index.as_query_engine(llm=llm, similarity_top_k=1, streaming=True).query(QUESTION).response_gen
    )
    show("streaming/cad", llm)
    assert streamed.strip() == llm.last_result.text and "Rome" in streamed
    assert_node_in_context_path(llm)
    answer = asyncio.run(faiss_index.as_query_engine(llm=llm, similarity_top_k=1).aquery(QUESTION))
    show("aquery/cad", llm)
    assert "Rome" in str(answer)


@pytest.mark.parametrize("chat_mode", ["context", "condense_plus_context"])
def test_chat_engines(faiss_index, llms, chat_mode):
    llm = llms["cad"]
    engine = faiss_index.as_chat_engine(chat_mode=chat_mode, llm=llm, similarity_top_k=1)
    reply = engine.chat(QUESTION)
    show(f"chat/{chat_mode}", llm)
    info = assert_node_in_context_path(llm)
    assert info["context_variables"] == ["context_str"]
    assert info["method"] == "cad" and str(reply).strip() == llm.last_result.text
    # Measured: with the chat engines' system-message prompts even cad keeps "Paris" (or stops before the
    # city) on smollm2 with 8 tokens; the prompts, not the plumbing, decide that, so no answer is asserted.
