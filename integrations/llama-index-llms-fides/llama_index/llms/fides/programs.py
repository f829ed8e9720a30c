"""The prompt template and arguments of a LlamaIndex program's call (`FunctionCallingProgram`, ...), which hands the
LLM only the messages it formatted: LlamaIndex's instrumentation opens a span around a program's `__call__` with its
arguments, and a span handler keeps them while the span is open, so FidesLLM can find the call's context variables
(context_str) in those messages."""

from __future__ import annotations

import inspect
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index.core.prompts.base import BasePromptTemplate
from llama_index.core.types import BasePydanticProgram


@dataclass(frozen=True)
class ProgramCall:
    """One program call in progress: its LLM, prompt template and keyword arguments (the template's variables)."""

    llm: Any
    prompt: BasePromptTemplate
    arguments: dict[str, Any]


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
            self._tokens[id_] = _CURRENT.set(ProgramCall(getattr(instance, "_llm", None), prompt, arguments))

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


def program_call(llm: Any) -> ProgramCall | None:
    """The program call in progress whose LLM is `llm`, or None."""
    call = _CURRENT.get()
    return call if call is not None and call.llm is llm else None
