"""documents= and fides_rag_qa_template() use fides-rag's template; strict mode; fallbacks say why (tiny models)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from llama_index.core import Document, MockEmbedding, VectorStoreIndex
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.core.prompts.default_prompt_selectors import DEFAULT_TEXT_QA_PROMPT_SEL
from llama_index.llms.fides import FidesFallbackError, FidesLLM, fides_rag_qa_template

DOC = "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."
QUERY = "In which city is the Eiffel Tower located?"


@pytest.fixture()
def llm(chat_decoder):
    return FidesLLM.from_decoder(chat_decoder, max_new_tokens=4)


@pytest.fixture(scope="module")
def one_doc_index():
    return VectorStoreIndex.from_documents([Document(text=DOC)], embed_model=MockEmbedding(embed_dim=8))


def template_prompts(decoder, question, documents):
    """The two prompts fides-rag's own template builds (what langchain-fides' documents= decodes)."""
    result = decoder.generate(question, documents, method="cad", max_new_tokens=1)
    return result.context_prompt, result.no_context_prompt


# -- 3. documents= means fides-rag's template, as in langchain-fides; the text_qa_template equivalent --------


def test_documents_kwarg_uses_fides_rags_template(llm, chat_decoder):
    ctx, no_ctx = template_prompts(chat_decoder, QUERY, [DOC])
    for response in (
        llm.complete(QUERY, documents=[DOC]),
        llm.chat([ChatMessage(role="user", content=QUERY)], documents=[DOC]),
    ):
        info = response.additional_kwargs
        assert info["prompt_type"] == "fides_rag" and info["method"] == "fides"
        assert info["context_prompt"] == ctx and info["no_context_prompt"] == no_ctx
        assert "Using only the references listed above" in ctx and f"Document [1]: {DOC}" in ctx
    streamed = list(llm.stream_complete(QUERY, documents=[DOC]))
    assert streamed[-1].text.strip() == llm.last_result.text == llm.complete(QUERY, documents=[DOC]).text


def test_fides_rag_qa_template_in_a_query_engine(llm, chat_decoder, one_doc_index):
    template = fides_rag_qa_template()
    assert set(template.template_vars) == {"context_str", "query_str"}
    engine = one_doc_index.as_query_engine(llm=llm, text_qa_template=template, similarity_top_k=1)
    answer = engine.query(QUERY)
    info = llm.history[-1]["info"]
    assert info["prompt_type"] == "fides_rag" and info["method"] == "fides"
    assert (info["context_prompt"], info["no_context_prompt"]) == template_prompts(chat_decoder, QUERY, [DOC])
    assert str(answer) == llm.last_result.text
    streamed = "".join(
        one_doc_index.as_query_engine(llm=llm, text_qa_template=template, streaming=True).query(QUERY).response_gen
    )
    assert streamed.strip() == llm.last_result.text and llm.history[-1]["info"]["prompt_type"] == "fides_rag"
    asyncio.run(one_doc_index.as_query_engine(llm=llm, text_qa_template=template).aquery(QUERY))
    assert llm.history[-1]["info"]["context_prompt"] == info["context_prompt"]
    # any other LLM sees the context branch of fides-rag's template as an ordinary prompt
    text = template.format(context_str=DOC, query_str=QUERY)
    assert (
        text.startswith("Document [1]: Mount Kilimanjaro") and f"Document [1]: {DOC}\nUsing only the references" in text
    )
    assert text.endswith(f"Question: {QUERY}\nAnswer:")


# -- 2. strict mode and what a fallback says --------------------------------------------------------------------


def test_fallbacks_warn_with_the_cause(llm, caplog):
    with caplog.at_level(logging.WARNING, logger="llama_index.llms.fides"):
        r1 = llm.complete(QUERY)
        r2 = llm.complete(QUERY, documents=[])
        llm.predict(DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUERY), context_str="")
        r4 = llm.chat([ChatMessage(role="user", content=QUERY)])
    assert r1.additional_kwargs["notes"][0] == "no documents= were given: decoded with 'standard'"
    assert r2.additional_kwargs["notes"][0] == "the documents given were empty: decoded with 'standard'"
    assert (
        llm.history[-2]["info"]["notes"][0]
        == "the context variable (context_str, context_msg) was empty: decoded with 'standard'"
    )
    assert (
        r4.additional_kwargs["notes"][0]
        == "no documents= and no context system message in the chat: decoded with 'standard'"
    )
    assert all(h["info"]["method"] == "standard" and h["info"]["requested_method"] == "fides" for h in llm.history[-4:])
    messages = [r.message for r in caplog.records]
    for response in (r1, r2, r4):
        assert response.additional_kwargs["notes"][0] in messages


def test_strict_raises_instead_of_falling_back(llm, chat_decoder, one_doc_index):
    strict = FidesLLM.from_decoder(chat_decoder, max_new_tokens=4, strict=True)
    with pytest.raises(
        FidesFallbackError, match="strict=True: no documents= were given, so method 'fides' has nothing to contrast"
    ):
        strict.complete(QUERY)
    with pytest.raises(FidesFallbackError, match="the documents given were empty"):
        strict.complete(QUERY, documents=[])
    with pytest.raises(FidesFallbackError, match="no context system message"):
        strict.chat([ChatMessage(role="user", content=QUERY)])
    with pytest.raises(FidesFallbackError, match="context variable .* is not in the prompt"):
        strict.predict(PromptTemplate("Tell me about {topic}."), topic="towers")
    with pytest.raises(FidesFallbackError, match="was empty"):
        list(strict.stream(DEFAULT_TEXT_QA_PROMPT_SEL.partial_format(query_str=QUERY), context_str=""))
    with pytest.raises(FidesFallbackError, match="no documents= were given"):
        llm.complete(QUERY, strict=True)  # per call
    with pytest.raises(FidesFallbackError, match="is not in the prompt"):
        llm.predict(PromptTemplate("Tell me about {topic}."), topic="towers", strict=True)

    async def astrict():
        await strict.acomplete(QUERY)

    with pytest.raises(FidesFallbackError):
        asyncio.run(astrict())
    # with a context, or asking for standard, strict decodes as usual
    assert strict.complete(QUERY, documents=[DOC]).additional_kwargs["method"] == "fides"
    assert strict.complete(QUERY, method="standard").additional_kwargs["method"] == "standard"
    assert str(one_doc_index.as_query_engine(llm=strict, similarity_top_k=1).query(QUERY)) == strict.last_result.text
    assert strict.history[-1]["info"]["method"] == "fides"
    with pytest.raises(TypeError, match="strict must be True or False"):
        llm.complete(QUERY, documents=[DOC], strict="yes")
