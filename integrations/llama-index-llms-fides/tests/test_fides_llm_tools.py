"""FidesLLM as a FunctionCallingLLM on a tiny random-weight model: forced calls parse into
additional_kwargs["tool_calls"] and ToolSelections (also streamed and async), tool messages are the evidence,
structured_predict and as_structured_llm are held to the output class's schema."""

import asyncio
import json
from typing import Literal

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.program import FunctionCallingProgram
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.core.types import PydanticProgramMode
from llama_index.llms.fides import FidesLLM
from pydantic import BaseModel

DOC = "The Eiffel Tower is in Rome."
Q = "Where is the Eiffel Tower?"


def search(query: Literal["eiffel tower", "rome"]) -> str:
    """Search the documents."""
    return DOC


TOOL = FunctionTool.from_defaults(search)


def weather(city: Literal["rome", "paris"]) -> str:
    """The weather in a city."""
    return "sunny"


WEATHER = FunctionTool.from_defaults(weather)


class Answer(BaseModel):
    """The answer."""

    answer: Literal["rome", "paris"]
    sure: bool


@pytest.fixture()
def llm(chat_decoder):
    return FidesLLM.from_decoder(chat_decoder, max_new_tokens=60)


def assert_one_search_call(response, llm):
    calls = response.message.additional_kwargs["tool_calls"]
    assert response.message.content == "" and [c["function"]["name"] for c in calls] == ["search"], response
    selection = llm.get_tool_calls_from_response(response)[0]
    assert selection.tool_name == "search" and selection.tool_kwargs["query"] in ("eiffel tower", "rome")
    assert selection.tool_id == calls[0]["id"] and selection.tool_kwargs == json.loads(
        calls[0]["function"]["arguments"]
    )
    return selection


def test_forced_tool_call_parses_streams_and_runs_async(llm):
    assert FunctionCallingLLM.__name__ in [b.__name__ for b in FidesLLM.__mro__]  # llama-index integrations' class test
    assert llm.metadata.is_function_calling_model is True
    for kwargs in (
        {"tool_required": True},
        {"tool_choice": "search"},
        {"tool_choice": {"type": "function", "function": {"name": "search"}}},
    ):
        response = llm.chat_with_tools([TOOL], Q, **kwargs)
        assert_one_search_call(response, llm)
        info = response.additional_kwargs
        assert (  # one tool forced: its arguments alone are asked, with no tool block (a JSON-schema answer's prompt)
            info["tool_format"] == "fallback"
            and "<tools>" not in info["context_prompt"]
            and info["method"] == "standard"
        )
        assert info["notes"] == [
            "tools are bound and no tool has answered yet: decoded with 'standard' on the prompt as given"
        ]
    chunks = list(llm.stream_chat_with_tools([TOOL], Q, tool_required=True))
    assert [c.message.content for c in chunks] == [""]  # a forced call is held back, then comes whole
    assert_one_search_call(chunks[-1], llm)
    assert_one_search_call(asyncio.run(llm.achat_with_tools([TOOL], Q, tool_required=True)), llm)
    strict = llm.model_copy(update={"strict": True})  # the first turn of an agent is not a fallback
    assert_one_search_call(strict.chat_with_tools([TOOL], Q, tool_required=True), strict)
    assert llm.predict_and_call([TOOL], Q, tool_required=True).response == DOC  # LlamaIndex calls the tool


def test_tool_messages_are_the_evidence_and_calls_render_in_history(llm):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "search", "arguments": '{"query": "eiffel tower"}'},
    }
    rendered = '<tool_call>\n{"name": "search", "arguments": {"query": "eiffel tower"}}\n</tool_call>'
    assistants = [  # OpenAI's shape, Ollama's shape (arguments as a dict), a ToolCallBlock
        ChatMessage(role=MessageRole.ASSISTANT, content="", additional_kwargs={"tool_calls": [call]}),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            content="",
            additional_kwargs={
                "tool_calls": [{"function": {"name": "search", "arguments": {"query": "eiffel tower"}}}]
            },
        ),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[ToolCallBlock(tool_call_id="call_1", tool_name="search", tool_kwargs={"query": "eiffel tower"})],
        ),
    ]
    for assistant in assistants:
        history = [
            ChatMessage(role=MessageRole.USER, content=Q),
            assistant,
            ChatMessage(role=MessageRole.TOOL, content=DOC, additional_kwargs={"tool_call_id": "call_1"}),
        ]
        response = llm.chat_with_tools([TOOL], chat_history=history)
        info = response.additional_kwargs
        assert info["documents_source"] == "tool_messages" and info["method"] == "fides" and info["num_documents"] == 1
        assert response.raw["documents_source"] == "tool_messages" and response.raw["method"] == "fides"
        assert DOC in info["context_prompt"] and DOC not in info["no_context_prompt"]
        assert (
            "<tool_response>\n\n</tool_response>" in info["no_context_prompt"]
        )  # the same conversation, the result emptied
        for prompt in (info["context_prompt"], info["no_context_prompt"]):
            assert rendered in prompt and prompt.count("<tools>") == 1
    last = list(llm.stream_chat(history))[-1]  # tool messages without tools bound are the evidence too
    assert (
        last.additional_kwargs["documents_source"] == "tool_messages"
        and "<tools>" not in last.additional_kwargs["context_prompt"]
    )


