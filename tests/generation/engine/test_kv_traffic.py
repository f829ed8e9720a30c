"""KV traffic per decode step: what a decode step writes by copy, cat and pad kernels (counted by a TorchDispatchMode)
does not grow with the context, for every method and path kind, on full-attention, sliding-window and eager-attention
models: no step rewrites the KV history."""

from __future__ import annotations

import pytest

from fides_rag import FidesDecoder, available_methods, get_method
from fides_rag.eval.step_probe import measure_engine

QUESTION = "What is the capital of France?"
PASSAGE = "Lyon is the capital of France. Paris is a large city on the Seine. "
METHODS = {name: {"decore": dict(heads={1: [0], 3: [1, 2]})}.get(name, {}) for name in available_methods()}


def kv_bytes_per_position(model) -> int:
    config = model.config
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4  # keys and values, float32


def written_per_step(decoder, method, repeats: int) -> tuple[int, int]:
    """(bytes written by copy, cat and pad kernels in the median decode step, context prompt tokens)."""
    example = decoder.prepare(QUESTION, [PASSAGE * repeats, PASSAGE], max_new_tokens=4, document_paths=True)
    measured = measure_engine(decoder, example, method, new_tokens=4, counted=3)
    return measured["traffic_bytes_per_token"]["median"], len(example.context_ids)


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gemma2"])
@pytest.mark.parametrize("name", list(METHODS))
def test_bytes_written_per_decode_step_do_not_grow_with_the_context(tiny_models, tokenizer, family, name, mode):
    model = tiny_models[family]
    if mode == "fast" and family == "gemma2":
        pytest.skip("fast mode refuses soft-capped attention (tested in test_modes.py)")
    decoder = FidesDecoder(model, tokenizer, mode=mode)
    method = get_method(name, **METHODS[name])
    short, short_tokens = written_per_step(decoder, method, 1)
    long, long_tokens = written_per_step(decoder, method, 16)
    assert long_tokens > short_tokens + 400
    # Rewriting the history of even one row would add (long_tokens - short_tokens) positions' keys and values.
    assert long - short < kv_bytes_per_position(model), (short, long)
