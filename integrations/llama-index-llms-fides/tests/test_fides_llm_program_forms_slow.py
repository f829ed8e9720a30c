"""Every call form of a LlamaIndex program and of structured_predict on the real backbone (smollm2-135m-instruct), with
a document that contradicts what the model knows: each records `fides` with the prompt's context_str as its context
path, and the answer follows the document (Rome, Italy; the model's memory says Paris). A FunctionCallingProgram's
call, forced to its class's tool, is decoded as the arguments alone and wrapped: with the {"name", "arguments"}
wrapper before the arguments, every form answered Paris."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from llama_index.core.program import FunctionCallingProgram, LLMTextCompletionProgram
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import PydanticProgramMode
from llama_index.llms.fides import FidesLLM
from pydantic import BaseModel

from .conftest import CONFLICT_DOCUMENTS

pytestmark = pytest.mark.slow
EIFFEL = CONFLICT_DOCUMENTS[0]
PROMPT = PromptTemplate("Context: {context_str}\nWhere is the Eiffel Tower? Give the city and the country.")


class Place(BaseModel):
    """Where a landmark is."""

    city: str
    country: str


@pytest.fixture(scope="module")
def llm(smollm_decoder):
    return FidesLLM.from_decoder(smollm_decoder, max_new_tokens=40)


async def _last(stream: Any) -> Any:
    last = None
    async for item in await stream:
        last = item
    return last


PROGRAM_FORMS: dict[str, Callable[[Any], Any]] = {
    "call": lambda program: program(context_str=EIFFEL),
    "acall": lambda program: asyncio.run(program.acall(context_str=EIFFEL)),
    "stream_call": lambda program: list(program.stream_call(context_str=EIFFEL))[-1],
    "astream_call": lambda program: asyncio.run(_last(program.astream_call(context_str=EIFFEL))),
}
STRUCTURED_FORMS: dict[str, Callable[[FidesLLM], Any]] = {
    "structured_predict": lambda llm: llm.structured_predict(Place, PROMPT, context_str=EIFFEL),
    "astructured_predict": lambda llm: asyncio.run(llm.astructured_predict(Place, PROMPT, context_str=EIFFEL)),
    "stream_structured_predict": lambda llm: list(llm.stream_structured_predict(Place, PROMPT, context_str=EIFFEL))[-1],
    "astream_structured_predict": lambda llm: asyncio.run(
        _last(llm.astream_structured_predict(Place, PROMPT, context_str=EIFFEL))
    ),
}


def _recorded(llm: FidesLLM, label: str, place: Any) -> None:
    info = llm.history[-1]["info"]
    print(f"[{label}] {place!r} method={info['method']} source={info['documents_source']}")
    assert info["method"] == "fides" and info["documents_source"] == "context" and info.get("fallback") is None
    assert EIFFEL in info["context_prompt"] and EIFFEL not in info["no_context_prompt"]


@pytest.mark.parametrize("form", list(PROGRAM_FORMS))
def test_a_function_calling_program_answers_from_the_document_in_every_form(llm, form):
    place = PROGRAM_FORMS[form](FunctionCallingProgram.from_defaults(output_cls=Place, prompt=PROMPT, llm=llm))
    _recorded(llm, f"FunctionCallingProgram.{form}", place)
    assert llm.history[-1]["info"]["tool_choice"] == "required"
    assert isinstance(place, Place) and place.city == "Rome" and place.country == "Italy"


@pytest.mark.parametrize("form", list(PROGRAM_FORMS))
def test_a_text_completion_program_answers_from_the_document_in_every_form(llm, form):
    place = PROGRAM_FORMS[form](LLMTextCompletionProgram.from_defaults(output_cls=Place, prompt=PROMPT, llm=llm))
    _recorded(llm, f"LLMTextCompletionProgram.{form}", place)
    assert place.city == "Rome" and place.country == "Italy"


@pytest.mark.parametrize("mode", [PydanticProgramMode.DEFAULT, PydanticProgramMode.FUNCTION, PydanticProgramMode.LLM])
@pytest.mark.parametrize("form", list(STRUCTURED_FORMS))
def test_structured_predict_answers_from_the_document_in_every_form_and_mode(llm, mode, form):
    moded = llm.model_copy(update={"pydantic_program_mode": mode})
    place = STRUCTURED_FORMS[form](moded)
    _recorded(moded, f"{mode.value}.{form}", place)
    assert place.city == "Rome" and place.country == "Italy"
