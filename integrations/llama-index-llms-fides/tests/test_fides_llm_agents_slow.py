"""LlamaIndex's FunctionAgent on the real backbone (smollm2-135m-instruct) with a retriever tool over a real FAISS index
(MiniLM embeddings): the tool's result is the evidence FIDES contrasts on the final turn. The first call is forced
(initial_tool_choice): a 135M model does not choose to call a tool by itself. Plus structured output on the real
tokenizer."""

import asyncio

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import RetrieverTool, ToolMetadata
from llama_index.llms.fides import FidesLLM
from pydantic import BaseModel, Field

from .conftest import CONFLICT_DOCUMENTS

pytestmark = pytest.mark.slow
EIFFEL = CONFLICT_DOCUMENTS[0]


class Query(BaseModel):
    query: str = Field(max_length=24)
    """A short query: the grammar stops a small model from writing a paragraph into it."""


@pytest.fixture(scope="module")
def llm(smollm_decoder):
    return FidesLLM.from_decoder(smollm_decoder, max_new_tokens=40)


@pytest.fixture(scope="module")
def search(faiss_index):
    metadata = ToolMetadata(
        name="search_documents", description="Search the documents for facts about landmarks.", fn_schema=Query
    )
    return RetrieverTool(faiss_index.as_retriever(similarity_top_k=1), metadata)


@pytest.mark.parametrize("streaming", [True, False])
def test_function_agent_runs_fides_on_the_tool_messages(llm, search, streaming):
    agent = FunctionAgent(
        tools=[search],
        llm=llm,
        initial_tool_choice="search_documents",
        streaming=streaming,
        system_prompt="Answer questions about landmarks in one short sentence, from the search results.",
    )
    start = len(llm.history)
    output = asyncio.run(_run(agent, "Where is the Eiffel Tower?"))
    calls = llm.history[start:]
    first, final = calls[0]["info"], calls[-1]["info"]
    print(f"[agent streaming={streaming}] query={output.tool_calls[0].tool_kwargs} answer={output.response.content!r}")
    assert len(calls) == 2 and first["tool_choice"] == "search_documents" and first["method"] == "standard"
    assert output.tool_calls[0].tool_name == "search_documents" and EIFFEL in output.tool_calls[0].tool_output.content
    assert output.raw["documents_source"] == "tool_messages" and output.raw["method"] == "fides"
    assert final["documents_source"] == "tool_messages" and final["method"] == "fides" and final["num_documents"] == 1
    assert final["tool_format"] == "fallback" and final["tool_choice"] == "auto"
    assert f"<tool_response>\n{EIFFEL}" in final["context_prompt"] and EIFFEL not in final["no_context_prompt"]
    assert (
        output.response.role == MessageRole.ASSISTANT and "Rome" in output.response.content
    )  # measured: the tool's evidence


@pytest.fixture(scope="module")
def docs_search(minilm_path):
    """The search tool of docs/llamaindex.md's agent: an index over the quick start's two texts."""
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    texts = [
        "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.",
        "Mount Everest is located in the Alps in Switzerland.",
    ]
    index = VectorStoreIndex.from_documents(
        [Document(text=t) for t in texts], embed_model=HuggingFaceEmbedding(model_name=minilm_path, device="cpu")
    )
    metadata = ToolMetadata(
        name="search_documents", description="Search the documents for facts about landmarks.", fn_schema=Query
    )
    return RetrieverTool(index.as_retriever(similarity_top_k=1), metadata)


@pytest.mark.parametrize("question", ["Who wrote Hamlet?", "Where is Mount Everest?"])
def test_the_docs_agent_never_answers_nothing_silently(llm, docs_search, question):
    """Measured before the answer rules: "Where is Mount Everest?" began its answering turn with <tool_response>
    (where the answer stops) and the agent answered '' with finish_reason "stop"."""
    agent = FunctionAgent(
        tools=[docs_search],
        llm=llm,
        initial_tool_choice="search_documents",
        system_prompt="Answer questions about landmarks in one short sentence, from the search results.",
    )
    try:
        output = asyncio.run(_run(agent, question))
    except Exception as err:  # UnansweredError, as the workflow reports it: the cause is named
        assert "the model answered nothing: " in str(err)
        return
    print(f"[docs agent] {question!r} -> {output.response.content!r} notes={llm.history[-1]['info']['notes']}")
    assert output.response.content.strip()


async def _run(agent: FunctionAgent, question: str):
    return await agent.run(user_msg=question, max_iterations=4)


class Place(BaseModel):
    """Where a landmark is."""

    city: str
    country: str


def test_structured_output_on_the_real_tokenizer(llm):
    prompt = PromptTemplate("Context: {context_str}\nWhere is the Eiffel Tower? Give the city and the country.")
    place = llm.structured_predict(Place, prompt, context_str=EIFFEL)
    info = llm.history[-1]["info"]
    print(f"[structured] {place!r} method={info['method']}")
    assert isinstance(place, Place) and info["method"] == "fides" and EIFFEL not in info["no_context_prompt"]
    reply = llm.as_structured_llm(Place).chat(
        [ChatMessage(role=MessageRole.USER, content="Where is the Eiffel Tower?")], documents=[EIFFEL]
    )
    print(f"[as_structured_llm] {reply.raw!r}")
    assert isinstance(reply.raw, Place) and llm.history[-1]["info"]["method"] == "fides"


def test_a_function_calling_program_decodes_its_context_str_with_fides(llm):
    from llama_index.core.program import FunctionCallingProgram

    prompt = PromptTemplate("Context: {context_str}\nWhere is the Eiffel Tower? Give the city and the country.")
    place = FunctionCallingProgram.from_defaults(output_cls=Place, prompt=prompt, llm=llm)(context_str=EIFFEL)
    info = llm.history[-1]["info"]
    print(f"[FunctionCallingProgram] {place!r} method={info['method']}")
    assert isinstance(place, Place) and info["method"] == "fides" and info["documents_source"] == "context"
    assert EIFFEL in info["context_prompt"] and EIFFEL not in info["no_context_prompt"]
