"""The call layer: what one call to a FIDES model means, owned once for every front door (LangChain, LlamaIndex, the
OpenAI-compatible server). The front doors only convert messages in and answers out.

One job per file: `options` (one options type, the method check, `FidesFallbackError`, `CallInputError`),
`planning` (one planner and one role map: where a conversation's context comes from, its two prompts), `tools`
(tool_choice, the forced call's grammar, parsing, streamed calls), `structure` (JSON schema / pydantic / regex
constraints, checked before decoding), `answering` (decode and stream through `FidesDecoder.submit`, stops, one
`Answer`, a model object's `AnswerLog`), `factory` (the one way a front door makes its calls: tool calling, the planner
with its tools, the `Call` and whether the template rendered the tools; batching set once), `unanswered` (an agent's
turn that answered nothing: decoded again under the answer rules, else `UnansweredError`), `metadata` (the FIDES
record, finish reasons, usage),
`fields` (the decoding fields every framework's model object inherits: method, budget, stops, sampling, batching),
`retrievals` (which texts a framework's retriever returned are a call's context, from the run tree its callbacks
report), `decoders` (the decoder behind a front door from a decoder, a model and tokenizer or a model id; its
default options checked; its identity for a cache key).

Usage (a front door's whole job between its own types):

    from fides_rag.calls import CallFactory, CallOptions, constraint_of

    calls = CallFactory(decoder, max_batch_size=8, batch_window_s=0.005, no_context_path="emptied")  # once a model
    opts = CallOptions.parse({"method": "fides", "max_new_tokens": 128}, call_kwargs)    # unknown keys: TypeError
    opts.constraint = constraint_of(json_schema=schema)          # response_format / with_structured_output
    calling = calls.tools(tools, tool_choice)                     # None without tools
    turns = [(role_of(m.role), text) for m in messages]           # earlier calls: render_calls(text, calls)
    plan = calls.planner(calling).conversation(turns, opts.max_new_tokens, documents=documents)  # same context
    call = calls.call(plan, opts, calling, structure=schema, extra={"model_name": name})  # strict: FidesFallbackError
    answer = call.run()  # or await call.arun(); call.stream() / call.astream() yield str deltas, then the Answer
    answer.text, answer.tool_calls, answer.parsed, answer.finish_reason, answer.record, answer.notes, answer.usage

A server that submits first (to refuse bad input before its response starts) streams the handle:
`handle = call.submit(stream=True)`, then `call.astream(handle)`. Bad input raises `CallInputError` (a ValueError)
whose `field` names what to fix (a tool's schema, tool_choice, a schema the grammar library cannot compile).
"""

from fides_rag.calls.answering import Answer, AnswerLog, Call, CallStream
from fides_rag.calls.factory import CallFactory
from fides_rag.calls.fields import DecodingFields
from fides_rag.calls.metadata import FINISH_REASONS, record, usage
from fides_rag.calls.options import (
    CONSTRAINTS,
    FIDES_CONSTANTS,
    CallOptions,
    fold_fides_constants,
    resolve_method,
)
from fides_rag.calls.planning import (
    DOCUMENTS_INSTRUCTION,
    ROLES,
    STANDARD,
    ChatPlan,
    ChatPrompts,
    ContextMessages,
    Turn,
    check_question,
    context_in_system,
    documents_beside,
    filled_variable,
    role_of,
    turn_of,
    why_no_documents,
)
from fides_rag.calls.structure import (
    check_complete,
    closed_schema,
    constraint_of,
    parse_structure,
    refuse_other_grammar,
    schema_of,
    shortest_answer_tokens,
    with_structure,
)
from fides_rag.calls.tools import (
    ToolCall,
    ToolCalling,
    ToolCallStream,
    ToolSpec,
    calls_from_openai,
    new_call_id,
    render_calls,
    tool_choice_name,
)
from fides_rag.errors import CallInputError, FidesFallbackError, IncompleteAnswerError, UnansweredError
from fides_rag.generation.grammar.schema_support import check_strict_schema, unenforced_keywords
from fides_rag.generation.request_options import CALL, REQUEST_OPTIONS, option_field, options_of
from fides_rag.generation.requests import special_token_id
from fides_rag.generation.streaming import iterate_in_thread

__all__ = [
    "Answer",
    "AnswerLog",
    "CALL",
    "CONSTRAINTS",
    "Call",
    "CallFactory",
    "CallInputError",
    "CallOptions",
    "CallStream",
    "ChatPlan",
    "ChatPrompts",
    "ContextMessages",
    "DOCUMENTS_INSTRUCTION",
    "DecodingFields",
    "FIDES_CONSTANTS",
    "FINISH_REASONS",
    "FidesFallbackError",
    "IncompleteAnswerError",
    "REQUEST_OPTIONS",
    "ROLES",
    "STANDARD",
    "ToolCall",
    "ToolCallStream",
    "ToolCalling",
    "ToolSpec",
    "Turn",
    "UnansweredError",
    "calls_from_openai",
    "check_complete",
    "check_question",
    "check_strict_schema",
    "closed_schema",
    "constraint_of",
    "context_in_system",
    "documents_beside",
    "filled_variable",
    "fold_fides_constants",
    "iterate_in_thread",
    "new_call_id",
    "option_field",
    "options_of",
    "parse_structure",
    "record",
    "refuse_other_grammar",
    "render_calls",
    "resolve_method",
    "role_of",
    "schema_of",
    "shortest_answer_tokens",
    "special_token_id",
    "tool_choice_name",
    "turn_of",
    "unenforced_keywords",
    "usage",
    "why_no_documents",
    "with_structure",
]
