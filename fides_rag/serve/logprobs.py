"""The answer's log-probabilities in OpenAI's shapes, from the steps the engine recorded (each token's
log-probability under the distribution it was chosen from, and its most likely alternatives): chat's
`logprobs.content[j]` ({token, logprob, bytes, top_logprobs}) and completions' {tokens, token_logprobs, top_logprobs,
text_offset}. One entry per completion token, as OpenAI's API pairs them with `usage.completion_tokens`: the end-of-turn
token that ended the answer has its entry too (its token string as the tokenizer writes it, "<|im_end|>", though it is
not part of the text; its log-probability is that of ending there), last, at the text's end."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fides_rag.result import StepRecord

Decode = Callable[[list[int]], str]


def _entry(token: str, logprob: float | None) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def answer_steps(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """The steps that carry log-probabilities: every completion token's, a final end-of-turn token's included."""
    return [s for s in steps if s.logprob is not None]


def chat_logprobs(steps: Sequence[StepRecord], decode: Decode) -> dict[str, Any]:
    """`choices[i].logprobs` of a chat completion (or of one chunk) for `steps`."""
    content = [
        {**_entry(s.token, s.logprob), "top_logprobs": [_entry(decode([i]), lp) for i, lp in s.top_logprobs or []]}
        for s in steps
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(steps: Sequence[StepRecord], decode: Decode) -> dict[str, Any]:
    """`choices[i].logprobs` of a text completion for `steps`."""
    offsets, at = [], 0
    for s in steps:
        offsets.append(at)
        at += len(s.token)
    return {
        "tokens": [s.token for s in steps],
        "token_logprobs": [s.logprob for s in steps],
        "top_logprobs": [{decode([i]): lp for i, lp in s.top_logprobs or []} for s in steps],
        "text_offset": offsets,
    }
