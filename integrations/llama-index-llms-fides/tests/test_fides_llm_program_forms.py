"""Every form of a LlamaIndex program's call carries the prompt's context variable as FIDES's context path, on a tiny
random-weight model: `__call__`, `acall`, `stream_call` and `astream_call` of `FunctionCallingProgram` and of
`LLMTextCompletionProgram` (chat and completion LLMs), and `structured_predict` with its async and streaming forms in
every program mode; a program with no context says so (`fallback`, one warning), or refuses under `strict=True`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Literal

import pytest
from llama_index.core.program import FunctionCallingProgram, LLMTextCompletionProgram
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import PydanticProgramMode
from llama_index.llms.fides import FidesFallbackError, FidesLLM
from pydantic import BaseModel

DOC = "The Eiffel Tower is in Rome."
Q = "Where is the Eiffel Tower?"
PROMPT = PromptTemplate("Context: {context_str}\nQuestion: {query_str}\nAnswer:")
NO_CONTEXT_PROMPT = PromptTemplate("Question: {query_str}\nAnswer:")


class Answer(BaseModel):
    """The answer."""

    answer: Literal["rome", "paris"]
    sure: bool


JSON_SCHEMA = {"json_schema": Answer.model_json_schema()}
"""Holds a completion program's free text to the class, so the random model's answer parses."""


def _run(form: str, program: Any, **arguments: Any) -> None:
    """Call `program` in `form` and consume what it returns (a stream to its end); a parse error of the random
    model's text is not what these tests are about, so it is let pass: the LLM's record is."""
    try:
        if form == "call":
            program(**arguments)
        elif form == "acall":
            asyncio.run(program.acall(**arguments))
        elif form == "stream_call":
            list(program.stream_call(**arguments))
        else:

            async def consume() -> None:
                async for _ in await program.astream_call(**arguments):
                    pass

            asyncio.run(consume())
    except ValueError as err:  # LlamaIndex's parse error of an answer
        if "strict=True" in str(err):
            raise


FORMS = ["call", "acall", "stream_call", "astream_call"]


def _assert_context_path(llm: FidesLLM, source: str) -> dict[str, Any]:
    info = llm.history[-1]["info"]
    assert info["method"] == "fides", info["notes"]
    assert info["documents_source"] == source and info["context_variables"] == ["context_str"]
    assert DOC in info["context_prompt"] and DOC not in info["no_context_prompt"]
    assert info.get("fallback") is None
    return info


@pytest.fixture()
def chat_llm(chat_decoder):
    return FidesLLM.from_decoder(chat_decoder, max_new_tokens=60)


@pytest.fixture()
def completion_llm(plain_decoder):
    return FidesLLM.from_decoder(plain_decoder, max_new_tokens=60)


@pytest.mark.parametrize("form", FORMS)
def test_a_function_calling_program_call_in_every_form_contrasts_its_context_str(chat_llm, form):
    program = FunctionCallingProgram.from_defaults(output_cls=Answer, prompt=PROMPT, llm=chat_llm)
    _run(form, program, context_str=DOC, query_str=Q)
    assert _assert_context_path(chat_llm, "context")["tool_choice"] == "required"  # streams pass "auto": forced


@pytest.mark.parametrize("llm_name", ["chat_llm", "completion_llm"])
@pytest.mark.parametrize("form", FORMS)
def test_a_text_completion_program_call_in_every_form_contrasts_its_context_str(request, llm_name, form):
    llm = request.getfixturevalue(llm_name)
    program = LLMTextCompletionProgram.from_defaults(output_cls=Answer, prompt=PROMPT, llm=llm)
    _run(form, program, llm_kwargs=dict(JSON_SCHEMA), context_str=DOC, query_str=Q)
    _assert_context_path(llm, "context")


STRUCTURED: dict[str, Callable[[FidesLLM], Any]] = {
    "structured_predict": lambda llm: llm.structured_predict(Answer, PROMPT, context_str=DOC, query_str=Q),
    "astructured_predict": lambda llm: asyncio.run(
        llm.astructured_predict(Answer, PROMPT, context_str=DOC, query_str=Q)
    ),
    "stream_structured_predict": lambda llm: list(
        llm.stream_structured_predict(Answer, PROMPT, context_str=DOC, query_str=Q)
    ),
    "astream_structured_predict": lambda llm: asyncio.run(_drain(llm)),
}


async def _drain(llm: FidesLLM) -> None:
    async for _ in await llm.astream_structured_predict(Answer, PROMPT, context_str=DOC, query_str=Q):
        pass


@pytest.mark.parametrize("mode", [PydanticProgramMode.DEFAULT, PydanticProgramMode.FUNCTION, PydanticProgramMode.LLM])
@pytest.mark.parametrize("call", list(STRUCTURED))
def test_structured_predict_in_every_form_and_program_mode_contrasts_its_context_str(chat_llm, mode, call):
    llm = chat_llm.model_copy(update={"pydantic_program_mode": mode})
    try:
        STRUCTURED[call](llm)
    except ValueError:  # LLM mode parses the random model's free text
        assert mode == PydanticProgramMode.LLM
    info = llm.history[-1]["info"]
    assert info["method"] == "fides" and DOC in info["context_prompt"] and DOC not in info["no_context_prompt"], info


@pytest.mark.parametrize("form", FORMS)
def test_a_program_without_context_says_it_decoded_standard_and_why(chat_llm, form, caplog):
    program = FunctionCallingProgram.from_defaults(output_cls=Answer, prompt=NO_CONTEXT_PROMPT, llm=chat_llm)
    with caplog.at_level(logging.WARNING):
        _run(form, program, query_str=Q)
    info = chat_llm.history[-1]["info"]
    assert info["method"] == "standard" and "no context variable" in info["fallback"]
    assert any("no context variable" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("form", FORMS)
def test_a_strict_program_without_context_refuses(chat_decoder, form):
    llm = FidesLLM.from_decoder(chat_decoder, max_new_tokens=60, strict=True)
    program = FunctionCallingProgram.from_defaults(output_cls=Answer, prompt=NO_CONTEXT_PROMPT, llm=llm)
    with pytest.raises(FidesFallbackError, match="strict=True: the program's prompt has no context variable"):
        _run(form, program, query_str=Q)
