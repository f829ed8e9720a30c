"""DeCoRe: combine against a float64 hand loop of the reference, options, head resolution, end to end."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import FidesDecoder, get_method
from fides_rag.method.heads import DiscoverySettings, retrieval_heads
from fides_rag.rules import StepInputs
from fides_rag.rules.decore import DecoreRule, default_num_heads
from fides_rag.testing import build_tiny_model, build_tokenizer

QUESTIONS = ["What is the capital of France?", "Which city is the capital of Australia?"]
DOCUMENTS = [["Lyon is the capital of France."], ["The capital of Australia is Melbourne."]]
DISCOVERY = dict(num_samples=4, context_length=40, needle_length=8, cue_length=3, min_copy_rate=0.0)


def reference_alpha(base, scale=False, cap=None):
    """The reference's _calculate_entropy, then its cap, on one row."""
    m = max(base)
    e = [math.exp(v - m) for v in base]
    p = [x / sum(e) for x in e]
    alpha = -sum(q * math.log(q + 1e-12) for q in p)
    if scale:
        alpha /= math.log(len(base))
    if cap:
        alpha = min(alpha, cap)
    return alpha


def make_step(batch=4, vocab=13, seed=0):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(batch, vocab, generator=gen, dtype=torch.float64) * 3
    base[0] *= 0.05  # a flat row: entropy near log V
    return StepInputs.from_tensors(
        ctx_logits=base,
        no_ctx_logits=None,
        masked_logits=torch.randn(batch, vocab, generator=gen, dtype=torch.float64) * 3,
    )


@pytest.mark.parametrize("scale, cap", [(False, None), (True, None), (False, 1.0), (True, 0.5)])
def test_entropy_variant_matches_hand_loop(scale, cap):
    step = make_step()
    out = DecoreRule(scale_alpha=scale, alpha_cap=cap).combine(step)
    for b in range(4):
        base, masked = step.ctx_logits[b].tolist(), step.masked_logits[b].tolist()
        alpha = reference_alpha(base, scale, cap)
        assert out.records.get("alpha")[b].item() == pytest.approx(alpha, abs=1e-12)
        want = [(1 + alpha) * x - alpha * y for x, y in zip(base, masked)]
        assert out.logits[b].tolist() == pytest.approx(want, abs=1e-10)
    if cap is not None:
        assert out.records.get("alpha").max().item() == pytest.approx(cap, abs=1e-12)  # the flat row is capped
    assert out.records.get("opposition") is None and out.records.get("score") is None


def test_vanilla_variant_and_alpha_zero():
    step = make_step()
    out = DecoreRule(variant="vanilla", alpha=0.7).combine(step)
    assert torch.allclose(out.logits, 1.7 * step.ctx_logits - 0.7 * step.masked_logits, atol=1e-12)
    assert out.records.get("alpha").tolist() == [0.7] * 4
    assert DecoreRule(variant="vanilla").alpha == 0.5  # the reference's default
    assert torch.equal(DecoreRule(variant="vanilla", alpha=0).combine(step).logits, step.ctx_logits)


@pytest.mark.parametrize("rule", [DecoreRule(), DecoreRule(alpha_cap=0.8), DecoreRule(variant="vanilla")])
def test_combine_batch_equals_single(rule):
    step = make_step(batch=5)
    batched = rule.combine(step)
    for b in range(5):
        single = rule.combine(
            StepInputs.from_tensors(
                ctx_logits=step.ctx_logits[b : b + 1], no_ctx_logits=None, masked_logits=step.masked_logits[b : b + 1]
            )
        )
        assert torch.equal(single.logits[0], batched.logits[b]) and torch.equal(
            single.records.get("alpha")[0], batched.records.get("alpha")[b]
        )


def test_combine_needs_the_masked_path():
    with pytest.raises(RuntimeError, match="no masked_logits"):
        DecoreRule().combine(StepInputs.from_tensors(ctx_logits=torch.zeros(1, 3), no_ctx_logits=None))


