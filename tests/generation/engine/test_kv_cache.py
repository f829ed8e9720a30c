"""The ragged KV cache: each path's rows at their own length, through prefill, decode steps and pruning,
with the attention seeing exactly what a padded cache would give."""

from __future__ import annotations

import contextlib

import pytest
import torch

from fides_rag.generation.engine.hooks import LayerCapture
from fides_rag.generation.engine.kv_cache import RowGroup, cache_bytes, left_padded, prefill, prompt_cache_bytes, prune
from fides_rag.generation.engine.ragged_attention import per_segment_attention
from fides_rag.method.lens import ModelAnatomy

CONTEXT = list(range(5, 165))  # 160 tokens: documents and question
NO_CONTEXT = list(range(7, 27))  # 20 tokens: the question alone


def bytes_per_token(model) -> int:
    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * 4  # keys and values, float32


def decode_steps(anatomy, state, steps: int):
    """Append `steps` tokens to every row through the backbone, as the decoder does."""
    cache, mask, positions = state.cache, state.attention_mask, state.positions
    rows = mask.shape[0]
    outputs = []
    for step in range(steps):
        mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=-1)
        positions = positions[:, -1:] + 1
        ids = torch.full((rows, 1), 11 + step)
        hidden, cache = anatomy.run_backbone(ids, mask, positions, cache)
        outputs.append(hidden[:, -1])
    return outputs


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_fides_cache_holds_no_padding_and_standard_does_not_grow(tiny_models, family):
    model = tiny_models[family]
    anatomy = ModelAnatomy.of(model)
    per_token = bytes_per_token(model)
    standard = prompt_cache_bytes(anatomy, [[CONTEXT]], 0)
    fides = prompt_cache_bytes(anatomy, [[CONTEXT], [NO_CONTEXT]], 0)
    window = getattr(model.config, "sliding_window", None)
    if window is None:  # every layer keeps every position
        assert standard == per_token * len(CONTEXT)
        assert fides <= 1.1 * per_token * (len(CONTEXT) + len(NO_CONTEXT))
    question_alone = prompt_cache_bytes(anatomy, [[NO_CONTEXT]], 0)
    assert fides == standard + question_alone  # each path holds exactly its own tokens (1.0x, sliding windows too)
    padded = prompt_cache_bytes(anatomy, [[CONTEXT], [NO_CONTEXT]], 0, split=False)  # one jointly padded forward
    assert fides < padded


@pytest.mark.parametrize("per_segment", [False, True], ids=["padded-attention-call", "attention-per-segment"])
@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3_text"])
def test_ragged_decode_equals_padded_decode_and_stays_ragged(tiny_models, family, per_segment):
    """Decode steps over the ragged cache give the states of the jointly padded cache, hold only real
    tokens, and keep doing so after pruning rows (with repeats, as several methods share a prefill); whether the
    attention call takes the segments padded into one tensor or one at a time (SDPA and eager attention)."""
    anatomy = ModelAnatomy.of(tiny_models[family])
    groups = [
        RowGroup(*left_padded([CONTEXT, CONTEXT[:90]], 0, torch.device("cpu"))),
        RowGroup(*left_padded([NO_CONTEXT], 0, torch.device("cpu"))),
    ]
    attention = per_segment_attention(anatomy.backbone) if per_segment else contextlib.nullcontext()
    with torch.inference_mode(), LayerCapture(anatomy, ()) as capture, attention:
        ragged = prefill(anatomy, groups, capture, None, split=True)
        padded = prefill(anatomy, groups, capture, None, split=False)
        before = cache_bytes(ragged.cache)
        for got, want in zip(decode_steps(anatomy, ragged, 3), decode_steps(anatomy, padded, 3)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        grown = cache_bytes(ragged.cache)
        assert grown < cache_bytes(padded.cache)
        if getattr(tiny_models[family].config, "sliding_window", None) is None:
            per_row_token = before // (2 * 160 + 20)  # the two context rows share one segment, padded to 160
            assert before == per_row_token * (2 * 160 + 20)  # nothing but the prompts' tokens after prefill
            spare = lambda n: n + max(16, n // 16)  # noqa: E731 - room a segment grows by at most
            assert grown <= per_row_token * (2 * spare(163) + spare(23))  # the new tokens and bounded room only
        keep = [2, 0, 2, 1]  # reorder, repeat and drop rows across segments
        ragged.attention_mask, ragged.positions = prune(ragged.cache, ragged.attention_mask, ragged.positions, keep)
        padded.attention_mask, padded.positions = prune(padded.cache, padded.attention_mask, padded.positions, keep)
        for got, want in zip(decode_steps(anatomy, ragged, 2), decode_steps(anatomy, padded, 2)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
