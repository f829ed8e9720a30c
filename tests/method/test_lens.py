"""The logit lens at the last layer must reproduce each supported family's own logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from fides_rag import UnsupportedArchitectureError
from fides_rag.method.lens import SUPPORTED_FAMILIES, ModelAnatomy
from fides_rag.testing import FAMILIES


def test_every_supported_family_is_tested():
    assert set(FAMILIES) == set(SUPPORTED_FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_lens_at_last_layer_reproduces_model_logits(tiny_models, family):
    model = tiny_models[family]
    anatomy = ModelAnatomy.of(model)
    captured = {}
    handle = anatomy.layers[-1].register_forward_hook(
        lambda m, i, o: captured.__setitem__("h", o[0] if isinstance(o, tuple) else o)
    )
    ids = torch.randint(3, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    handle.remove()
    lens = anatomy.lens_logits(captured["h"])
    torch.testing.assert_close(lens, logits, rtol=1e-5, atol=1e-5)
    if family in ("gemma2", "gemma3_text") and anatomy.softcap:
        assert logits.abs().max() <= anatomy.softcap


def test_gemma2_softcap_is_applied(tiny_models):
    anatomy = ModelAnatomy.of(tiny_models["gemma2"])
    assert anatomy.softcap == 3.0


def test_unsupported_architecture_is_refused():
    model = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedArchitectureError, match="unsupported architecture 'gpt2'"):
        ModelAnatomy.of(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_heads_and_output_projections(tiny_models, family):
    """Every family exposes num_heads x head_dim as the input width of each block's o_proj."""
    anatomy = ModelAnatomy.of(tiny_models[family])
    assert (anatomy.num_heads, anatomy.head_dim) == (4, 8)
    projections = anatomy.attention_output_projections()
    assert len(projections) == anatomy.num_layers
    assert all(p is layer.self_attn.o_proj and p.in_features == 32 for p, layer in zip(projections, anatomy.layers))


def test_check_heads(tiny_llama):
    anatomy = ModelAnatomy.of(tiny_llama)
    assert anatomy.check_heads({3: [2, 0, 2], 1: (1,), 2: []}, "x") == {1: (1,), 3: (0, 2)}
    assert anatomy.check_heads({}, "x") == {}
    with pytest.raises(ValueError, match="x: masked-heads layer 5 is not a block of this 4-layer model"):
        anatomy.check_heads({5: [0]}, "x")
    with pytest.raises(ValueError, match=r"x: heads \[4\] of layer 2 are not heads of this model"):
        anatomy.check_heads({2: [0, 4]}, "x")
    with pytest.raises(ValueError, match="x: masked heads must be a mapping"):
        anatomy.check_heads([1, 2], "x")


def test_output_projection_of_the_wrong_width_is_refused(tokenizer):
    from fides_rag.testing import build_tiny_model

    model = build_tiny_model("llama", len(tokenizer))
    model.model.layers[0].self_attn.o_proj = torch.nn.Linear(16, 32)
    with pytest.raises(
        UnsupportedArchitectureError,
        match="block 1 has no self_attn.o_proj linear layer over num_heads x head_dim = 4 x 8",
    ):
        ModelAnatomy.of(model).attention_output_projections()


def test_head_logits_of_several_rows_equal_the_head_module_and_hooked_heads_run_as_modules(tiny_models):
    anatomy = ModelAnatomy.of(tiny_models["llama"])
    states = torch.randn(3, anatomy.head.in_features, dtype=anatomy.head.weight.dtype)
    with torch.no_grad():
        for rows in (2, 3, 4, 5):  # 3 rows are padded to 4 for MKL: the pad row must not show
            many = torch.randn(rows, anatomy.head.in_features, dtype=anatomy.head.weight.dtype)
            logits = anatomy.head_logits(many)
            assert logits.shape == (rows, anatomy.head.out_features) and logits.is_contiguous()
            torch.testing.assert_close(logits, anatomy.head(many), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(anatomy.head_logits(states[:1]), anatomy.head(states[:1]), rtol=0, atol=0)
        calls = []
        handle = anatomy.head.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
        try:
            anatomy.head_logits(states)
        finally:
            handle.remove()
    assert calls == [torch.Size([3, anatomy.head.in_features])]
