"""FidesLLM logic on a tiny random-weight model: where documents come from, options, stop, streaming, async."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough

from langchain_fides import FidesLLM, FidesPromptValue, fides_rag_prompt

from ..conftest import Capture

DOCS = {
    "france": "Lyon is the capital of France.",
    "australia": "The capital of Australia is Melbourne.",
    "empty": None,
}


class DictRetriever(BaseRetriever):
    """Returns one document chosen by a keyword of the query (none for 'empty')."""

    def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        text = DOCS[query.split()[-1].lower().strip("?")]
        return [] if text is None else [Document(page_content=text)]


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


PROMPT = PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}\nAnswer:")


@pytest.fixture()
def llm(decoder):
    return FidesLLM(decoder=decoder, max_new_tokens=6)


@pytest.fixture()
def chain(llm):
    return (
        {"context": DictRetriever() | format_docs, "question": RunnablePassthrough()} | PROMPT | llm | StrOutputParser()
    )


def check_item(info: dict[str, Any], key: str, question_marker: str = "Question:") -> None:
    doc = DOCS[key]
    assert info["documents_source"] == "retriever"
    assert info["method"] == "fides"
    assert doc in info["context_prompt"]
    assert doc not in info["no_context_prompt"]
    assert question_marker in info["no_context_prompt"]
    assert len(info["alphas"]) == info["completion_tokens"] and all(a is not None for a in info["alphas"])


def test_invoke_with_documents_kwarg_and_bind(llm):
    cap = Capture()
    text = llm.invoke(
        "What is the capital of France?", documents=[Document(page_content=DOCS["france"])], config={"callbacks": [cap]}
    )
    assert isinstance(text, str)
    info = cap.infos[0]
    assert info["documents_source"] == "documents" and info["num_documents"] == 1
    assert DOCS["france"] in info["context_prompt"] and DOCS["france"] not in info["no_context_prompt"]
    bound = llm.bind(documents=[DOCS["france"]])
    assert (
        bound.invoke("What is the capital of France?", config={"callbacks": [cap]}) == text
    )  # strings and Documents alike
    assert cap.infos[1]["context_prompt"] == info["context_prompt"]


def test_documents_kwarg_already_in_prompt_uses_prompt(llm):
    cap = Capture()
    prompt = f"Read: {DOCS['france']}\nQ: capital of France?\nA:"
    llm.invoke(prompt, documents=[DOCS["france"]], config={"callbacks": [cap]})
    info = cap.infos[0]
    assert info["documents_source"] == "documents"
    assert "Read: \nQ: capital of France?" in info["no_context_prompt"]


def test_chain_invoke_stream_batch_find_each_items_documents(chain):
    cap = Capture()
    chain.invoke("france", config={"callbacks": [cap]})
    check_item(cap.infos[-1], "france")
    streamed = list(chain.stream("australia", config={"callbacks": [cap]}))
    check_item(cap.infos[-1], "australia")
    assert "".join(streamed) == chain.invoke("australia")
    cap = Capture()
    chain.batch(["france", "australia"], config={"callbacks": [cap]})
    by_doc = {k: [i for i in cap.infos if DOCS[k] in i["context_prompt"]] for k in ("france", "australia")}
    check_item(by_doc["france"][0], "france")
    check_item(by_doc["australia"][0], "australia")
    assert DOCS["australia"] not in by_doc["france"][0]["context_prompt"]


def test_chain_async_forms(chain):
    async def run() -> Capture:
        cap = Capture()
        await chain.ainvoke("france", config={"callbacks": [cap]})
        check_item(cap.infos[-1], "france")
        parts = [p async for p in chain.astream("australia", config={"callbacks": [cap]})]
        check_item(cap.infos[-1], "australia")
        assert parts
        cap2 = Capture()
        await chain.abatch(["australia", "france"], config={"callbacks": [cap2]})
        assert sorted(i["context_prompt"].count("Lyon") for i in cap2.infos) == [0, 1]
        for info in cap2.infos:
            check_item(info, "france" if "Lyon" in info["context_prompt"] else "australia")
        return cap

    asyncio.run(run())


def test_astream_events_reports_the_models_run_with_its_documents(chain, caplog):
    """langchain-core's async on_llm_start skips every other handler when one is inline (this package's retrieval
    recorder is): the events stream must still see the model's start, its tokens and its end, with no callback
    error, for this LLM and for any other LLM in the same process."""
    from langchain_core.language_models import FakeStreamingListLLM

    async def events(runnable: Any, value: Any) -> list[dict[str, Any]]:
        return [event async for event in runnable.astream_events(value, version="v2")]

    with caplog.at_level(logging.WARNING):
        ours = asyncio.run(events(chain, "france"))
        other = asyncio.run(
            events(PROMPT | FakeStreamingListLLM(responses=["Lyon"]), {"context": "c", "question": "q"})
        )
    kinds = [e["event"] for e in ours]
    assert "on_llm_start" in kinds and "on_llm_stream" in kinds and kinds.count("on_llm_end") == 1
    end = next(e for e in ours if e["event"] == "on_llm_end")
    check_item(end["data"]["output"]["generations"][0][0]["generation_info"], "france")
    assert [e["event"] for e in other if e["event"].startswith("on_llm")][:1] == ["on_llm_start"]
    assert not [r for r in caplog.records if "callback" in r.getMessage()], [r.getMessage() for r in caplog.records]


def test_empty_retrieval_falls_back_to_standard_with_warning(chain, caplog):
    cap = Capture()
    with caplog.at_level(logging.WARNING, logger="langchain_fides"):
        chain.invoke("empty", config={"callbacks": [cap]})
    info = cap.infos[0]
    assert info["method"] == "standard" and info["requested_method"] == "fides"
    assert info["documents_source"] == "none" and info["notes"]
    assert any("no documents" in r.message for r in caplog.records)


def test_fides_prompt_value_batch_keeps_documents_per_item(llm):
    chain = {"context": DictRetriever(), "question": RunnablePassthrough()} | fides_rag_prompt() | llm
    cap = Capture()
    chain.batch(["france", "australia"], config={"callbacks": [cap]})
    assert {i["documents_source"] for i in cap.infos} == {"documents"}
    ctx = sorted(i["context_prompt"] for i in cap.infos)
    assert sum(DOCS["france"] in c for c in ctx) == 1 and sum(DOCS["australia"] in c for c in ctx) == 1
    value = FidesPromptValue(question="Q?", documents=[Document(page_content="D.")])
    assert "D." in value.to_string() and value.to_messages()[0].additional_kwargs["documents"] == ["D."]


def test_stock_chains(llm):
    from langchain_classic.chains import create_retrieval_chain
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain
    from langchain_core.prompts import ChatPromptTemplate

    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from this context:\n{context}"), ("human", "{input}")]
    )
    rag = create_retrieval_chain(DictRetriever(), create_stuff_documents_chain(llm, prompt))
    cap = Capture()
    out = rag.invoke({"input": "capital of france"}, config={"callbacks": [cap]})
    assert isinstance(out["answer"], str) and out["context"][0].page_content == DOCS["france"]
    check_item(cap.infos[0], "france", question_marker="capital of france")


def test_streaming_callbacks_and_stop_across_tokens(llm, decoder):
    full = llm.invoke("What is the capital of France?", documents=[DOCS["france"]], max_new_tokens=8, method="standard")
    cap = Capture()
    chunks = list(
        llm.stream(
            "What is the capital of France?",
            documents=[DOCS["france"]],
            max_new_tokens=8,
            method="standard",
            config={"callbacks": [cap]},
        )
    )
    assert "".join(chunks) == full
    assert cap.tokens == [c for c in chunks if c]
    # a stop string made of several tokens, straddling token boundaries
    ids = decoder.tokenizer(full, add_special_tokens=False)["input_ids"]
    assert len(ids) >= 4, full
    stop = full[len(full) // 3 : len(full) // 3 + 3]
    cut = full[: full.find(stop)].strip()
    assert (
        llm.invoke(
            "What is the capital of France?",
            documents=[DOCS["france"]],
            max_new_tokens=8,
            method="standard",
            stop=[stop],
        )
        == cut
    )
    assert (
        "".join(
            llm.stream(
                "What is the capital of France?",
                documents=[DOCS["france"]],
                max_new_tokens=8,
                method="standard",
                stop=[stop],
            )
        )
        == cut
    )
    cap = Capture()
    FidesLLM(decoder=decoder, stop=[stop], max_new_tokens=8, method="standard").invoke(
        "What is the capital of France?", documents=[DOCS["france"]], config={"callbacks": [cap]}
    )
    assert cap.infos[0]["finish_reason"] == "stop"


def test_per_call_options_and_shared_decoder(decoder):
    a = FidesLLM(decoder=decoder, method="cad", max_new_tokens=3)
    b = FidesLLM(decoder=decoder, method="fides", max_new_tokens=5)
    assert a.decoder is b.decoder
    cap = Capture()
    a.invoke("Q?", documents=["D."], config={"callbacks": [cap]})
    b.invoke("Q?", documents=["D."], config={"callbacks": [cap]})
    b.invoke("Q?", documents=["D."], method="standard", max_new_tokens=2, config={"callbacks": [cap]})
    assert [i["method"] for i in cap.infos] == ["cad", "fides", "standard"]
    assert [i["completion_tokens"] <= n for i, n in zip(cap.infos, (3, 5, 2))] == [True] * 3
    with pytest.raises(TypeError, match="unsupported call options"):
        a.invoke("Q?", documents=["D."], bogus=1)
    with pytest.raises(ValueError, match="unknown method"):
        FidesLLM(decoder=decoder, method="nope")


def test_bad_document_type_names_it(llm):
    with pytest.raises(TypeError, match="unsupported document type int"):
        llm.invoke("Q?", documents=[42])


def test_too_long_documents_are_trimmed(llm, decoder):
    long_doc = "The quick brown fox jumps over the lazy dog. " * 400
    cap = Capture()
    llm.invoke("Q?", documents=[long_doc], config={"callbacks": [cap]})  # fides-rag template path: the core trims
    assert cap.infos[0]["documents_trimmed"] and cap.infos[0]["notes"]
    prompt = f"Context: {long_doc}\nQuestion: what jumps?\nAnswer:"
    llm.invoke(prompt, documents=[long_doc], config={"callbacks": [cap]})  # raw-prompt path: trimmed here
    info = cap.infos[1]
    assert info["documents_trimmed"] and info["document_tokens"][1] < info["document_tokens"][0]
    assert info["prompt_tokens"] + 6 <= decoder.limits.context_window


def test_async_does_not_block_event_loop(llm):
    async def run() -> tuple[int, list[str]]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        start = time.perf_counter()
        parts = [p async for p in llm.astream("Q?", documents=["D."], max_new_tokens=8)]
        await llm.ainvoke("Q?", documents=["D."], max_new_tokens=8)
        assert time.perf_counter() - start > 0
        done.set()
        await task
        return ticks, parts

    ticks, parts = asyncio.run(run())
    assert ticks > 3 and parts


def _question_only(decoder, question: str) -> str:
    from fides_rag.prompts.raw import question_only_text, render_chat

    return render_chat(decoder.tokenizer, [{"role": "user", "content": question_only_text(question)}])


def test_no_context_path_question_takes_the_retrievers_query_or_the_chain_input(decoder):
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain

    llm = FidesLLM(decoder=decoder, max_new_tokens=4, no_context_path="question")
    cap = Capture()
    chain = {"context": DictRetriever() | format_docs, "question": RunnablePassthrough()} | PROMPT | llm
    chain.invoke("What is the capital of france?", config={"callbacks": [cap]})
    info = cap.infos[-1]
    assert DOCS["france"] in info["context_prompt"]
    assert info["no_context_prompt"] == _question_only(
        decoder, "What is the capital of france?"
    )  # the retriever's query
    stuff = create_stuff_documents_chain(llm, PROMPT)
    stuff.invoke(
        {"context": [Document(page_content=DOCS["australia"])], "question": "Capital of Australia?"},
        config={"callbacks": [cap]},
    )
    assert cap.infos[-1]["no_context_prompt"] == _question_only(decoder, "Capital of Australia?")  # the chain input


def test_no_context_path_question_without_a_question_keeps_the_emptied_prompt_with_a_note(decoder, caplog):
    llm = FidesLLM(decoder=decoder, max_new_tokens=3, no_context_path="question")
    cap = Capture()
    prompt = f"Read: {DOCS['france']}\nQ: capital of France?\nA:"
    with caplog.at_level(logging.WARNING, logger="langchain_fides"):
        llm.invoke(prompt, documents=[DOCS["france"]], config={"callbacks": [cap]})
    info = cap.infos[-1]
    assert "Read: \nQ: capital of France?" in info["no_context_prompt"]
    assert any("no_context_path='question' but no question was found" in n for n in info["notes"])
    with pytest.raises(ValueError, match="no_context_path must be one of 'emptied', 'question'"):
        FidesLLM(decoder=decoder, no_context_path="neutral")
