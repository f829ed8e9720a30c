"""COIECD against a float64 hand computation in probability space (Stacy027/COIECD decoding.py)."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import FidesDecoder, get_method
from fides_rag.rules import StepInputs
from fides_rag.rules.coiecd import CoiecdRule
from fides_rag.testing import (
    SAMPLE_DOCUMENTS,
    SAMPLE_QUESTIONS,
    build_tiny_model,
    build_tokenizer,
    reference_log_softmax,
)

QUESTIONS, DOCUMENTS = SAMPLE_QUESTIONS, SAMPLE_DOCUMENTS
log_softmax = reference_log_softmax


def reference_row(ctx, no, alpha=1.0, ratio=4.0):
    """c_v = 1 (CAD) if p < r·p_min or p > p_max/r, unless only the top token is above p_max/r."""
    lc, lu = log_softmax(ctx), log_softmax(no)
    p = [math.exp(v) for v in lc]
    p_max, p_min = max(p), min(p)
    above = [x > p_max / ratio for x in p]
    only_top = sum(above) == 1
    out, branch = [], []
    for x, c, u, is_above in zip(p, lc, lu, above):
        cad = x < ratio * p_min or (is_above and not only_top)
        branch.append(cad)
        out.append((1 + alpha) * c - alpha * u if cad else alpha * c + (1 - alpha) * u)
    return out, branch


def run(rule, ctx, no):
    ctx = torch.tensor(ctx, dtype=torch.float64)
    no = torch.tensor(no, dtype=torch.float64)
    return rule.combine(StepInputs.from_tensors(ctx_logits=ctx, no_ctx_logits=no))


@pytest.mark.parametrize("alpha, ratio", [(1.0, 4.0), (0.5, 4.0), (2.0, 2.5)])
def test_coiecd_random_rows(alpha, ratio):
    gen = torch.Generator().manual_seed(1)
    ctx = (torch.randn(6, 17, generator=gen, dtype=torch.float64) * 2).tolist()
    no = (torch.randn(6, 17, generator=gen, dtype=torch.float64) * 2).tolist()
    out = run(CoiecdRule(alpha=alpha, threshold_ratio=ratio), ctx, no)
    branches = []
    for b in range(6):
        want, branch = reference_row(ctx[b], no[b], alpha, ratio)
        branches += branch
        assert out.logits[b].tolist() == pytest.approx(want, abs=1e-12)
    assert any(branches) and not all(branches)  # both branches exercised
    assert out.records.get("alpha").tolist() == [alpha] * 6


def test_coiecd_hand_cases():
    # p_ctx ∝ [8, 4, 1.5, 1, 0.2]: p_max/4 = 2 -> tokens 0, 1 above (two of them: no exception);
    # 4·p_min = 0.8 -> token 4 below. CAD (2lc − lu) for 0, 1, 4; lc for 2, 3 (a = 1).
    ctx = [[math.log(v) for v in (8, 4, 1.5, 1, 0.2)]]
    no = [[0.3, -0.2, 1.0, 0.1, -1.0]]
    lc, lu = log_softmax(ctx[0]), log_softmax(no[0])
    want = [2 * lc[0] - lu[0], 2 * lc[1] - lu[1], lc[2], lc[3], 2 * lc[4] - lu[4]]
    assert run(CoiecdRule(), ctx, no).logits[0].tolist() == pytest.approx(want, abs=1e-12)
    # one dominant token (only token 0 above p_max/4): everything is "typical" except the tokens below 4·p_min
    ctx = [[math.log(v) for v in (10, 2, 1.5, 1, 0.2)]]
    lc = log_softmax(ctx[0])
    want = [lc[0], lc[1], lc[2], lc[3], 2 * lc[4] - lu[4]]
    assert run(CoiecdRule(), ctx, no).logits[0].tolist() == pytest.approx(want, abs=1e-12)
    assert reference_row(ctx[0], no[0])[0] == pytest.approx(want, abs=1e-12)


def test_coiecd_uniform_context_is_all_cad():
    out = run(CoiecdRule(alpha=0.7), [[0.0] * 6], [[0.5, 0.0, -0.5, 1.0, 0.0, 0.2]])
    lu = log_softmax([0.5, 0.0, -0.5, 1.0, 0.0, 0.2])
    assert out.logits[0].tolist() == pytest.approx([1.7 * math.log(1 / 6) - 0.7 * u for u in lu], abs=1e-12)


def test_coiecd_options_validated():
    assert get_method("coiecd").options() == {"alpha": 1.0, "threshold_ratio": 4.0}
    assert get_method("coiecd").needs_no_context
    for bad in (-1, float("inf"), "1"):
        with pytest.raises(ValueError, match="coiecd: alpha"):
            get_method("coiecd", alpha=bad)
    for bad in (0.5, float("nan"), None):
        with pytest.raises(ValueError, match="coiecd: threshold_ratio"):
            get_method("coiecd", threshold_ratio=bad)


def test_coiecd_batch_equals_single():
    tok = build_tokenizer()
    decoder = FidesDecoder(build_tiny_model("llama", len(tok)), tok)
    batch = decoder.generate_batch(QUESTIONS, DOCUMENTS, method="coiecd", max_new_tokens=6, stop=[])
    for question, docs, batched in zip(QUESTIONS, DOCUMENTS, batch):
        single = decoder.generate(question, docs, method="coiecd", max_new_tokens=6, stop=[])
        assert batched.method == "coiecd"
        assert batched.token_ids == single.token_ids