def test_a_template_that_renders_tools_gets_them_natively():
    from fides_rag import FidesDecoder
    from fides_rag.testing import CHAT_TEMPLATE, build_tiny_model, build_tokenizer

    tok = build_tokenizer(chat=True)
    tok.chat_template = (
        "{% for t in tools or [] %}<|tool-def|>{{ t['function']['name'] }}<|end|>\n{% endfor %}" + CHAT_TEMPLATE
    )
    llm = FidesLLM(FidesDecoder(build_tiny_model("llama", len(tok)), tok), max_new_tokens=80)
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"query": "rome"}'}}
    history = [
        ChatMessage(role=MessageRole.USER, content=Q),
        ChatMessage(role=MessageRole.ASSISTANT, content="", additional_kwargs={"tool_calls": [call]}),
        ChatMessage(role=MessageRole.TOOL, content=DOC, additional_kwargs={"tool_call_id": "call_1"}),
    ]
    response = llm.chat_with_tools([TOOL, WEATHER], chat_history=history, tool_required=True)  # one of two: shown
    info = response.additional_kwargs
    assert info["tool_format"] == "native"
    assert llm.get_tool_calls_from_response(response)[0].tool_name in ("search", "weather")
    assert info["documents_source"] == "tool_messages" and info["method"] == "fides"
    for prompt in (info["context_prompt"], info["no_context_prompt"]):
        assert (
            prompt.count("<|tool-def|>search") == 1 and "<tools>" not in prompt and "<|tool|>\n" in prompt
        )  # the tool role kept
    assert f"<|tool|>\n{DOC}<|end|>" in info["context_prompt"] and "<|tool|>\n<|end|>" in info["no_context_prompt"]
    forced = llm.chat_with_tools([TOOL, WEATHER], chat_history=history, tool_choice="search").additional_kwargs
    assert "<|tool-def|>" not in forced["context_prompt"]  # one tool forced: its arguments alone, no tools shown


def test_parallel_calls_are_kept_only_when_allowed(llm):
    block = '<tool_call>\n\\{"name": "search", "arguments": \\{"query": "rome"\\}\\}\n</tool_call>'
    two = f"{block}\n{block}"  # a grammar makes the tiny model write two calls
    assert (
        len(llm.chat_with_tools([TOOL], Q, regex=two, max_new_tokens=200).message.additional_kwargs["tool_calls"]) == 1
    )
    both = llm.chat_with_tools([TOOL], Q, regex=two, max_new_tokens=200, allow_parallel_tool_calls=True)
    assert [s.tool_kwargs for s in llm.get_tool_calls_from_response(both)] == [{"query": "rome"}] * 2
    chunks = list(llm.stream_chat_with_tools([TOOL], Q, regex=f"Let me search\\. {block}", max_new_tokens=200))
    assert (
        "".join(c.delta for c in chunks) == chunks[-1].message.content == "Let me search."
    )  # text streams, the call waits
    assert len(chunks) > 2 and all("tool_calls" not in c.message.additional_kwargs for c in chunks[:-1])
    assert llm.get_tool_calls_from_response(chunks[-1])[0].tool_kwargs == {"query": "rome"}


def test_bad_tool_arguments_and_cut_calls_are_reported(llm):
    with pytest.raises(ValueError, match="a tool's name \\(search\\)"):
        llm.chat_with_tools([TOOL], Q, tool_choice="lookup")
    with pytest.raises(ValueError, match="needs tools"):
        llm.chat([ChatMessage(role=MessageRole.USER, content=Q)], tool_choice="required")
    with pytest.raises(ValueError, match="drop json_schema="):
        llm.chat_with_tools([TOOL], Q, tool_required=True, json_schema={"type": "object"})
    with pytest.raises(TypeError, match="complete does not take tools="):
        llm.complete(Q, tools=[TOOL])
    with pytest.raises(ValueError, match=r"max_new_tokens=3 is fewer than the (\d+) tokens .* at least \1"):
        llm.chat_with_tools(
            [TOOL], Q, tool_required=True, max_new_tokens=3
        )  # a call cannot fit: refused before decoding
    plain = llm.chat_with_tools([TOOL], Q, tool_choice="none", max_new_tokens=3)
    assert llm.get_tool_calls_from_response(plain, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="Expected at least one tool call"):
        llm.get_tool_calls_from_response(plain)


