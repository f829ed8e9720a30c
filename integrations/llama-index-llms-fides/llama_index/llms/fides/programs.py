"""The prompt template and arguments of a LlamaIndex program's call (`FunctionCallingProgram`, ...), which hands the
LLM only the messages it formatted: LlamaIndex's instrumentation opens a span around a program's `__call__` with its
arguments, and a span handler keeps them while the span is open, so FidesLLM can find the call's context variables
(context_str) in those messages. The other call forms (`acall`, `stream_call`, `astream_call`) open no span; their
program and arguments are read from the caller that is running them."""

from __future__ import annotations

import inspect
import sys
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from llama_index.core.bridge.pydantic import BaseModel, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index.core.output_parsers import PydanticOutputParser
from llama_index.core.prompts.base import BasePromptTemplate
from llama_index.core.types import BasePydanticProgram

from fides_rag.calls import with_structure


@dataclass(frozen=True)
class ProgramCall:
    """One program call in progress: its LLM, prompt template and keyword arguments (the template's variables), and
    the class it answers with (None when it has none)."""

    llm: Any
    prompt: BasePromptTemplate
    arguments: dict[str, Any]
    output_cls: type[BaseModel] | None = None

    def call_defaults(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The LLM call's keywords with what the program means but does not say: a call of its output class as a
        tool is forced (LlamaIndex's program streams pass tool_choice "auto"), and a text answer parsed into the class
        is held to its JSON schema (LlamaIndex's text programs only ask for it in the prompt)."""
        if self.output_cls is None:
            return kwargs
        if kwargs.get("tools"):
            if kwargs.get("tool_choice") in (None, "auto"):
                return {**kwargs, "tool_choice": "required"}
            return kwargs
        if any(kwargs.get(name) is not None for name in ("json_schema", "regex", "grammar")):
            return kwargs
        return with_structure(kwargs, self.output_cls, "a program's answer")


def _output_class(program: BasePydanticProgram) -> type[BaseModel] | None:
    """The class a program answers with, where its text is parsed as that class's JSON (or it calls it as a tool)."""
    output_cls = getattr(program, "_output_cls", None)
    parser = getattr(program, "_output_parser", None)
    if not (isinstance(output_cls, type) and issubclass(output_cls, BaseModel)):
        return None
    return output_cls if parser is None or isinstance(parser, PydanticOutputParser) else None


_CURRENT: ContextVar[ProgramCall | None] = ContextVar("llama_index_llms_fides_program_call", default=None)


class ProgramCalls(BaseSpanHandler[Any]):
    """Keeps the program call whose span is open in this thread or task (`program_call`); records no spans."""

    _tokens: dict[str, Token] = PrivateAttr(default_factory=dict)

    @classmethod
    def class_name(cls) -> str:
        return "FidesProgramCalls"

    def span_enter(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        parent_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        prompt = getattr(instance, "_prompt", None)
        if isinstance(instance, BasePydanticProgram) and isinstance(prompt, BasePromptTemplate):
            arguments = {k: v for k, v in bound_args.kwargs.items() if k != "llm_kwargs"}
            self._tokens[id_] = _CURRENT.set(
                ProgramCall(getattr(instance, "_llm", None), prompt, arguments, _output_class(instance))
            )

    def span_exit(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        result: Any | None = None,
        **kwargs: Any,
    ) -> None:
        self._close(id_)

    def span_drop(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        err: BaseException | None = None,
        **kwargs: Any,
    ) -> None:
        self._close(id_)

    def _close(self, id_: str) -> None:
        token = self._tokens.pop(id_, None)
        if token is not None:
            _CURRENT.reset(token)  # a program's __call__ enters and exits its span in one context

    def new_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        parent_span_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        return None

    def prepare_to_exit_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        result: Any | None = None,
        **kwargs: Any,
    ) -> None:
        return None

    def prepare_to_drop_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        err: BaseException | None = None,
        **kwargs: Any,
    ) -> None:
        return None


def watch_programs() -> None:
    """Register the span handler on LlamaIndex's root dispatcher (once per process)."""
    root = get_dispatcher()
    if not any(isinstance(handler, ProgramCalls) for handler in root.span_handlers):
        root.add_span_handler(ProgramCalls())


PROGRAM_FRAMES = 64
"""How many callers `program_call` looks through for a program's call that opened no span."""


def program_call(llm: Any) -> ProgramCall | None:
    """The program call in progress whose LLM is `llm`, or None: the one whose span is open (`__call__`), else the
    nearest caller that is a program's method on `llm` (`acall`, `stream_call` and `astream_call` open no span, but
    each formats its prompt from its keyword arguments, `kwargs`, while it calls the LLM)."""
    call = _CURRENT.get()
    if call is not None and call.llm is llm:
        return call
    frame = sys._getframe(1)
    for _ in range(PROGRAM_FRAMES):
        frame = frame.f_back  # type: ignore[assignment]  # None past the outermost caller, checked below
        if frame is None:
            return None
        program = frame.f_locals.get("self")
        if isinstance(program, BasePydanticProgram) and getattr(program, "_llm", None) is llm:
            prompt, arguments = getattr(program, "_prompt", None), frame.f_locals.get("kwargs")
            if isinstance(prompt, BasePromptTemplate) and isinstance(arguments, dict):
                arguments = {k: v for k, v in arguments.items() if k != "llm_kwargs"}
                return ProgramCall(llm, prompt, arguments, _output_class(program))
    return None
