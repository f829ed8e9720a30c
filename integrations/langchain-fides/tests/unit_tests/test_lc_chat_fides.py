"""ChatFides logic on a tiny random-weight model, plus LangChain's standard chat-model unit suite."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_fides import ChatFides, fides_rag_prompt

from ..conftest import Capture, tiny_decoder

DOC = "Lyon is the capital of France."


class OneDoc(BaseRetriever):
    def _get_relevant_documents(self, query: str, *, run_manager: Any = None) -> list[Document]:
        return [Document(page_content=DOC)]


@pytest.fixture()
def chat(decoder):
    return ChatFides(decoder=decoder, max_new_tokens=6)


def test_system_message_is_the_context(chat):
    msg = chat.invoke([SystemMessage(f"Use this context: {DOC}"), HumanMessage("What is the capital of France?")])
    meta = msg.response_metadata
    assert meta["documents_source"] == "system_message" and meta["method"] == "fides"
    assert DOC in meta["context_prompt"] and DOC not in meta["no_context_prompt"]
    assert "What is the capital of France?" in meta["no_context_prompt"]
    assert len(meta["alphas"]) == meta["completion_tokens"] == msg.usage_metadata["output_tokens"]


def test_documents_attached_to_message_kwarg_and_prompt_value(chat):
    attached = HumanMessage("What is the capital of France?", additional_kwargs={"documents": [DOC]})
    m1 = chat.invoke([attached])
    assert m1.response_metadata["documents_source"] == "message"
    m2 = chat.invoke("What is the capital of France?", documents=[Document(page_content=DOC)])
    assert m2.response_metadata["documents_source"] == "documents"
    assert m1.response_metadata["context_prompt"] == m2.response_metadata["context_prompt"]  # fides-rag's template
    history = [HumanMessage("hi"), AIMessage("hello"), HumanMessage("What is the capital of France?")]
    m3 = chat.bind(documents=[DOC]).invoke(history)
    assert DOC in m3.response_metadata["context_prompt"] and DOC not in m3.response_metadata["no_context_prompt"]
    assert "hello" in m3.response_metadata["no_context_prompt"]
    chain = {"context": OneDoc(), "question": RunnablePassthrough()} | fides_rag_prompt() | chat
    m4 = chain.invoke("What is the capital of France?")
    assert m4.response_metadata["documents_source"] == "prompt_value"
    assert m4.response_metadata["context_prompt"] == m1.response_metadata["context_prompt"]


def test_retrieved_documents_found_in_chat_chain(chat):
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are terse."), ("human", "Context: {context}\n\nQuestion: {question}")]
    )
    chain = (
        {"context": OneDoc() | (lambda docs: docs[0].page_content), "question": RunnablePassthrough()} | prompt | chat
    )
    meta = chain.invoke("capital of France?").response_metadata
    assert meta["documents_source"] == "retriever"
    assert (
        DOC in meta["context_prompt"]
        and DOC not in meta["no_context_prompt"]
        and "You are terse." in meta["no_context_prompt"]
    )
    last = list(chain.stream("capital of France?"))[-1].response_metadata  # BaseChatModel.stream passes no run manager

    async def alast() -> dict[str, Any]:
        return [c async for c in chain.astream("capital of France?")][-1].response_metadata

    for m in (last, asyncio.run(alast())):
        assert m["documents_source"] == "retriever" and DOC not in m["no_context_prompt"]


def test_errors(chat):
    with pytest.raises(ValueError, match="needs a human message"):
        chat.invoke([SystemMessage("context only"), AIMessage("hm")])
    with pytest.raises(TypeError, match="unsupported document type dict"):
        chat.invoke("Q?", documents=[{"x": 1}])
    meta = chat.invoke("Hello").response_metadata
    assert meta["method"] == "standard" and meta["notes"]


def test_stream_callbacks_stop_and_async(chat):
    cap = Capture()
    chunks = list(chat.stream("Q?", documents=[DOC], config={"callbacks": [cap]}))
    text = "".join(c.text for c in chunks)
    assert text == chat.invoke("Q?", documents=[DOC]).text
    assert [t for t in cap.tokens if t] == [c.text for c in chunks if c.text]
    assert chunks[-1].chunk_position == "last" and chunks[-1].response_metadata["alphas"]
    if len(text) > 3:
        stop = text[1:3]
        assert chat.invoke("Q?", documents=[DOC], stop=[stop]).text == text[: text.find(stop)].strip()

    async def run() -> None:
        parts = [c.text async for c in chat.astream("Q?", documents=[DOC])]
        assert "".join(parts) == text
        assert (await chat.ainvoke("Q?", documents=[DOC])).text == text
        outs = await chat.abatch(["Q?", "R?"], documents=[DOC])
        assert len(outs) == 2

    asyncio.run(run())


class TestChatFidesStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatFides]:
        return ChatFides

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"decoder": tiny_decoder(), "model_id": "tiny-llama"}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return {**super().standard_chat_model_params, "max_tokens": 4}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def structured_output_kwargs(self) -> dict[str, Any]:
        return {"method": "json_schema"}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_image_inputs(self) -> bool:
        return False


def test_no_context_path_question_is_the_last_human_message_alone(decoder):
    from fides_rag.prompts.raw import question_only_text, render_chat

    chat = ChatFides(decoder=decoder, max_new_tokens=3, no_context_path="question")
    question = "What is the capital of France?"
    expected = render_chat(decoder.tokenizer, [{"role": "user", "content": question_only_text(question)}])
    for call in (
        lambda: chat.invoke([SystemMessage(f"Use this context: {DOC}"), HumanMessage(question)]),
        lambda: chat.invoke([SystemMessage("You are helpful."), HumanMessage(question)], documents=[DOC]),
    ):
        meta = call().response_metadata
        assert DOC in meta["context_prompt"] and meta["no_context_prompt"] == expected
