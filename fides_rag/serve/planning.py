"""A request body becomes a call of the core's call layer (`fides_rag.calls`): its options, and its plan through
the same planner as every front door, so the same messages and documents mean the same context everywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fides_rag.calls import (
    Call,
    CallFactory,
    CallInputError,
    CallOptions,
    ChatPlan,
    ChatPrompts,
    check_question,
    turn_of,
)
from fides_rag.decoder import FidesDecoder
from fides_rag.method.config import FidesConfig
from fides_rag.serve.agent_call import AgentCall
from fides_rag.serve.errors import bad_request
from fides_rag.serve.protocol import ChatCompletionRequest, CompletionRequest, GenerationRequest

FIELDS = {"json_schema": "response_format"}
"""The call layer's option names that are another field over HTTP."""
Planner = Callable[[ChatPrompts, Any, int], ChatPlan]
"""An endpoint's plan of its body (`chat_plan`, `completion_plan`), each taking its own endpoint's body."""


def chat_plan(prompts: ChatPrompts, body: ChatCompletionRequest, max_new: int) -> ChatPlan:
    """The conversation's plan: documents from `documents`, the tool messages, or the system messages; the planner's
    tools in front of both paths."""
    turns = [turn_of(m.role, m.text(), [c.model_dump() for c in m.tool_calls or []]) for m in body.messages]
    try:
        check_question(turns)
    except ValueError:
        raise bad_request("messages need a user message (the question)", "messages") from None
    return prompts.conversation(turns, max_new, documents=body.documents)


def completion_plan(prompts: ChatPrompts, body: CompletionRequest, max_new: int) -> ChatPlan:
    """The prompt as given: documents found in it are contrasted where they stand; otherwise fides-rag's template
    with the prompt as the question."""
    prompt = body.text()
    if body.documents is None:
        return prompts.plain([("user", prompt)], "no documents were given", prompt)
    return prompts.with_documents([("user", prompt)], body.documents, "documents", max_new, question=prompt)


def call_options(decoder: FidesDecoder, body: GenerationRequest, default_method: str) -> CallOptions:
    """The call's options: the server's method unless the body names one, greedy unless a temperature above 0."""
    config = None
    if body.fides_config is not None:
        try:
            config = FidesConfig.from_dict(body.fides_config)
        except (TypeError, ValueError) as err:
            raise bad_request(f"invalid fides_config: {err}", "fides_config") from None
    call = {
        "method": body.method,
        "fides_config": config,
        "max_new_tokens": body.budget(),
        "stop": body.stops(),
        "do_sample": body.temperature is not None and body.temperature > 0,
        "temperature": body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "seed": body.seed,
    }
    defaults = {"method": default_method, "max_new_tokens": decoder.max_new_tokens}
    return CallOptions.parse(defaults, {k: v for k, v in call.items() if v is not None})


def build_call(
    calls: CallFactory, body: GenerationRequest, default_method: str, plan_of: Planner, agent: AgentCall
) -> Call:
    """The request's call with its agent fields, its planner built once (bad input: a 400 naming the field)."""
    try:
        options = call_options(calls.decoder, body, default_method)
        options.stop = list(dict.fromkeys([*options.stop, *agent.stop]))
        options.constraint = dict(agent.constraint)
        if agent.logprobs is not None:
            options.sampling["logprobs"] = agent.logprobs
        planner = calls.planner(
            agent.calling,
            chat=isinstance(body, ChatCompletionRequest),
            no_context_path=body.no_context_path or "emptied",
        )
        return calls.call(plan_of(planner, body, options.max_new_tokens), options, agent.calling)
    except CallInputError as err:
        raise bad_request(" ".join(str(err).split()), FIELDS.get(err.field, err.field)) from None
