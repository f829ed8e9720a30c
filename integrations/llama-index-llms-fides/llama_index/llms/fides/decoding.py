"""Decoding one call's prompt pair through the shared request batcher, and the response's signals (a mixin of FidesLLM)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseGen

from fides_rag import GenerationResult
from fides_rag.batching import RequestBatcher, shared_batcher
from fides_rag.prompts import TemplateLeftovers, template_stops
from fides_rag.rules import accepts_option, get_method

from llama_index.llms.fides.options import FidesFallbackError, call_options, decoding_options
from llama_index.llms.fides.pairing import PromptPair

logger = logging.getLogger("llama_index.llms.fides")
PAIR_EXTRAS = ("documents_source", "num_documents", "tool_format", "tool_choice")
"""What a tool-aware call adds to the response's metadata (additional_kwargs) and to its raw dict."""


class PairDecoding:
    """FidesLLM's decoding methods: options, fallback checks, the batcher, answer cleaning and the signals' report."""

    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return call_options(self, kwargs)

    def _check_fallback(self, pair: PromptPair, options: dict[str, Any]) -> None:
        """Raise under strict mode, else log a warning, when a contrastive method has no context to contrast."""
        requested = options["method"] if isinstance(options["method"], str) else getattr(options["method"], "name", "custom")
        if pair.fallback is None or requested == "standard":
            return
        if options["strict"]:
            raise FidesFallbackError(
                f"strict=True: {pair.fallback}, so method {requested!r} has nothing to contrast. Pass documents=[...], "
                f"give the prompt a non-empty context_str/context_msg, or set strict=False to decode with 'standard' "
                f"(logged and recorded in the response's notes)"
            )
        logger.warning(pair.info["notes"][0])

    @property
    def _batcher(self) -> RequestBatcher:
        """The request batcher every LLM on this decoder shares: concurrent calls decode together."""
        return shared_batcher(self._decoder, max_batch_size=self.max_batch_size, window_s=self.batch_window_s)

    def _decode_args(self, pair: PromptPair, options: dict[str, Any]) -> tuple[tuple[str, str], dict[str, Any]]:
        self._check_fallback(pair, options)
        method = options["method"]
        config = self.effective_fides_config
        rule: Any = get_method(method, config=config) if isinstance(method, str) and accepts_option(method, "config") else method
        if pair.fallback is not None or pair.method is not None:
            rule = pair.method or "standard"
        args = {**decoding_options(options), "method": rule}
        if pair.uses_template:
            stops = list(args["stop"] or [])
            args["stop"] = stops + [s for s in template_stops(self._decoder.prompt_template) if s not in stops]
            return (pair.question or "", pair.documents or []), args
        no_ctx = pair.no_context_prompt if pair.no_context_prompt is not None else pair.context_prompt
        return (pair.context_prompt, no_ctx), args

    def _clean(self, pair: PromptPair, result: GenerationResult) -> GenerationResult:
        """fides-rag's template: drop template leftovers ("Document [2]:") from the answer, with a note."""
        if not pair.uses_template:
            return result
        text, notes = TemplateLeftovers(self._decoder.prompt_template).clean(result.text, truncated=result.finish_reason == "length")
        return dataclasses.replace(result, text=text, notes=[*result.notes, *notes]) if notes else result

    def _report(self, pair: PromptPair, options: dict[str, Any], result: GenerationResult) -> dict[str, Any]:
        requested = options["method"] if isinstance(options["method"], str) else getattr(options["method"], "name", "custom")
        info = {
            **result.to_metadata(),
            "requested_method": requested,
            "notes": list(dict.fromkeys([*pair.info.get("notes", []), *result.notes])),
            "documents_trimmed": bool(pair.info.get("documents_trimmed", False)),
            "document_tokens": pair.info.get("document_tokens"),
            "prompt_type": pair.info.get("prompt_type"),
            "context_variables": pair.info.get("context_variables", []),
            **{k: pair.info[k] for k in PAIR_EXTRAS if k in pair.info},
            "context_prompt": result.context_prompt if pair.uses_template else pair.context_prompt,
            "no_context_prompt": result.no_context_prompt if pair.uses_template else pair.no_context_prompt,
        }
        if pair.uses_template:
            info["documents_trimmed"] = bool(result.documents_trimmed)
            info["document_tokens"] = result.document_tokens
        with self._history_lock:
            self._history.append({"result": result, "info": info})
        return info

    def _generate(self, pair: PromptPair, options: dict[str, Any]) -> CompletionResponse:
        prompts, args = self._decode_args(pair, options)
        if pair.uses_template:
            result = self._clean(pair, self._batcher.generate(*prompts, **args))
        else:
            result = self._batcher.generate(context_prompt=prompts[0], no_context_prompt=prompts[1], untrusted_texts=pair.untrusted, **args)
        info = self._report(pair, options, result)
        return CompletionResponse(text=result.text, raw=_raw(result, info), additional_kwargs=info)

    def _stream(self, pair: PromptPair, options: dict[str, Any]) -> CompletionResponseGen:
        prompts, args = self._decode_args(pair, options)
        if pair.uses_template:
            stream = self._batcher.stream(*prompts, **args)
        else:
            stream = self._batcher.stream(context_prompt=prompts[0], no_context_prompt=prompts[1], untrusted_texts=pair.untrusted, **args)
        leftovers = TemplateLeftovers(self._decoder.prompt_template) if pair.uses_template else None
        raw, text, held = "", "", None  # one delta is held back so that the last response can carry the signals
        try:
            for delta in stream:
                if leftovers is not None:  # stream only what cannot turn out to be a template leftover
                    raw += delta
                    visible = leftovers.visible(raw)
                    if not (len(visible) > len(text + (held or "")) and visible.startswith(text + (held or ""))):
                        continue
                    delta = visible[len(text + (held or "")) :]
                if held is not None:
                    text += held
                    yield CompletionResponse(text=text, delta=held)
                held = delta
        finally:
            stream.close()
        assert stream.result is not None
        result = self._clean(pair, stream.result)
        info = self._report(pair, options, result)
        pending = held or ""
        if result.text.startswith(text + pending) and len(result.text) > len(text + pending):  # a held-back tail
            pending = result.text[len(text) :]
        yield CompletionResponse(text=text + pending, delta=pending, raw=_raw(result, info), additional_kwargs=info)


def _raw(result: GenerationResult, info: dict[str, Any]) -> dict[str, Any]:
    """The result as a dict, with where the documents came from (an agent's final output carries only `raw`)."""
    return {**result.to_dict(), **{k: info[k] for k in PAIR_EXTRAS if k in info}}
