"""Dtypes and devices: a bf16 model decodes with float32 signals, and a model dispatched by accelerate
(offload hooks, weights on "meta" until used) decodes exactly like the same model on one device."""

from __future__ import annotations

import copy

import pytest
import torch
from accelerate import cpu_offload

from fides_rag import ContrastRule, FidesDecoder, PromptTemplate, load_model
from fides_rag.rules import StepOutput
from fides_rag.rules.base import CONTEXT, MASKED_HEADS, NO_CONTEXT
from fides_rag.testing import MULTI_DOCUMENT_QUESTIONS, MULTI_DOCUMENTS, build_tiny_model

NO_STOP = PromptTemplate(stop=())


class DtypeProbe(ContrastRule):
    """CAD at a = 1 that records the dtypes its inputs arrive in."""

    name = "dtype-probe"
    paths = (CONTEXT, NO_CONTEXT)
    layer_state_paths = (CONTEXT, NO_CONTEXT)

    def __init__(self) -> None:
        self.dtypes: set[torch.dtype] = set()

    def lens_layers(self, num_layers):
        return (1,)

    def combine(self, step):
        self.dtypes |= {
            step.ctx_logits.dtype,
            step.no_ctx_logits.dtype,
            step.ctx_layer_states.dtype,
            step.lens_logits[1].dtype,
        }
        return StepOutput(logits=2 * step.ctx_logits - step.no_ctx_logits)


class Heads(ContrastRule):
    name = "heads"
    paths = (CONTEXT, MASKED_HEADS)

    def masked_heads(self, model, tokenizer):
        return {1: (0, 2), 3: (1,)}

    def combine(self, step):
        return StepOutput(logits=2 * step.ctx_logits - step.masked_logits)


def test_bf16_standard_equals_generate_and_signals_are_float32(tokenizer):
    model = build_tiny_model("llama", len(tokenizer)).to(torch.bfloat16)
    decoder = FidesDecoder(model, tokenizer, prompt_template=NO_STOP)
    decoder.eos_token_ids = set()
    example = decoder.prepare("What is the capital?", ["Lyon is the capital of France."], 8)
    ids = torch.tensor([example.context_ids])
    expected = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=8,
        eos_token_id=None,
        pad_token_id=0,
    )[0, ids.shape[1] :].tolist()
    assert decoder.generate_batch([example], method="standard", max_new_tokens=8)[0].token_ids == expected
    probe = DtypeProbe()
    decoder.generate_batch([example], method=probe, max_new_tokens=3)
    assert probe.dtypes == {torch.float32}
    fides = decoder.generate_batch([example], method="fides", max_new_tokens=4)[0]
    assert all(isinstance(s.alpha, float) and s.alpha >= 0.1 for s in fides.steps)


@pytest.mark.parametrize("method", ["fides", "dvd", "heads"])
def test_offloaded_model_decodes_like_the_model_on_one_device(tokenizer, method):
    reference = build_tiny_model("llama", len(tokenizer))
    dispatched = cpu_offload(copy.deepcopy(reference), execution_device=torch.device("cpu"))
    assert dispatched.lm_head.weight.device.type == "meta"  # weights arrive through accelerate's hooks
    rule = Heads() if method == "heads" else method
    expected = FidesDecoder(reference, tokenizer, prompt_template=NO_STOP).generate_batch(
        MULTI_DOCUMENT_QUESTIONS, MULTI_DOCUMENTS, method=rule, max_new_tokens=5
    )
    got = FidesDecoder(dispatched, tokenizer, prompt_template=NO_STOP).generate_batch(
        MULTI_DOCUMENT_QUESTIONS, MULTI_DOCUMENTS, method=rule, max_new_tokens=5
    )
    for want, have in zip(expected, got):
        assert have.token_ids == want.token_ids
        for a, b in zip(want.steps, have.steps):
            assert b.values == pytest.approx(a.values, abs=1e-5)


def test_load_model_passes_device_map_through(tmp_path, tokenizer):
    build_tiny_model("llama", len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    device_map = {
        "model.embed_tokens": "cpu",
        "model.layers": "cpu",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "disk",
    }
    model, _ = load_model(tmp_path, device_map=device_map, dtype="float32", offload_folder=str(tmp_path / "offload"))
    assert (
        model.hf_device_map["lm_head"] == "disk" and model.lm_head.weight.device.type == "meta"
    )  # dispatched by accelerate
    plain, _ = load_model(tmp_path, device="cpu", dtype="float32")
    question, documents = MULTI_DOCUMENT_QUESTIONS[0], MULTI_DOCUMENTS[0]
    assert (
        FidesDecoder(model, tokenizer).generate(question, documents, max_new_tokens=4).token_ids
        == FidesDecoder(plain, tokenizer).generate(question, documents, max_new_tokens=4).token_ids
    )
    with pytest.raises(ValueError, match="dtype 'float33' is not a torch dtype"):
        load_model(tmp_path, dtype="float33")