def test_structured_predict_is_held_to_the_schema(llm):
    prompt = PromptTemplate("Context: {context_str}\nQuestion: {query_str}\nAnswer:")
    answer = llm.structured_predict(Answer, prompt, context_str=DOC, query_str=Q)
    info = llm.history[-1]["info"]
    assert isinstance(answer, Answer) and info["method"] == "fides" and DOC not in info["no_context_prompt"]
    assert isinstance(asyncio.run(llm.astructured_predict(Answer, prompt, context_str=DOC, query_str=Q)), Answer)
    streamed = list(llm.stream_structured_predict(Answer, prompt, context_str=DOC, query_str=Q))
    assert streamed[-1] == answer and all(isinstance(s, BaseModel) for s in streamed)
    assert asyncio.run(_last(llm.astream_structured_predict(Answer, prompt, context_str=DOC, query_str=Q))) == answer
    as_json = llm.predict(prompt, context_str=DOC, query_str=Q, json_schema=Answer.model_json_schema())
    assert Answer.model_validate_json(as_json) and llm.complete(Q, documents=[DOC], regex="(rome|paris)").text in (
        "rome",
        "paris",
    )
    reply = llm.as_structured_llm(Answer).chat([ChatMessage(role=MessageRole.USER, content=Q)], documents=[DOC])
    assert Answer.model_validate_json(reply.message.content) == reply.raw
    assert llm.history[-1]["info"]["method"] == "fides" and llm.history[-1]["info"]["prompt_type"] == "fides_rag"
    function = llm.model_copy(
        update={"pydantic_program_mode": PydanticProgramMode.FUNCTION}
    )  # a forced call of the class
    assert isinstance(function.structured_predict(Answer, prompt, context_str=DOC, query_str=Q), Answer)
    info = function.history[-1]["info"]  # context_str is the context here too, as in predict
    assert info["method"] == "fides" and info["documents_source"] == "context" and DOC not in info["no_context_prompt"]
    with pytest.raises(ValueError, match="max_new_tokens=2 is fewer than the .* raise max_new_tokens to at least"):
        llm.structured_predict(
            Answer, prompt, llm_kwargs={"max_new_tokens": 2}, context_str=DOC, query_str=Q
        )  # never cut
    with pytest.raises(ValueError, match="drop regex="):
        llm.structured_predict(Answer, prompt, llm_kwargs={"regex": "a"}, context_str=DOC, query_str=Q)


def _context_recorded(info: dict) -> bool:
    return info["method"] == "fides" and DOC in info["context_prompt"] and DOC not in info["no_context_prompt"]


def test_a_function_calling_program_takes_its_context_str_as_the_context(llm):
    """LlamaIndex's FunctionCallingProgram hands the LLM only the formatted messages: context_str still decodes as the
    context path (emptied on the no-context path)."""
    prompt = PromptTemplate("Context: {context_str}\nQuestion: {query_str}\nAnswer:")
    program = FunctionCallingProgram.from_defaults(output_cls=Answer, prompt=prompt, llm=llm)
    answer = program(context_str=DOC, query_str=Q)
    info = llm.history[-1]["info"]
    assert isinstance(answer, Answer) and _context_recorded(info), info["notes"]
    assert (
        info["context_variables"] == ["context_str"]
        and info["documents_source"] == "context"
        and info["tool_choice"] == "required"
    )
    awaited = asyncio.run(
        program.acall(llm_kwargs={"documents": [DOC]}, context_str=DOC, query_str=Q)
    )  # acall opens no span
    assert isinstance(awaited, Answer) and _context_recorded(llm.history[-1]["info"])
    program(context_str="", query_str=Q)  # an empty context: 'standard', said
    assert (
        llm.history[-1]["info"]["method"] == "standard"
        and llm.history[-1]["info"]["fallback"] == "the documents given were empty"
    )
    llm.chat_with_tools([TOOL], Q, tool_required=True)  # a later call outside the program has no context of its own
    assert llm.history[-1]["info"]["method"] == "standard"


class Said(BaseModel):
    """Free text, which the random model never closes on its own."""

    said: str


def test_a_structured_answer_the_grammar_closed_early_parses_as_complete(llm, chat_decoder):
    from fides_rag.calls import constraint_of, shortest_answer_tokens

    schema = constraint_of(json_schema=Said)["json_schema"]
    budget = shortest_answer_tokens(chat_decoder.tokenizer, json_schema=schema) + 3
    prompt = PromptTemplate("Context: {context_str}\nQuestion: {query_str}\nAnswer:")
    said = llm.structured_predict(Said, prompt, llm_kwargs={"max_new_tokens": budget}, context_str=DOC, query_str=Q)
    info = llm.history[-1]["info"]
    assert isinstance(said, Said) and info["closed_early"] is True and info["finish_reason"] != "length"
    streamed = list(
        llm.stream_structured_predict(Said, prompt, llm_kwargs={"max_new_tokens": budget}, context_str=DOC, query_str=Q)
    )
    assert streamed[-1] == said


async def _last(stream):
    items = [item async for item in await stream]
    return items[-1]
