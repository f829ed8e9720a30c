"""DoLa: bucket mapping, and combine against an independent float64 loop of transformers' algorithm."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import FidesDecoder, get_method
from fides_rag.rules import StepInputs
from fides_rag.rules.dola import DolaRule, dola_candidate_layers
from fides_rag.testing import (
    SAMPLE_DOCUMENTS,
    SAMPLE_QUESTIONS,
    build_tiny_model,
    build_tokenizer,
    reference_log_softmax,
)

QUESTIONS = SAMPLE_QUESTIONS
DOCUMENTS = [*SAMPLE_DOCUMENTS[:2], None]
log_softmax = reference_log_softmax


def reference_step(final, premature, relative_top=0.1, keep=1):
    """One row, hand-rolled: transformers' js statistic (KL(M||.) averaged over V), argmax, relative-top."""
    lf = log_softmax(final)
    best_layer, best_js = None, -1.0
    for layer, logits in premature.items():
        lp = log_softmax(logits)
        mix = [0.5 * (math.exp(a) + math.exp(b)) for a, b in zip(lf, lp)]
        kl1 = sum(m * (math.log(m) - a) for m, a in zip(mix, lf)) / len(mix)
        kl2 = sum(m * (math.log(m) - b) for m, b in zip(mix, lp)) / len(mix)
        js = 0.5 * (kl1 + kl2)
        if js > best_js:
            best_layer, best_js = layer, js
    lb = log_softmax(premature[best_layer])
    thresh = min(sorted(lf, reverse=True)[keep - 1], max(lf) + math.log(relative_top))
    out = [a - b if a >= thresh else -math.inf for a, b in zip(lf, lb)]
    return best_layer, best_js, out


def make_step(layers, batch=4, vocab=13, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return StepInputs.from_tensors(
        ctx_logits=torch.randn(batch, vocab, generator=gen, dtype=torch.float64) * 3,
        no_ctx_logits=None,
        lens_logits={layer: torch.randn(batch, vocab, generator=gen, dtype=torch.float64) * 3 for layer in layers},
        num_layers=8,
    )


@pytest.mark.parametrize("relative_top, keep", [(0.1, 1), (0.3, 1), (0.01, 4), (0.5, 6)])
def test_dola_matches_hand_loop(relative_top, keep):
    rule = DolaRule(layers=[1, 3, 5], relative_top=relative_top, min_tokens_to_keep=keep)
    assert rule.needs_no_context is False and rule.lens_layers(8) == (1, 3, 5)
    step = make_step((1, 3, 5))
    out = rule.combine(step)
    chosen_layers = set()
    for b in range(4):
        layer, js, want = reference_step(
            step.ctx_logits[b].tolist(),
            {layer: step.lens_logits[layer][b].tolist() for layer in (1, 3, 5)},
            relative_top,
            keep,
        )
        chosen_layers.add(layer)
        got = out.logits[b].tolist()
        assert [math.isinf(v) for v in got] == [math.isinf(v) for v in want]
        assert sum(not math.isinf(v) for v in got) >= keep
        assert [v for v in got if not math.isinf(v)] == pytest.approx([v for v in want if not math.isinf(v)], abs=1e-12)
        assert out.records.get("layer_jsd")[b].item() == pytest.approx(js, abs=1e-12)
    assert out.records.get("alpha") is None
    assert len(chosen_layers) > 1  # the choice really is per row


def test_dola_single_candidate_and_no_filter():
    step = make_step((2,))
    out = DolaRule(layers=[2], relative_top=0.0).combine(step)
    want = torch.log_softmax(step.ctx_logits, -1) - torch.log_softmax(step.lens_logits[2], -1)
    assert torch.allclose(out.logits, want, atol=1e-12)


def test_dola_buckets_follow_transformers():
    # hidden_states index i >= 1 is block i; L <= 40: high = range(L//2, L, 2), low = range(0, L//2, 2) minus 0
    assert dola_candidate_layers(32, "high") == tuple(range(16, 32, 2))
    assert dola_candidate_layers(32, "low") == tuple(range(2, 16, 2))
    assert dola_candidate_layers(30, "high") == (15, 17, 19, 21, 23, 25, 27, 29)
    assert dola_candidate_layers(30, "low") == (2, 4, 6, 8, 10, 12, 14)
    assert dola_candidate_layers(18, "high") == (9, 11, 13, 15, 17)
    assert dola_candidate_layers(18, "low") == (2, 4, 6, 8)
    # L > 40: high = range(L-20, L, 2), low = range(0, 20, 2) minus 0
    assert dola_candidate_layers(80, "high") == tuple(range(60, 80, 2))
    assert dola_candidate_layers(80, "low") == tuple(range(2, 20, 2))
    # shallow models: transformers' tied-embedding branch (start 2, or 1 for L == 2), never the embedding
    assert dola_candidate_layers(4, "low") == (2,)
    assert dola_candidate_layers(4, "high") == (2,)
    assert dola_candidate_layers(5, "low") == (2,)
    assert dola_candidate_layers(3, "low") == (1,)
    assert dola_candidate_layers(2, "low") == (1,) == dola_candidate_layers(2, "high")
    assert dola_candidate_layers(6, [1, 5]) == (1, 5)
    for num_layers in range(2, 90):
        for bucket in ("low", "high"):
            layers = dola_candidate_layers(num_layers, bucket)
            assert layers and all(1 <= layer < num_layers for layer in layers)
    with pytest.raises(ValueError, match="at least 2 layers"):
        dola_candidate_layers(1, "high")
    with pytest.raises(ValueError, match="layers \\[6\\] are not premature"):
        DolaRule(layers=[2, 6]).lens_layers(6)


def test_dola_options_validated():
    assert get_method("dola").options() == {"layers": "high", "relative_top": 0.1, "min_tokens_to_keep": 1}
    assert get_method("dola", layers=(3, 1)).options()["layers"] == [3, 1]
    for bad in ("middle", [], [0], [1.5], [2, 2], 3):
        with pytest.raises(ValueError, match="dola: layers"):
            get_method("dola", layers=bad)
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="dola: relative_top"):
            get_method("dola", relative_top=bad)
    with pytest.raises(ValueError, match="dola: min_tokens_to_keep"):
        get_method("dola", min_tokens_to_keep=0)


@pytest.fixture(scope="module")
def decoder():
    tok = build_tokenizer()
    return FidesDecoder(build_tiny_model("llama", len(tok)), tok)


@pytest.mark.parametrize("rule", [DolaRule(), DolaRule(layers=[1, 2, 3])])
def test_dola_batch_equals_single(decoder, rule):
    batch = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=rule, max_new_tokens=6, stop=[])
    for question, docs, batched in zip(QUESTIONS, DOCUMENTS, batch):
        single = decoder.generate(question, docs, method=rule, max_new_tokens=6, stop=[])
        assert batched.token_ids == single.token_ids
        assert batched.method == ("dola" if docs else "standard")  # no documents: the decoder falls back
        if docs:
            assert batched.no_context_prompt is None
            assert all(s.values.get("layer_jsd") is not None and "alpha" not in s.values for s in batched.steps)
            assert [s.values.get("layer_jsd") for s in batched.steps] == pytest.approx(
                [s.values.get("layer_jsd") for s in single.steps], abs=1e-5
            )
