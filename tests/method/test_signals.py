"""Each signal against a float64 hand computation written with plain Python math, and its bounds."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag.method import signals


@pytest.fixture(autouse=True)
def float64_by_default():
    """These tests build their tensors in float64 (the references are float64); other modules keep float32."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def softmax_list(row: list[float]) -> list[float]:
    top = max(row)
    exps = [math.exp(v - top) for v in row]
    total = sum(exps)
    return [e / total for e in exps]


def kl_list(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


def jsd_list(p: list[float], q: list[float]) -> float:
    m = [(pi + qi) / 2 for pi, qi in zip(p, q)]
    return 0.5 * kl_list(p, m) + 0.5 * kl_list(q, m)


LOGITS_P = [[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4], [5.0, -3.0, 1.0, 2.0]]
LOGITS_Q = [[0.0, 1.5, 1.0, -2.0], [0.4, 0.3, 0.2, 0.1], [5.0, -3.0, 1.0, 2.0]]


def test_kl_matches_hand_computation():
    got = signals.kl_divergence(torch.tensor(LOGITS_P), torch.tensor(LOGITS_Q))
    want = [kl_list(softmax_list(p), softmax_list(q)) for p, q in zip(LOGITS_P, LOGITS_Q)]
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    assert got[2] == pytest.approx(0.0, abs=1e-12)


def test_jsd_matches_hand_computation_and_is_symmetric():
    p, q = torch.tensor(LOGITS_P), torch.tensor(LOGITS_Q)
    got = signals.opposition(p, q)
    want = [jsd_list(softmax_list(a), softmax_list(b)) for a, b in zip(LOGITS_P, LOGITS_Q)]
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    assert signals.jensen_shannon_divergence(q, p).tolist() == pytest.approx(want, abs=1e-12)


def test_jsd_bounds_zero_and_ln2():
    identical = torch.tensor([[1.0, 2.0, 3.0]])
    assert signals.opposition(identical, identical).item() == pytest.approx(0.0, abs=1e-12)
    # Near-disjoint supports approach ln 2 and never exceed it.
    disjoint_p = torch.tensor([[60.0, -60.0, -60.0, -60.0]])
    disjoint_q = torch.tensor([[-60.0, 60.0, -60.0, -60.0]])
    value = signals.opposition(disjoint_p, disjoint_q).item()
    assert value == pytest.approx(math.log(2), abs=1e-9)
    assert value <= math.log(2)
    random = signals.opposition(torch.randn(64, 50) * 4, torch.randn(64, 50) * 4)
    assert bool(((random >= 0) & (random <= math.log(2))).all())


def test_shift_matches_hand_computation():
    # L = 3 layers, B = 2 rows, H = 2.
    ctx = [[[3.0, 4.0], [1.0, 0.0]], [[0.0, 2.0], [1.0, 1.0]], [[1.0, 1.0], [0.0, -5.0]]]
    noctx = [[[4.0, 3.0], [0.0, 1.0]], [[0.0, 7.0], [-1.0, -1.0]], [[1.0, -1.0], [0.0, -1.0]]]

    def unit(v):
        n = math.sqrt(sum(x * x for x in v))
        return [x / n for x in v]

    want = []
    for b in range(2):
        total = 0.0
        for layer in range(3):
            u, v = unit(ctx[layer][b]), unit(noctx[layer][b])
            total += math.sqrt(sum((x - y) ** 2 for x, y in zip(u, v)))
        want.append(min(1.0, max(0.0, total / (10 * 3))))
    got = signals.hidden_state_shift(torch.tensor(ctx), torch.tensor(noctx), scale=10.0)
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    # Row 1 holds opposite unit vectors in two layers (distance 2 each) and an orthogonal pair.
    assert want[1] == pytest.approx((math.sqrt(2) + 2 + 0) / 30, abs=1e-12)


def test_shift_is_clipped_to_one_and_scale_invariant():
    ctx, noctx = torch.randn(4, 3, 8), torch.randn(4, 3, 8)
    assert signals.hidden_state_shift(ctx, noctx, scale=0.01).tolist() == [1.0, 1.0, 1.0]
    assert torch.allclose(signals.hidden_state_shift(ctx * 7.5, noctx * 0.2), signals.hidden_state_shift(ctx, noctx))
    assert signals.hidden_state_shift(ctx, ctx).abs().max().item() == pytest.approx(0.0, abs=1e-12)


def test_noise_matches_hand_computation_and_clips():
    mid, final = torch.tensor(LOGITS_P), torch.tensor(LOGITS_Q)
    want = [min(1.0, kl_list(softmax_list(a), softmax_list(b)) / 5) for a, b in zip(LOGITS_P, LOGITS_Q)]
    assert signals.logit_lens_noise(mid, final, scale=5.0).tolist() == pytest.approx(want, abs=1e-12)
    far = signals.logit_lens_noise(torch.tensor([[50.0, 0.0]]), torch.tensor([[0.0, 50.0]]), scale=5.0)
    assert far.item() == 1.0


def test_fused_score_alpha_and_contrast():
    opp, shift, noise = torch.tensor([0.2, 0.6]), torch.tensor([0.05, 0.1]), torch.tensor([0.5, 1.0])
    score = signals.fused_score(opp, shift, noise, (0.5, 0.3, 0.2))
    assert score.tolist() == pytest.approx([0.5 * 0.2 + 0.3 * 0.05 + 0.2 * 0.5, 0.5 * 0.6 + 0.3 * 0.1 + 0.2 * 1.0])
    alpha = signals.adaptive_alpha(torch.tensor([0.01, 0.4]), lambda_=1.5, alpha_min=0.1)
    assert alpha.tolist() == pytest.approx([0.1, 0.6])
    z_ctx, z_no = torch.tensor([[1.0, 2.0], [3.0, -1.0]]), torch.tensor([[0.5, 4.0], [1.0, 1.0]])
    mixed = signals.contrast_logits(z_ctx, z_no, torch.tensor([1.0, 0.5]))
    assert mixed.tolist() == [[1.5, 0.0], [4.0, -2.0]]
    assert torch.equal(signals.contrast_logits(z_ctx, z_no, 0.0), z_ctx)


def test_fused_score_skips_zero_weights_and_rejects_missing_signal():
    opp = torch.tensor([0.3])
    assert signals.fused_score(opp, None, None, (1.0, 0.0, 0.0)).tolist() == pytest.approx([0.3])
    with pytest.raises(ValueError, match="not computed"):
        signals.fused_score(opp, None, None, (0.5, 0.3, 0.2))


def entropy_list(p: list[float]) -> float:
    return -sum(pi * math.log(pi) for pi in p if pi > 0)


def test_entropy_top_probability_and_margin_match_hand_computation():
    logits = torch.tensor(LOGITS_P)
    probs = [softmax_list(row) for row in LOGITS_P]
    assert signals.entropy(logits).tolist() == pytest.approx([entropy_list(p) for p in probs], abs=1e-12)
    assert signals.top_probability(logits).tolist() == pytest.approx([max(p) for p in probs], abs=1e-12)
    margins = [sorted(p)[-1] - sorted(p)[-2] for p in probs]
    assert signals.top_two_margin(logits).tolist() == pytest.approx(margins, abs=1e-12)
    uniform = torch.zeros(1, 8)
    assert signals.entropy(uniform).item() == pytest.approx(math.log(8), abs=1e-12)
    assert signals.top_two_margin(uniform).item() == pytest.approx(0.0, abs=1e-12)


def test_top_k_jsd_renormalises_over_the_union_of_both_top_k():
    p_row, q_row = [4.0, 3.0, 0.0, -1.0, 2.5, -2.0], [0.0, 3.5, 4.0, -1.0, -3.0, 1.0]
    # top-2 of p: tokens 0, 1; of q: tokens 2, 1 -> union {0, 1, 2}
    support = [0, 1, 2]
    p = softmax_list([p_row[i] for i in support])
    q = softmax_list([q_row[i] for i in support])
    got = signals.top_k_jensen_shannon(torch.tensor([p_row]), torch.tensor([q_row]), k=2)
    assert got.item() == pytest.approx(jsd_list(p, q), abs=1e-12)
    full = signals.top_k_jensen_shannon(
        torch.tensor(LOGITS_P), torch.tensor(LOGITS_Q), k=50
    )  # k >= V: the whole vocabulary
    assert torch.allclose(full, signals.opposition(torch.tensor(LOGITS_P), torch.tensor(LOGITS_Q)), atol=1e-12)
