"""Label-free calibration of a gate's threshold: the fit against hand-counted shares, the refusal when a share is out
of reach (nothing written), the statistic recorded along standard decoding, and the config it writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fides_rag import FidesConfig, FidesDecoder, get_method
from fides_rag.eval.gate_calibration import (
    GateStatisticRule,
    TargetShareUnreachable,
    calibrate_gate,
    collect_gate_statistic,
    fit_threshold,
    thresholded_gate,
    write_gate_calibration,
)
from fides_rag.rules.gates import EvidenceGate

PAIRS = [
    ("What is the capital of France?", ["Lyon is the capital of France."]),
    ("Who chose Canberra?", ["The capital of Australia is Melbourne.", "Canberra was chosen as a compromise."]),
    ("What jumps?", ["The quick brown fox jumps over the lazy dog."]),
    ("Where is Paris?", ["Paris is a large city on the Seine."]),
]
VALUES = [0.05 * ((7 * i) % 20) for i in range(20)]  # a permutation of 0.00 .. 0.95


def test_the_threshold_above_leaves_the_target_share_to_the_rule():
    threshold, share = fit_threshold(VALUES, 0.1, rule_above=True)
    assert threshold == pytest.approx((0.9 + 0.85) / 2)  # the rule takes 0.95 and 0.9
    assert share == 0.1 and sum(v >= threshold for v in VALUES) == 2


def test_the_threshold_below_leaves_the_lowest_values_to_the_rule():
    threshold, share = fit_threshold(VALUES, 0.25, rule_above=False)
    assert threshold == pytest.approx((0.2 + 0.25) / 2)  # the rule takes 0.0 .. 0.2
    assert share == 0.25 and sum(v < threshold for v in VALUES) == 5


def test_a_share_of_every_token_takes_them_all():
    assert fit_threshold([0.3, 0.1, 0.2], 0.99, rule_above=True) == (0.1, 1.0)
    threshold, share = fit_threshold([0.3, 0.1, 0.2], 0.99, rule_above=False)
    assert share == 1.0 and threshold > 0.3


def test_a_share_too_small_for_the_pool_is_refused():
    with pytest.raises(TargetShareUnreachable, match="cannot hold a share of 0.01"):
        fit_threshold(VALUES, 0.01, rule_above=True)


def test_ties_that_leave_no_threshold_near_the_target_are_refused():
    tied = [0.0] * 15 + [0.5] * 5
    with pytest.raises(TargetShareUnreachable, match="no threshold lets the rule act on 10.0%.*reaches 25.0%"):
        fit_threshold(tied, 0.1, rule_above=True)


@pytest.mark.parametrize("share", [0, 1, -0.2, 1.5, True, "0.1"])
def test_a_target_share_outside_zero_one_is_refused(share):
    with pytest.raises(ValueError, match="target_share must be a number strictly between 0 and 1"):
        fit_threshold(VALUES, share, rule_above=True)


def test_only_gates_with_a_threshold_can_be_calibrated():
    assert thresholded_gate("evidence").threshold == "tau"
    assert thresholded_gate("blend").threshold == "kappa"
    with pytest.raises(ValueError, match="the gate 'agree' has no threshold to calibrate; gates that have one: "):
        thresholded_gate("agree")
    with pytest.raises(ValueError, match="unknown gate"):
        thresholded_gate("nope")


def test_the_statistic_is_recorded_at_every_token_of_standard_decoding(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    values, trimmed = collect_gate_statistic(decoder, PAIRS, EvidenceGate(), batch_size=3, max_new_tokens=5)
    standard = decoder.generate_batch([q for q, _ in PAIRS], [d for _, d in PAIRS], method="standard", max_new_tokens=5)
    recorded = decoder.generate_batch(
        [q for q, _ in PAIRS], [d for _, d in PAIRS], method=GateStatisticRule(EvidenceGate()), max_new_tokens=5
    )
    assert [r.token_ids for r in recorded] == [r.token_ids for r in standard]
    assert values.dtype == np.float64 and values.size == sum(len(r.steps) for r in standard) and trimmed == 0
    assert ((values >= 0) & (values <= np.log(2))).all()


def test_the_recorded_statistic_matches_the_divergence_of_the_two_paths(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    fides = decoder.generate(PAIRS[0][0], PAIRS[0][1], method="fides", max_new_tokens=1)
    values, _ = collect_gate_statistic(decoder, PAIRS[:2], EvidenceGate(), max_new_tokens=1)
    assert values[0] == pytest.approx(fides.steps[0].opposition, abs=1e-5)  # FIDES's Opposition is the same JSD


def test_calibration_writes_the_threshold_into_a_config_that_gates_with_it(tiny_llama, tokenizer, tmp_path):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    base = FidesConfig(lambda_=1.0)
    calibration = calibrate_gate(
        decoder, PAIRS, "evidence", target_share=0.25, base=base, max_new_tokens=5, source={"model": "tiny"}
    )
    assert calibration.option == "tau" and abs(calibration.share / 0.25 - 1) <= 0.2
    config = calibration.config
    assert config.gates == {"evidence": {"tau": calibration.value}} and config.lambda_ == 1.0
    assert config.source["gates"]["evidence"]["model"] == "tiny"
    path, md = write_gate_calibration(calibration, tmp_path / "cal.json")
    assert json.loads(path.read_text())["gates"] == {"evidence": {"tau": calibration.value}}
    assert "| evidence | tau |" in md.read_text()
    again = FidesConfig.from_file(path)
    assert again == config and get_method("fides+evidence", config=again).gate.tau == calibration.value


def test_an_unreachable_share_writes_nothing(tiny_llama, tokenizer, tmp_path):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    with pytest.raises(TargetShareUnreachable):
        calibrate_gate(decoder, PAIRS[:2], "evidence", target_share=0.01, max_new_tokens=2)
    assert not list(tmp_path.iterdir())
