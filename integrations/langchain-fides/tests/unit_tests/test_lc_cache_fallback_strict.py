"""On a tiny random-weight model: the LLM cache key, honest fallbacks, strict mode, last_result and a shared
decoder's token budget."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.documents import Document
from langchain_core.globals import set_llm_cache
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough

from fides_rag import FidesConfig, FidesDecoder
from fides_rag.testing import build_tiny_model, build_tokenizer
from langchain_fides import ChatFides, FidesFallbackError, FidesLLM

from ..conftest import Capture

FRANCE = "Lyon is the capital of France."
AUSTRALIA = "The capital of Australia is Melbourne."
QUESTION = "What is the capital of France?"


class ListRetriever(BaseRetriever):
    """Returns the documents it was built with, whatever the query."""

    texts: list[str]

    def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        return [Document(page_content=t) for t in self.texts]


def rewrite(docs: list[Document]) -> str:
    """A formatter that numbers and cleans the texts, so none occurs verbatim in the prompt."""
    return "\n".join(f"[{i}] {d.page_content.lower().rstrip('.')}" for i, d in enumerate(docs, 1))


def verbatim(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


PROMPT = PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}\nAnswer:")
CHAT_PROMPT = ChatPromptTemplate.from_messages(
    [("system", "Answer from this context:\n{context}"), ("human", "{question}")]
)


@pytest.fixture()
def llm_cache():
    cache = InMemoryCache()
    set_llm_cache(cache)
    yield cache
    set_llm_cache(None)


# -- 1. the LLM cache key -------------------------------------------------------------------------------


def test_llm_cache_keys_on_method_and_every_option(decoder, llm_cache):
    llm = FidesLLM(decoder=decoder, max_new_tokens=4)
    cap = Capture()
    llm.bind(method="standard").invoke(QUESTION, documents=[FRANCE], config={"callbacks": [cap]})
    standard = llm.last_result
    assert standard is not None and standard.method == "standard"
    llm.bind(method="cad").invoke(QUESTION, documents=[FRANCE], config={"callbacks": [cap]})
    assert llm.last_result is not standard and llm.last_result.method == "cad"  # decoded, not the cached standard text
    assert cap.infos[-1]["method"] == "cad"
    cad = llm.last_result
    llm.bind(method="cad").invoke(QUESTION, documents=[FRANCE], config={"callbacks": [cap]})
    assert llm.last_result is cad and cap.infos[-1]["method"] == "cad"  # the same call is a cache hit
    # every decoding option, per call and per object, is its own key
    for options in (
        {"max_new_tokens": 2},
        {"fides_config": FidesConfig(fixed_alpha=0.7)},
        {"do_sample": True, "seed": 1},
        {"do_sample": True, "seed": 2},
        {"strict": True},
        {"documents": [AUSTRALIA]},
    ):
        before = llm.last_result
        llm.invoke(QUESTION, **{"documents": [FRANCE], **options})
        assert llm.last_result is not before, options
    for other in (
        FidesLLM(decoder=decoder, max_new_tokens=3),
        FidesLLM(decoder=decoder, max_new_tokens=4, top_k=5, do_sample=True),
    ):
        other.invoke(QUESTION, documents=[FRANCE])
        assert other.last_result is not None, other
    tok = build_tokenizer(chat=True)
    other_model = FidesLLM(
        decoder=FidesDecoder(build_tiny_model("llama", len(tok), seed=1), tok, max_new_tokens=8), max_new_tokens=4
    )
    other_model.invoke(QUESTION, documents=[FRANCE], method="cad")
    assert other_model.last_result is not None  # another (unnamed) model never reads this model's entries


def test_chat_cache_keys_on_method_and_options(decoder, llm_cache):
    chat = ChatFides(decoder=decoder, max_new_tokens=4)
    first = chat.bind(method="standard").invoke(QUESTION, documents=[FRANCE])
    assert first.response_metadata["method"] == "standard"
    second = chat.bind(method="cad").invoke(QUESTION, documents=[FRANCE])
    assert second.response_metadata["method"] == "cad" and chat.last_result.method == "cad"
    cad = chat.last_result
    again = chat.bind(method="cad").invoke(QUESTION, documents=[FRANCE])
    assert chat.last_result is cad and again.response_metadata["method"] == "cad"  # a cache hit
    for options in (
        {"max_tokens": 2},
        {"fides_config": FidesConfig(fixed_alpha=0.7)},
        {"strict": True},
        {"documents": [AUSTRALIA]},
    ):
        before = chat.last_result
        chat.invoke(QUESTION, **{"documents": [FRANCE], **options})
        assert chat.last_result is not before, options
    other = ChatFides(decoder=decoder, max_new_tokens=4, documents_instruction="Read these:")
    other.invoke([("human", "hi"), ("ai", "hello"), ("human", QUESTION)], documents=[FRANCE])
    assert other.last_result is not None


# -- 2. honest fallbacks and strict mode -----------------------------------------------------------------


def test_rewritten_documents_are_reported_as_retrieved_but_not_verbatim(decoder, caplog):
    llm = FidesLLM(decoder=decoder, max_new_tokens=4)
    chain = (
        {"context": ListRetriever(texts=[FRANCE]) | rewrite, "question": RunnablePassthrough()}
        | PROMPT
        | llm
        | StrOutputParser()
    )
    cap = Capture()
    with caplog.at_level(logging.WARNING, logger="langchain_fides"):
        chain.invoke(QUESTION, config={"callbacks": [cap]})
    info = cap.infos[0]
    assert info["method"] == "standard" and info["requested_method"] == "fides" and info["documents_source"] == "none"
    expected = "1 document(s) were retrieved in this chain run but none was found verbatim in the prompt"
    assert info["notes"][0].startswith(expected)
    assert any(r.message.startswith(expected) for r in caplog.records)
    assert not any("no documents were given" in r.message for r in caplog.records)
    with pytest.raises(
        FidesFallbackError, match="strict=True: 1 document\\(s\\) were retrieved .* none was found verbatim"
    ):
        (
            {"context": ListRetriever(texts=[FRANCE]) | rewrite, "question": RunnablePassthrough()}
            | PROMPT
            | llm.bind(strict=True)
        ).invoke(QUESTION)
    strict = FidesLLM(decoder=decoder, max_new_tokens=4, strict=True)
    with pytest.raises(FidesFallbackError, match="none was found verbatim in the prompt"):
        (
            {"context": ListRetriever(texts=[FRANCE]) | rewrite, "question": RunnablePassthrough()} | PROMPT | strict
        ).invoke(QUESTION)
    # strict=True with the documents verbatim decodes as usual
    ok = {"context": ListRetriever(texts=[FRANCE]) | verbatim, "question": RunnablePassthrough()} | PROMPT | strict
    ok.invoke(QUESTION, config={"callbacks": [cap]})
    assert cap.infos[-1]["method"] == "fides" and cap.infos[-1]["documents_source"] == "retriever"


def test_partly_rewritten_retrieval_is_noted(decoder, caplog):
    llm = FidesLLM(decoder=decoder, max_new_tokens=4)
    half = lambda docs: docs[0].page_content + "\n" + docs[1].page_content.upper()  # noqa: E731
    chain = (
        {"context": ListRetriever(texts=[FRANCE, AUSTRALIA]) | half, "question": RunnablePassthrough()} | PROMPT | llm
    )
    cap = Capture()
    with caplog.at_level(logging.WARNING, logger="langchain_fides"):
        chain.invoke(QUESTION, config={"callbacks": [cap]})
    info = cap.infos[0]
    assert info["method"] == "fides" and info["documents_source"] == "retriever" and info["num_documents"] == 1
    assert any(
        n.startswith("1 of the 2 documents retrieved in this run were not found verbatim") for n in info["notes"]
    )
    assert any("1 of the 2 documents" in r.message for r in caplog.records)


def test_llm_without_documents_and_empty_documents(decoder, caplog):
    llm = FidesLLM(decoder=decoder, max_new_tokens=4)
    cap = Capture()
    with caplog.at_level(logging.WARNING, logger="langchain_fides"):
        llm.invoke(QUESTION, config={"callbacks": [cap]})
        llm.invoke(QUESTION, documents=[], config={"callbacks": [cap]})
    assert cap.infos[0]["notes"][0].startswith(
        "no documents were given (documents=) and no retriever ran in this chain run"
    )
    assert cap.infos[1]["method"] == "standard" and cap.infos[1]["notes"][0].startswith(
        "the documents given were empty"
    )
    assert sum("the documents given were empty" in r.message for r in caplog.records) >= 1
    with pytest.raises(FidesFallbackError, match="no retriever ran"):
        llm.invoke(QUESTION, strict=True)
    with pytest.raises(FidesFallbackError, match="documents given were empty"):
        llm.invoke(QUESTION, documents=[], strict=True)
    with pytest.raises(FidesFallbackError, match="no retriever ran"):
        list(llm.stream(QUESTION, strict=True))
    assert llm.invoke(QUESTION, strict=True, method="standard") == llm.last_result.text  # nothing to fall back from
    with pytest.raises(TypeError, match="strict must be True or False"):
        llm.invoke(QUESTION, documents=[FRANCE], strict="yes")


def test_chat_empty_retrieval_decodes_standard_and_says_so(decoder, caplog):
    chat = ChatFides(decoder=decoder, max_new_tokens=4)
    chain = {"context": ListRetriever(texts=[]) | verbatim, "question": RunnablePassthrough()} | CHAT_PROMPT | chat
    with caplog.at_level(logging.WARNING, logger="langchain_fides"):
        meta = chain.invoke(QUESTION).response_metadata
    assert meta["method"] == "standard" and meta["requested_method"] == "fides" and meta["documents_source"] == "none"
    assert meta["notes"][0].startswith("the retriever in this chain run returned no documents")
    assert any(r.message.startswith("the retriever in this chain run returned no documents") for r in caplog.records)
    with pytest.raises(FidesFallbackError, match="returned no documents"):
        (
            {"context": ListRetriever(texts=[]) | verbatim, "question": RunnablePassthrough()}
            | CHAT_PROMPT
            | chat.bind(strict=True)
        ).invoke(QUESTION)


def test_chat_rewritten_retrieval_uses_system_message_with_a_warning(decoder, caplog):
    chat = ChatFides(decoder=decoder, max_new_tokens=4)
    chain = {"context": ListRetriever(texts=[FRANCE]) | rewrite, "question": RunnablePassthrough()} | CHAT_PROMPT | chat
    with caplog.at_level(logging.WARNING, logger="langchain_fides"):
        meta = chain.invoke(QUESTION).response_metadata
    assert meta["method"] == "fides" and meta["documents_source"] == "system_message"
    assert "lyon is the capital of france" in meta["context_prompt"] and "lyon" not in meta["no_context_prompt"]
    assert meta["notes"][0].startswith(
        "1 document(s) were retrieved in this chain run but none was found verbatim in the messages"
    )
    assert any("took the whole system message(s) as the context" in r.message for r in caplog.records)
    strict = ChatFides(decoder=decoder, max_new_tokens=4, strict=True)
    with pytest.raises(FidesFallbackError, match="none was found verbatim in the messages"):
        (
            {"context": ListRetriever(texts=[FRANCE]) | rewrite, "question": RunnablePassthrough()}
            | CHAT_PROMPT
            | strict
        ).invoke(QUESTION)
    # no retriever at all: the system message is the context (documented), and the metadata says so
    meta = chat.invoke([("system", f"Context: {FRANCE}"), ("human", QUESTION)]).response_metadata
    assert (
        meta["documents_source"] == "system_message"
        and "system message(s) were taken as the context" in meta["notes"][0]
    )
    with pytest.raises(FidesFallbackError, match="no documents were given"):
        strict.invoke(QUESTION)


# -- 3. last_result, 4. a shared decoder's budget -------------------------------------------------------


def test_last_result_on_the_langchain_llm(decoder):
    llm = FidesLLM(decoder=decoder, max_new_tokens=5)
    assert llm.last_result is None
    text = llm.invoke(QUESTION, documents=[FRANCE])
    result = llm.last_result
    assert result.text == text and result.method == "fides" and len(result.alphas) == len(result.token_ids) > 0
    streamed = "".join(llm.stream(QUESTION, documents=[AUSTRALIA], method="cad"))
    assert llm.last_result is not result and llm.last_result.text == streamed and llm.last_result.method == "cad"


def test_shared_decoder_keeps_its_token_budget():
    tok = build_tokenizer(chat=True)
    dec = FidesDecoder(build_tiny_model("llama", len(tok)), tok, max_new_tokens=32)
    llm = FidesLLM(decoder=dec)
    chat = ChatFides(decoder=llm.decoder)
    assert llm.max_new_tokens == chat.max_new_tokens == 32
    assert ChatFides(decoder=dec, max_new_tokens=3).max_new_tokens == 3  # an explicit value wins
    chat.invoke(QUESTION, documents=[FRANCE])
    assert len(chat.last_result.token_ids) <= 32
