"""The logit lens at the last layer must reproduce each supported family's own logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from fides_rag import UnsupportedArchitectureError
from fides_rag.lens import SUPPORTED_FAMILIES, ModelAnatomy

from fides_rag.testing import FAMILIES


def test_every_supported_family_is_tested():
    assert set(FAMILIES) == set(SUPPORTED_FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_lens_at_last_layer_reproduces_model_logits(tiny_models, family):
    model = tiny_models[family]
    anatomy = ModelAnatomy.of(model)
    captured = {}
    handle = anatomy.layers[-1].register_forward_hook(lambda m, i, o: captured.__setitem__("h", o[0] if isinstance(o, tuple) else o))
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
