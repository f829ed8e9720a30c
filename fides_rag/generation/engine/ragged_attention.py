"""Attention over a ragged KV cache, one segment at a time, through transformers' attention interface.

A `RaggedLayer` holds each group of rows (a segment: the context rows, the no-context rows, ...) at its own length.
Padding the segments into one tensor for every layer's attention call rewrote the whole KV cache at every decode
step. Under `per_segment_attention(model)`, a ragged layer's update hands its segments to the attention function
registered here instead, which runs the model's own attention (SDPA or eager) on each segment's rows with that
segment's keys and values (views of the cache, appended in place) and the matching last columns of the mask: the
columns the padded call held for that segment. The other columns were padding, hidden by the mask. Only the
attention output, [R, q, heads, d], is written.

Models whose attention is neither SDPA nor eager (flash, flex, paged kernels) keep the padded call.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from fides_rag.generation.engine.attention.implementation import attention_implementation

PREFIX = "fides_segments_"
"""Registered implementation names: PREFIX + the model's own ("sdpa" or "eager")."""
_LOCAL = threading.local()


def _own_attention(kind: str, module: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, Any]]:
    """The attention function `module` runs under implementation `kind` (eager: its modeling file's own)."""
    if kind == "sdpa":
        return sdpa_attention_forward
    return sys.modules[type(module).__module__].eager_attention_forward


def _segments_attention(kind: str) -> Callable[..., tuple[torch.Tensor, None]]:
    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        own = _own_attention(kind, module)
        segments = getattr(_LOCAL, "segments", None)
        if segments is None:  # not a ragged layer with several segments (a prefill, one segment, another thread)
            return own(module, query, key, value, attention_mask, **kwargs)
        _LOCAL.segments = None
        outputs, at = [], 0
        for keys, values in segments:  # keys, values: [rows, kv_heads, T_s, d]
            rows, length = keys.shape[0], keys.shape[-2]
            mask = (
                None
                if attention_mask is None
                else attention_mask[at : at + rows, ..., attention_mask.shape[-1] - length :]
            )
            out, _ = own(module, query[at : at + rows], keys, values, mask, **kwargs)
            outputs.append(out)  # [rows, q, heads, d]
            at += rows
        return torch.cat(outputs), None

    return attention


for _kind, _mask in (("sdpa", sdpa_mask), ("eager", eager_mask)):
    AttentionInterface.register(PREFIX + _kind, _segments_attention(_kind))
    AttentionMaskInterface.register(PREFIX + _kind, _mask)


def hand_over(segments: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Called by a ragged layer's update: whether the attention call that follows takes `segments` ([rows, kv_heads,
    T_s, d] keys and values each) as they are (under `per_segment_attention` on this thread), so that the layer
    need not pad them into one tensor."""
    if not getattr(_LOCAL, "active", False):
        return False
    _LOCAL.segments = segments
    return True


@contextlib.contextmanager
def per_segment_attention(model: Any) -> Iterator[None]:
    """Within it, on this thread, the ragged cache layers of `model` are attended one segment at a time (models whose
    attention is SDPA or eager; others keep the padded call). Hold the model's lock: it switches the model's
    attention implementation for the duration (other threads' calls run the model's own attention through it)."""
    config = model.config
    kind = config._attn_implementation
    if kind not in ("sdpa", "eager") or getattr(_LOCAL, "active", False):
        yield
        return
    _LOCAL.active, _LOCAL.segments = True, None
    try:
        with attention_implementation(config, PREFIX + kind):
            yield
    finally:
        _LOCAL.active, _LOCAL.segments = False, None