def test_options_and_defaults():
    rule = get_method("decore")
    assert isinstance(rule, DecoreRule) and rule.needs_no_context is False and rule.name == "decore"
    assert rule.options() == {
        "variant": "entropy",
        "alpha_cap": None,
        "scale_alpha": False,
        "num_heads": "auto (50/1024 of the heads)",
        "discovery": DiscoverySettings().to_dict(),
    }
    explicit = get_method("decore", variant="vanilla", alpha=1, heads={"3": [2, 0], 1: (1,)})
    assert explicit.options() == {"variant": "vanilla", "alpha": 1.0, "heads": {1: [1], 3: [0, 2]}}
    assert get_method("decore", discovery={"seed": 3}).discovery == DiscoverySettings(seed=3)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(variant="static"), "variant must be"),
        (dict(alpha=0.5), "alpha is the fixed strength"),
        (dict(variant="vanilla", alpha=-1), "alpha must be a finite number"),
        (dict(variant="vanilla", alpha=float("inf")), "alpha must be a finite number"),
        (dict(variant="vanilla", alpha_cap=1.0), "alpha_cap and scale_alpha"),
        (dict(variant="vanilla", scale_alpha=True), "alpha_cap and scale_alpha"),
        (dict(alpha_cap=0), "alpha_cap must be None"),
        (dict(alpha_cap=float("nan")), "alpha_cap must be None"),
        (dict(scale_alpha=1), "scale_alpha must be True or False"),
        (dict(num_heads=0), "num_heads must be an integer >= 1"),
        (dict(num_heads=2.5), "num_heads must be an integer >= 1"),
        (dict(heads={}), "heads must be a non-empty mapping"),
        (dict(heads=[(1, 2)]), "heads must be a non-empty mapping"),
        (dict(heads={0: [1]}), "1-based layer numbers"),
        (dict(heads={"x": [1]}), "1-based layer numbers"),
        (dict(heads={1: [1], "1": [2]}), "names layer 1 twice"),
        (dict(heads={1: []}), "non-empty list of head indices"),
        (dict(heads={1: [-1]}), "non-empty list of head indices"),
        (dict(heads={1: [True]}), "non-empty list of head indices"),
        (dict(heads={1: 3}), "must be a list of head indices"),
        (dict(heads={1: [2, 2]}), "repeats a head index"),
        (dict(heads={1: [0]}, num_heads=4), "not both"),
        (dict(heads={1: [0]}, discovery={"seed": 1}), "not both"),
        (dict(discovery={"needles": 3}), "bad discovery settings"),
        (dict(discovery={"min_copy_rate": 2}), "min_copy_rate must be"),
        (dict(discovery=[1]), "discovery must be a mapping"),
    ],
)
def test_options_validated(options, message):
    with pytest.raises(ValueError, match=message):
        get_method("decore", **options)


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return build_tiny_model("llama", len(tok)), tok


def test_masked_heads_explicit_checked_against_the_model(tiny):
    model, tok = tiny
    assert DecoreRule(heads={4: [3], 2: [0, 1]}).masked_heads(model, tok) == {2: (0, 1), 4: (3,)}
    with pytest.raises(ValueError, match=r"layers \[5\] but the model has 4"):
        DecoreRule(heads={5: [0]}).masked_heads(model, tok)
    with pytest.raises(ValueError, match=r"head indices \{2: \[4\]\} out of range: the model has 4 heads"):
        DecoreRule(heads={2: [1, 4]}).masked_heads(model, tok)
    with pytest.raises(ValueError, match="num_heads=17 but the model has only 16 attention heads"):
        DecoreRule(num_heads=17).masked_heads(model, tok)


def test_default_head_count_is_the_reference_share():
    assert [default_num_heads(n) for n in (1024, 270, 72, 16, 1)] == [50, 14, 4, 1, 1]


def test_masked_heads_discovered_and_cached(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("FIDES_RAG_CACHE", str(tmp_path))
    model, tok = tiny
    rule = DecoreRule(num_heads=5, discovery=DISCOVERY)
    heads = rule.masked_heads(model, tok)
    assert heads == retrieval_heads(model, tok, 5, DiscoverySettings(**DISCOVERY))
    assert sum(len(h) for h in heads.values()) == 5 and len(list((tmp_path / "retrieval_heads").glob("*.json"))) == 1


# -- end to end (needs the decoder's masked-heads path) ------------------------------------------------


@pytest.fixture(scope="module")
def decoder(tiny):
    model, tok = tiny
    return FidesDecoder(model, tok)


def test_decore_generates(decoder):
    rule = DecoreRule(heads={1: [0, 2], 3: [1]})
    result = decoder.generate(QUESTIONS[0], DOCUMENTS[0], method=rule, max_new_tokens=6, stop=[])
    assert result.method == "decore" and result.no_context_prompt is None and len(result.token_ids) == 6
    assert all(s.alpha is not None and s.alpha >= 0 for s in result.steps)


def test_decore_by_name_with_discovered_heads(decoder, tmp_path, monkeypatch):
    monkeypatch.setenv("FIDES_RAG_CACHE", str(tmp_path))
    rule = get_method("decore", num_heads=4, discovery=DISCOVERY)
    result = decoder.generate(QUESTIONS[0], DOCUMENTS[0], method=rule, max_new_tokens=4, stop=[])
    assert result.method == "decore" and result.method_options["num_heads"] == 4


def test_decore_alpha_zero_is_standard(decoder):
    rule = DecoreRule(variant="vanilla", alpha=0.0, heads={2: [0, 1, 2, 3]})
    for question, docs in zip(QUESTIONS, DOCUMENTS):
        got = decoder.generate(question, docs, method=rule, max_new_tokens=6, stop=[])
        want = decoder.generate(question, docs, method="standard", max_new_tokens=6, stop=[])
        assert got.token_ids == want.token_ids


def test_decore_masking_changes_the_output_and_batch_equals_single(decoder):
    rule = DecoreRule(variant="vanilla", alpha=5.0, heads={layer: [0, 1, 2, 3] for layer in (1, 2, 3, 4)})
    batch = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=rule, max_new_tokens=6, stop=[])
    standard = decoder.generate_batch(QUESTIONS, DOCUMENTS, method="standard", max_new_tokens=6, stop=[])
    assert [r.token_ids for r in batch] != [r.token_ids for r in standard]  # every head masked: a different model
    for question, docs, batched in zip(QUESTIONS, DOCUMENTS, batch):
        single = decoder.generate(question, docs, method=rule, max_new_tokens=6, stop=[])
        assert batched.token_ids == single.token_ids
