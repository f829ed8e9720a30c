"""CoCoA against a float64 hand computation of infusion-zero-edit/CoCoA's decode step."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import FidesDecoder, get_method
from fides_rag.rules import StepInputs
from fides_rag.rules.cocoa import CocoaRule
from fides_rag.testing import (
    SAMPLE_DOCUMENTS,
    SAMPLE_QUESTIONS,
    build_tiny_model,
    build_tokenizer,
    reference_log_softmax,
)

QUESTIONS, DOCUMENTS = SAMPLE_QUESTIONS, SAMPLE_DOCUMENTS
log_softmax = reference_log_softmax


def lower_median(xs):
    return sorted(xs)[(len(xs) - 1) // 2]


def reference_row(
    ctx,
    no,
    alpha=0.5,
    gamma=1.0,
    kappa_h2=0.0,
    lambda_pm=100.0,
    eps0=0.05,
    kappa_s=1.0,
    eps_max=0.2,
    lambda2=0.1,
    kappa_min=1e-4,
):
    lc, lp = log_softmax(ctx), log_softmax(no)
    pc, pp = [math.exp(v) for v in lc], [math.exp(v) for v in lp]
    dh = -sum(p * logp for p, logp in zip(pp, lp)) + sum(p * logp for p, logp in zip(pc, lc))
    if alpha == "adaptive":
        d2 = 1 - sum(q / p for q, p in zip(pp, pc))
        d2n = min(1.0, max(0.0, d2 / (1 + d2)))
        alpha = min(0.9, max(0.1, 1 / (1 + math.exp(-(gamma * dh + gamma * d2n)))))
    delta = [c - p for c, p in zip(lc, lp)]
    s = [alpha * c + (1 - alpha) * p + gamma * d for c, p, d in zip(lc, lp, delta)]
    if kappa_h2:
        q = [math.exp(v) for v in log_softmax(s)]
        h2 = 1 - sum(v * v for v in q)
        s = [v + kappa_h2 * min(1.0, max(0.0, h2 / (1 + h2))) * d for v, d in zip(s, delta)]
    med = lower_median(s)
    mad = lower_median([abs(v - med) for v in s]) + 1e-8
    s = [v + lambda_pm * min(100.0, max(-100.0, (v - med) / mad)) for v in s]
    eps = min(eps_max, max(0.0, eps0 * math.exp(-kappa_s * dh)))
    q = [math.exp(v) for v in log_softmax(s)]
    out = [math.log((1 - eps) * v + eps / len(s) + 1e-12) / (1 + 2 * lambda2) for v in q]
    floor = math.log(kappa_min) if kappa_min > 0 else -math.inf
    return [max(v, floor) for v in out], alpha, dh


@pytest.fixture
def rows():
    gen = torch.Generator().manual_seed(3)
    ctx = torch.randn(5, 12, generator=gen, dtype=torch.float64) * 2
    no = torch.randn(5, 12, generator=gen, dtype=torch.float64) * 2
    return ctx, no


def test_cocoa_defaults_reduce_to_fixed_contrast(rows):
    """Shipped a = 0.5 (hard-coded), γ = 1: S = 1.5·log p_ctx − 0.5·log p_noctx before the monotone shaping."""
    ctx, no = rows
    rule = CocoaRule()
    assert rule.options() == {
        "alpha": 0.5,
        "gamma": 1.0,
        "kappa_h2": 0.0,
        "lambda_pm": 100.0,
        "eps0": 0.05,
        "kappa_s": 1.0,
        "eps_max": 0.2,
        "lambda2": 0.1,
        "kappa_min": 1e-4,
    }
    fixed = 1.5 * torch.log_softmax(ctx, -1) - 0.5 * torch.log_softmax(no, -1)
    out = rule.combine(StepInputs.from_tensors(ctx_logits=ctx, no_ctx_logits=no))
    assert torch.equal(out.logits.argmax(-1), fixed.argmax(-1))
    assert out.records.get("alpha").tolist() == [0.5] * 5
    # with the amplifier and safeguards switched off, the scores are exactly log softmax(1.5 lc − 0.5 lp) (+1e-12)
    plain = CocoaRule(lambda_pm=0, eps0=0, lambda2=0, kappa_min=0).combine(
        StepInputs.from_tensors(ctx_logits=ctx, no_ctx_logits=no)
    )
    assert torch.allclose(plain.logits.exp() - 1e-12, torch.softmax(fixed, -1), atol=1e-14)
    # and the shaping keeps the order of every token, not just the top one, on these rows
    gen = torch.Generator().manual_seed(7)
    for _ in range(20):
        c, n = (
            torch.randn(3, 40, generator=gen, dtype=torch.float64) * 3,
            torch.randn(3, 40, generator=gen, dtype=torch.float64) * 3,
        )
        f = 1.5 * torch.log_softmax(c, -1) - 0.5 * torch.log_softmax(n, -1)
        assert torch.equal(
            rule.combine(StepInputs.from_tensors(ctx_logits=c, no_ctx_logits=n)).logits.argmax(-1), f.argmax(-1)
        )


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"alpha": 0.3, "gamma": 2.0},
        {"alpha": "adaptive"},
        {
            "alpha": 0.8,
            "gamma": 0.5,
            "kappa_h2": 0.5,
            "lambda_pm": 3.0,
            "eps0": 0.1,
            "kappa_s": 0.5,
            "eps_max": 0.15,
            "lambda2": 0.3,
            "kappa_min": 1e-3,
        },
    ],
)
def test_cocoa_hand_computation(rows, options):
    ctx, no = rows
    out = CocoaRule(**options).combine(StepInputs.from_tensors(ctx_logits=ctx, no_ctx_logits=no))
    for b in range(5):
        want, alpha, dh = reference_row(ctx[b].tolist(), no[b].tolist(), **options)
        assert out.logits[b].tolist() == pytest.approx(want, abs=1e-9)
        assert out.records.get("alpha")[b].item() == pytest.approx(alpha, abs=1e-12)
        assert out.records.get("entropy_gap")[b].item() == pytest.approx(dh, abs=1e-12)


def test_cocoa_non_default_without_shaping_is_hand_contrast(rows):
    """a = 0.3, γ = 2: S = (a + γ)·lc + (1 − a − γ)·lp = 2.3·lc − 1.3·lp."""
    ctx, no = rows
    rule = CocoaRule(alpha=0.3, gamma=2.0, lambda_pm=0, eps0=0, lambda2=0, kappa_min=0)
    out = rule.combine(StepInputs.from_tensors(ctx_logits=ctx, no_ctx_logits=no))
    for b in range(5):
        s = [2.3 * c - 1.3 * p for c, p in zip(log_softmax(ctx[b].tolist()), log_softmax(no[b].tolist()))]
        want = [math.log(math.exp(v) + 1e-12) for v in log_softmax(s)]
        assert out.logits[b].tolist() == pytest.approx(want, abs=1e-12)


def test_cocoa_options_validated():
    for name, bad in [
        ("alpha", 1.5),
        ("alpha", "auto"),
        ("gamma", -1),
        ("lambda_pm", float("nan")),
        ("eps_max", 2.0),
        ("kappa_min", 2.0),
        ("lambda2", True),
    ]:
        with pytest.raises(ValueError, match=f"cocoa: {name}"):
            get_method("cocoa", **{name: bad})
    assert get_method("cocoa", alpha="adaptive").options()["alpha"] == "adaptive"


@pytest.mark.parametrize("alpha", [0.5, "adaptive"])
def test_cocoa_batch_equals_single(alpha):
    tok = build_tokenizer()
    decoder = FidesDecoder(build_tiny_model("llama", len(tok)), tok)
    rule = CocoaRule(alpha=alpha)
    batch = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=rule, max_new_tokens=6, stop=[])
    for question, docs, batched in zip(QUESTIONS, DOCUMENTS, batch):
        single = decoder.generate(question, docs, method=rule, max_new_tokens=6, stop=[])
        assert batched.method == "cocoa"
        assert batched.token_ids == single.token_ids
        assert [s.alpha for s in batched.steps] == pytest.approx([s.alpha for s in single.steps], abs=1e-5)
