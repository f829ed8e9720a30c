"""`fides-stop` on pure tensors: FIDES wherever the context path's top token does not end the answer, the context
path's own logits where it does, against a float64 reference; behind a gate; registered and configured like FIDES."""

from __future__ import annotations

import pytest
import torch

from fides_rag import FidesConfig, GatedRule, available_methods, get_gate, get_method
from fides_rag.rules import StepInputs, accepts_option
from fides_rag.rules.fides import FidesRule
from fides_rag.rules.fides_stop import FidesStopRule

BATCH, VOCAB, LAYERS, HIDDEN = 4, 11, 4, 6
CONTEXT_TOP = [3, 7, 3, 9]
"""The context path's top token of each row."""
FIDES_TOP_OF_ROW_0 = 5
"""Row 0's context path ranks 5 a close second and the no-context path ranks 3 far ahead: FIDES picks 5 there for
any a_t >= 0.1, overriding the context path's 3 (the failure to stop, where 3 ends the answer)."""


def make_step(end_token_ids: tuple[int, ...] = (), dtype: torch.dtype = torch.float64) -> StepInputs:
    """One step of random paths whose context path ranks CONTEXT_TOP first, row by row."""
    generator = torch.Generator().manual_seed(0)
    ctx = torch.randn(BATCH, VOCAB, generator=generator, dtype=torch.float64) * 3
    ctx[torch.arange(BATCH), torch.tensor(CONTEXT_TOP)] = 20.0
    no_ctx = torch.randn(BATCH, VOCAB, generator=generator, dtype=torch.float64) * 3
    ctx[0, FIDES_TOP_OF_ROW_0] = 19.0
    no_ctx[0, CONTEXT_TOP[0]], no_ctx[0, FIDES_TOP_OF_ROW_0] = 60.0, -5.0
    return StepInputs.from_tensors(
        ctx_logits=ctx.to(dtype),
        no_ctx_logits=no_ctx.to(dtype),
        ctx_layer_states=torch.randn(LAYERS, BATCH, HIDDEN, generator=generator, dtype=torch.float64).to(dtype),
        no_ctx_layer_states=torch.randn(LAYERS, BATCH, HIDDEN, generator=generator, dtype=torch.float64).to(dtype),
        lens_logits={2: (torch.randn(BATCH, VOCAB, generator=generator, dtype=torch.float64) * 3).to(dtype)},
        num_layers=LAYERS,
        end_tokens=torch.tensor(end_token_ids, dtype=torch.long) if end_token_ids else None,
    )


def reference_logits(step: StepInputs, alphas: list[float]) -> list[list[float]]:
    """Float64, row by row: the context path's logits where its top token ends the answer, else FIDES's
    (1 + a)·z_ctx − a·z_noctx with FIDES's own a."""
    rows = []
    for b, (ctx, no) in enumerate(zip(step.ctx_logits.tolist(), step.require("no_ctx_logits").tolist())):
        top = max(range(VOCAB), key=lambda v: ctx[v])
        if step.end_tokens is not None and top in step.end_tokens.tolist():
            rows.append(ctx)
        else:
            rows.append([(1 + alphas[b]) * c - alphas[b] * n for c, n in zip(ctx, no)])
    return rows


def assert_is_fides(step: StepInputs) -> None:
    fides, stop = FidesRule().combine(step), FidesStopRule().combine(step)
    assert torch.equal(stop.logits, fides.logits)
    assert stop.records.keys() == {*fides.records, "kept_end"}
    for name, values in fides.records.items():
        assert torch.equal(stop.records[name], values), name
    assert stop.records["kept_end"].tolist() == [0.0] * BATCH


def test_without_end_tokens_it_is_fides() -> None:
    assert_is_fides(make_step(end_token_ids=()))


def test_end_tokens_the_context_path_does_not_rank_first_change_nothing() -> None:
    assert_is_fides(make_step(end_token_ids=(0, 5, VOCAB + 100)))


def test_where_the_context_path_ranks_an_end_token_first_its_logits_are_kept() -> None:
    step = make_step(end_token_ids=tuple(sorted(set(CONTEXT_TOP))))
    out = FidesStopRule().combine(step)
    assert torch.equal(out.logits, step.ctx_logits)
    assert out.logits.argmax(dim=-1).tolist() == CONTEXT_TOP
    assert out.records["kept_end"].tolist() == [1.0] * BATCH


