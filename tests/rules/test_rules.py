"""Each rule's combine against a float64 hand computation, plus the registry."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import ContrastRule, FidesConfig, available_methods, get_method, register_method
from fides_rag.rules import StepInputs, StepOutput
from fides_rag.rules.fides import FidesRule, noise_layer


def softmax(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    return [x / sum(e) for x in e]


def jsd(p, q):
    mix = [(a + b) / 2 for a, b in zip(p, q)]
    kl = lambda x, y: sum(a * math.log(a / b) for a, b in zip(x, y) if a > 0)  # noqa: E731
    return 0.5 * kl(p, mix) + 0.5 * kl(q, mix)


@pytest.fixture
def step():
    torch.manual_seed(0)
    batch, vocab, layers, hidden = 3, 11, 4, 6
    return StepInputs.from_tensors(
        ctx_logits=torch.randn(batch, vocab, dtype=torch.float64) * 3,
        no_ctx_logits=torch.randn(batch, vocab, dtype=torch.float64) * 3,
        ctx_layer_states=torch.randn(layers, batch, hidden, dtype=torch.float64),
        no_ctx_layer_states=torch.randn(layers, batch, hidden, dtype=torch.float64),
        lens_logits={2: torch.randn(batch, vocab, dtype=torch.float64) * 3},
        num_layers=layers,
    )


def test_builtins_registered_in_order():
    assert available_methods()[:4] == ["standard", "cad", "adacad", "fides"]


def test_unknown_method_and_bad_options():
    with pytest.raises(ValueError, match="unknown method 'cda'.*standard, cad, adacad, fides"):
        get_method("cda")
    with pytest.raises(ValueError, match="bad options for method 'cad'"):
        get_method("cad", beta=2)
    with pytest.raises(ValueError, match="alpha must be"):
        get_method("cad", alpha=-1)
    with pytest.raises(ValueError, match="floor must be"):
        get_method("adacad", floor=float("nan"))
    rule = get_method("cad", alpha=0.5)
    assert get_method(rule) is rule


def test_standard_is_context_logits_and_single_path(step):
    rule = get_method("standard")
    assert rule.needs_no_context is False
    assert torch.equal(rule.combine(step).logits, step.ctx_logits)


def test_cad_hand_computation(step):
    out = get_method("cad", alpha=0.7).combine(step)
    want = 1.7 * step.ctx_logits - 0.7 * step.no_ctx_logits
    assert torch.allclose(out.logits, want, atol=1e-12)
    assert out.records.get("alpha").tolist() == [0.7, 0.7, 0.7]


def test_cad_alpha_zero_is_standard(step):
    assert torch.equal(get_method("cad", alpha=0.0).combine(step).logits, step.ctx_logits)


def test_adacad_alpha_is_jsd_with_floor(step):
    expected = [jsd(softmax(p), softmax(q)) for p, q in zip(step.ctx_logits.tolist(), step.no_ctx_logits.tolist())]
    out = get_method("adacad").combine(step)
    assert out.records.get("alpha").tolist() == pytest.approx(expected, abs=1e-12)
    want = (1 + out.records.get("alpha")[:, None]) * step.ctx_logits - out.records.get("alpha")[
        :, None
    ] * step.no_ctx_logits
    assert torch.allclose(out.logits, want, atol=1e-12)
    floored = get_method("adacad", floor=0.3).combine(step)
    assert floored.records.get("alpha").tolist() == pytest.approx([max(0.3, e) for e in expected], abs=1e-12)


def test_fides_hand_computation(step):
    rule = FidesRule()
    assert rule.layer_state_paths == ("context", "no_context") and rule.lens_layers(4) == (2,)
    out = rule.combine(step)
    ctx, no = step.ctx_logits.tolist(), step.no_ctx_logits.tolist()
    for b in range(3):
        opp = jsd(softmax(ctx[b]), softmax(no[b]))
        dist = 0.0
        for layer in range(4):
            u = step.ctx_layer_states[layer, b].tolist()
            v = step.no_ctx_layer_states[layer, b].tolist()
            nu, nv = math.sqrt(sum(x * x for x in u)), math.sqrt(sum(x * x for x in v))
            dist += math.sqrt(sum((x / nu - y / nv) ** 2 for x, y in zip(u, v)))
        shift = min(1.0, dist / (10 * 4))
        lens, final = softmax(step.lens_logits[2][b].tolist()), softmax(ctx[b])
        noise = min(1.0, sum(p * math.log(p / q) for p, q in zip(lens, final)) / 5)
        score = 0.5 * opp + 0.3 * shift + 0.2 * noise
        alpha = max(0.1, 1.5 * score)
        assert out.records.get("opposition")[b].item() == pytest.approx(opp, abs=1e-12)
        assert out.records.get("shift")[b].item() == pytest.approx(shift, abs=1e-12)
        assert out.records.get("noise")[b].item() == pytest.approx(noise, abs=1e-12)
        assert out.records.get("score")[b].item() == pytest.approx(score, abs=1e-12)
        assert out.records.get("alpha")[b].item() == pytest.approx(alpha, abs=1e-12)
        want = [(1 + alpha) * c - alpha * n for c, n in zip(ctx[b], no[b])]
        assert out.logits[b].tolist() == pytest.approx(want, abs=1e-10)


def test_fides_ablations_skip_signals(step):
    only_opp = FidesRule(FidesConfig().with_signals("opposition"))
    assert not only_opp.layer_state_paths and only_opp.lens_layers(4) == ()
    out = only_opp.combine(StepInputs.from_tensors(step.ctx_logits, step.no_ctx_logits, num_layers=4))
    assert out.records.get("shift") is None and out.records.get("noise") is None
    assert torch.allclose(out.records.get("alpha"), (1.5 * out.records.get("opposition")).clamp_min(0.1))
    fixed = FidesRule(weights=(0.5, 0.3, 0.2), fixed_alpha=1.0).combine(step)
    cad = get_method("cad", alpha=1.0).combine(step)
    assert torch.equal(fixed.logits, cad.logits)
    assert fixed.records.get("score") is not None  # signals are still recorded


def test_noise_layer_is_floor_and_never_embedding():
    assert noise_layer(18, 0.5) == 9
    assert noise_layer(30, 0.5) == 15
    assert noise_layer(30, 0.3) == 9
    assert noise_layer(1, 0.5) == 1


def test_new_rule_is_one_registered_class():
    @register_method("test-ctx-only")
    class ContextOnly(ContrastRule):
        paths = ("context",)

        def combine(self, step: StepInputs) -> StepOutput:
            return StepOutput(logits=step.ctx_logits * 2)

    try:
        assert "test-ctx-only" in available_methods()
        assert isinstance(get_method("test-ctx-only"), ContextOnly)
    finally:
        from fides_rag.rules import registry

        registry.RULES.unregister("test-ctx-only")


def test_accepts_option_reads_the_rule_constructor():
    from fides_rag.rules import accepts_option

    assert accepts_option("fides", "config") and accepts_option("cad", "alpha")
    assert not accepts_option("cad", "config") and not accepts_option("no-such-method", "config")
