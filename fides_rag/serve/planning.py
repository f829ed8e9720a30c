"""A request body becomes a plan (the two prompts, through the core's conversation planner, as `ChatFides` plans
the same messages and documents) and the decoder's options."""

from __future__ import annotations

import json
from typing import Any

from fides_rag.chat import ChatPlan, ChatPrompts
from fides_rag.config import FidesConfig
from fides_rag.decoder import FidesDecoder
from fides_rag.generation.settings import sampling_options
from fides_rag.rules import accepts_option, available_methods, get_method
from fides_rag.serve.errors import bad_request
from fides_rag.serve.protocol import ChatCompletionRequest, CompletionRequest, Sampling
from fides_rag.tool_calls import ToolCall, ToolCalling

ROLES = {"developer": "system"}


def planner(decoder: FidesDecoder, body: Sampling, *, chat: bool) -> ChatPrompts:
    """The core's planner as `ChatFides` sets it up: the chat template when the tokenizer has one (chat requests)."""
    tokenizer = decoder.tokenizer
    return ChatPrompts(tokenizer, context_window=decoder.context_window,
                       use_chat_template=chat and bool(getattr(tokenizer, "chat_template", None)),
                       no_context_path=body.no_context_path or "emptied", template=decoder.prompt_template)


def _turns(decoder: FidesDecoder, body: ChatCompletionRequest) -> list[tuple[str, str]]:
    calls = ToolCalling(decoder.tokenizer, [])
    turns = []
    for message in body.messages:
        text = message.text()
        if message.tool_calls:
            made = [ToolCall(c.function.name, _arguments(c.function.arguments), c.id) for c in message.tool_calls]
            text = calls.render_calls(text, made)
        turns.append((ROLES.get(message.role, message.role), text))
    return turns


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as err:
        raise bad_request(f"a tool call's arguments must be a JSON object: {err}", "messages.tool_calls.function.arguments") from None
    if not isinstance(value, dict):
        raise bad_request("a tool call's arguments must be a JSON object", "messages.tool_calls.function.arguments")
    return value


def chat_plan(decoder: FidesDecoder, body: ChatCompletionRequest, max_new: int) -> ChatPlan:
    """Documents from `documents`, else from the tool messages, else none ('standard', with a note saying why)."""
    users = [m for m in body.messages if m.role == "user"]
    if not users:
        raise bad_request("messages need a user message (the question)", "messages")
    question = users[-1].text()
    turns = _turns(decoder, body)
    prompts = planner(decoder, body, chat=True)
    if body.documents is not None:
        return prompts.with_documents(turns, body.documents, "documents", max_new, question=question)
    from_tools = prompts.from_tool_turns(turns, max_new, question=question)
    if from_tools is not None:
        return from_tools
    return prompts.plain(turns, "no documents were given and no tool message holds any", question)


def completion_plan(decoder: FidesDecoder, body: CompletionRequest, max_new: int) -> ChatPlan:
    """The prompt as given: documents found in it are contrasted where they stand; otherwise fides-rag's template
    with the prompt as the question."""
    prompt = body.text()
    prompts = planner(decoder, body, chat=False)
    if body.documents is None:
        return prompts.plain([("user", prompt)], "no documents were given", prompt)
    return prompts.with_documents([("user", prompt)], body.documents, "documents", max_new, question=prompt)


def method_of(body: Sampling, default: str) -> Any:
    """The request's rule: its `method` (default the server's), with its `fides_config` where the rule takes one."""
    name = body.method or default
    if name not in available_methods():
        raise bad_request(f"unknown method {name!r}; available methods: {', '.join(available_methods())}", "method", "unknown_method")
    if body.fides_config is None:
        return name
    if not accepts_option(name, "config"):
        raise bad_request(f"fides_config applies to methods that take a FidesConfig (fides and its variants), not {name!r}", "fides_config")
    try:
        config = FidesConfig.from_dict(body.fides_config)
    except (TypeError, ValueError) as err:
        raise bad_request(f"invalid fides_config: {err}", "fides_config") from None
    return get_method(name, config=config)


def decode_options(decoder: FidesDecoder, plan: ChatPlan, body: Sampling, method: Any, max_new: int) -> dict[str, Any]:
    """The decoder's keywords: greedy unless a temperature above 0 is given (then sampling with top_p and seed)."""
    sampling = sampling_options(body.temperature is not None and body.temperature > 0, body.temperature,
                                1.0 if body.top_p is None else body.top_p, 0, body.seed)
    return dict(method=plan.method or method, max_new_tokens=max_new, stop=plan.stop_strings(body.stops(), decoder.prompt_template),
                **sampling)