def test_a_mixed_batch_keeps_the_end_row_by_row_against_a_float64_reference() -> None:
    step = make_step(end_token_ids=(3, 10))  # rows 0 and 2 rank 3 first; rows 1 and 3 rank 7 and 9
    out = FidesStopRule().combine(step)
    fides = FidesRule().combine(step)
    assert fides.logits.argmax(dim=-1)[0].item() == FIDES_TOP_OF_ROW_0  # FIDES overrides the context path's end
    assert out.logits.argmax(dim=-1).tolist() == [CONTEXT_TOP[0], *fides.logits.argmax(dim=-1)[1:].tolist()]
    want = reference_logits(step, out.records["alpha"].tolist())
    for b in range(BATCH):
        assert out.logits[b].tolist() == pytest.approx(want[b], abs=1e-10)
    assert out.records["kept_end"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert torch.equal(out.logits[[0, 2]], step.ctx_logits[[0, 2]])
    assert torch.equal(out.logits[[1, 3]], fides.logits[[1, 3]])
    assert torch.equal(out.records["alpha"], fides.records["alpha"])


def test_float32_rows_stay_float32_and_match_the_float64_reference() -> None:
    step = make_step(end_token_ids=(3,), dtype=torch.float32)
    out = FidesStopRule().combine(step)
    assert out.logits.dtype == torch.float32 and out.records["kept_end"].dtype == torch.float32
    want = reference_logits(step, out.records["alpha"].tolist())
    for b in range(BATCH):
        assert out.logits[b].tolist() == pytest.approx(want[b], abs=1e-4)


def test_behind_a_gate_the_gate_decides_first_and_the_end_is_kept_where_the_rule_acts() -> None:
    step = make_step(end_token_ids=(3,))
    bare = FidesStopRule().combine(step)
    always = get_method("fides-stop", gate=get_gate("evidence", tau=0.0))  # the rule acts on every token
    assert isinstance(always, GatedRule) and isinstance(always.rule, FidesStopRule)
    gated = always.combine(step)
    assert torch.equal(gated.logits, bare.logits)
    assert gated.records["kept_end"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert gated.records["gate"].tolist() == [0.0] * BATCH

    named = get_method("fides-stop+evidence")
    assert named.name == "fides-stop+evidence" and isinstance(named, GatedRule)
    fides_gated = get_method("fides+evidence").combine(step)
    out = named.combine(step)
    assert torch.equal(out.records["gate"], fides_gated.records["gate"])
    rule_rows = out.records["gate"] == 0
    assert torch.equal(out.logits[rule_rows], bare.logits[rule_rows])
    assert torch.equal(out.logits[~rule_rows], step.ctx_logits[~rule_rows])


def test_registered_and_configured_like_fides() -> None:
    assert "fides-stop" in available_methods()
    rule = get_method("fides-stop", alpha_min=0.2)
    assert isinstance(rule, FidesStopRule) and rule.name == "fides-stop"
    assert rule.options() == FidesRule(alpha_min=0.2).options()
    again = get_method("fides-stop", **rule.options())
    assert type(again) is FidesStopRule and again.options() == rule.options()
    assert accepts_option("fides-stop", "config") and accepts_option("fides-stop+evidence", "config")
    calibrated = FidesConfig(gates={"evidence": {"tau": 0.3}})
    gated = get_method("fides-stop+evidence", config=calibrated)
    assert gated.options()["gate_options"] == {"tau": 0.3}
    assert gated.options()["rule"] == "fides-stop"
    ablated = get_method("fides-stop", config=FidesConfig().with_signals("opposition"))
    assert not ablated.layer_state_paths and ablated.lens_layers(LAYERS) == ()


def test_a_gate_step_carries_the_end_tokens_through() -> None:
    step = make_step(end_token_ids=(3, 7, 9))
    out = get_method("fides-stop", gate=get_gate("evidence", tau=0.0)).combine(step)
    assert out.records["kept_end"].tolist() == [1.0] * BATCH
    assert torch.equal(out.logits, step.ctx_logits)
