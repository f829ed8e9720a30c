"""Forward hooks: captured states are last-position copies (no prefill activation survives), and hooks
remove themselves even when the forward fails."""

from __future__ import annotations

import pytest
import torch

from fides_rag.generation.engine.hooks import HeadMasker, LayerCapture
from fides_rag.generation.engine.kv_cache import RowGroup, left_padded, prefill
from fides_rag.method.lens import ModelAnatomy


def storage_bytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


@pytest.mark.parametrize("split", [True, False])
def test_no_full_sequence_state_survives_the_prefill(tiny_llama, split):
    anatomy = ModelAnatomy.of(tiny_llama)
    groups = [
        RowGroup(*left_padded([list(range(5, 45)), list(range(7, 30))], 0, torch.device("cpu"))),
        RowGroup(*left_padded([list(range(9, 17)), list(range(4, 10))], 0, torch.device("cpu"))),
    ]
    layers = range(1, anatomy.num_layers + 1)
    before = [len(block._forward_hooks) for block in anatomy.layers]
    with torch.inference_mode(), LayerCapture(anatomy, layers) as capture:
        state = prefill(anatomy, groups, capture, None, split)
    hidden = tiny_llama.config.hidden_size
    one_position = 4 * hidden * 4  # 4 rows x H float32
    assert state.last_hidden.shape == (4, hidden) and storage_bytes(state.last_hidden) == one_position
    for layer in layers:
        assert capture.states[layer].shape == (4, hidden)
        assert storage_bytes(capture.states[layer]) == one_position, f"layer {layer} pins more than its last position"
    assert [len(block._forward_hooks) for block in anatomy.layers] == before  # ours removed themselves


def test_hooks_remove_themselves_when_the_forward_fails(tiny_llama):
    anatomy = ModelAnatomy.of(tiny_llama)
    before = [len(block._forward_hooks) for block in anatomy.layers]
    with pytest.raises(RuntimeError, match="boom"), LayerCapture(anatomy, (1, 2)), HeadMasker(anatomy, [{1: (0,)}]):
        assert len(anatomy.layers[0]._forward_hooks) == before[0] + 1
        raise RuntimeError("boom")
    assert [len(block._forward_hooks) for block in anatomy.layers] == before
    assert not any(proj._forward_pre_hooks for proj in anatomy.attention_output_projections())
