"""Label-free calibration: statistics and proposal against float64 hand computations, the raw-signal rule
against default FIDES on a tiny model, the config round trip, and the errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fides_rag import FidesConfig, FidesDecoder, available_methods
from fides_rag.eval.calibration import (
    SOURCE_MEASURED_WEIGHTS,
    RawSignalsRule,
    calibrate,
    check_pairs,
    check_writable,
    collect_raw_signals,
    markdown_path,
    propose,
    signal_statistics,
    write_report,
)
from fides_rag.method.signals import hidden_state_shift, layer_mean_unit_distance
from fides_rag.rules.fides import FidesRule

QUESTIONS = ["What is the capital of France?", "Who chose Canberra?", "What jumps?", "Where is Paris?"]
DOCUMENTS = [
    ["Lyon is the capital of France."],
    ["The capital of Australia is Melbourne.", "Canberra was chosen as a compromise."],
    ["The quick brown fox jumps over the lazy dog."],
    ["Paris is a large city on the Seine."],
]
PAIRS = list(zip(QUESTIONS, DOCUMENTS))


# -- hand references (plain Python floats) ------------------------------------------------------------


def hand_percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    pos = q / 100 * (len(s) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(s) - 1)
    return s[low] + (pos - low) * (s[high] - s[low])


def hand_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


OPPOSITION = [0.01 * ((4 * i) % 21) for i in range(21)]  # a permutation of 0.00 .. 0.20
SHIFT = [0.1 + 0.02 * ((7 * i + 3) % 21) ** 1.3 for i in range(21)]
NOISE = [0.5 * ((5 * i + 1) % 21) ** 1.5 for i in range(21)]


# -- statistics --------------------------------------------------------------------------------------


def test_statistics_match_hand_computation():
    values = [0.01 * ((8 * i) % 21) ** 2 for i in range(21)]  # 0.00, 0.01, 0.04, ..., 4.00 in a shuffled order
    s = sorted(values)
    stats = signal_statistics(values, scale=2.0)
    assert stats["n"] == 21
    assert stats["min"] == s[0] and stats["max"] == s[-1]
    # n = 21: the 5/25/50/75/95th percentiles fall exactly on order statistics 1, 5, 10, 15, 19.
    for key, index in (("p5", 1), ("p25", 5), ("median", 10), ("p75", 15), ("p95", 19)):
        assert stats[key] == pytest.approx(s[index], abs=1e-12)
    assert stats["mean"] == pytest.approx(sum(values) / 21, abs=1e-12)
    assert stats["std"] == pytest.approx(hand_std(values), abs=1e-12)
    assert stats["clipped"] == pytest.approx(6 / 21)  # 2.25, 2.56, ..., 4.00 are >= 2
    assert signal_statistics(values)["clipped"] == 0.0


def test_statistics_interpolate_between_order_statistics():
    values = [3.0, 0.5, 2.0, 10.0, 1.0]
    stats = signal_statistics(values)
    assert stats["p5"] == pytest.approx(0.5 + 0.2 * (1.0 - 0.5), abs=1e-12)
    assert stats["p95"] == pytest.approx(3.0 + 0.8 * (10.0 - 3.0), abs=1e-12)
    for key, q in (("p25", 25), ("median", 50), ("p75", 75)):
        assert stats[key] == pytest.approx(hand_percentile(values, q), abs=1e-12)


def test_statistics_reject_too_few_or_bad_values():
    with pytest.raises(ValueError, match="at least 2"):
        signal_statistics([0.3], name="shift")
    with pytest.raises(ValueError, match="NaN"):
        signal_statistics([0.3, float("nan")])


# -- the proposal ------------------------------------------------------------------------------------


def test_proposal_matches_hand_computation():
    proposal = propose({"opposition": OPPOSITION, "shift": SHIFT, "noise": NOISE})
    target = hand_percentile(OPPOSITION, 95)
    assert target == pytest.approx(0.19)
    shift_scale = hand_percentile(SHIFT, 95) / target
    noise_scale = hand_percentile(NOISE, 95) / target
    assert proposal.shift_scale == pytest.approx(shift_scale, rel=1e-12)
    assert proposal.noise_scale == pytest.approx(noise_scale, rel=1e-12)
    fused = [OPPOSITION, [min(v / shift_scale, 1.0) for v in SHIFT], [min(v / noise_scale, 1.0) for v in NOISE]]
    sigmas = [hand_std(f) for f in fused]
    inverse = [1 / s for s in sigmas]
    weights = [w / sum(inverse) for w in inverse]
    assert proposal.sigmas == pytest.approx(sigmas, rel=1e-12)
    assert proposal.weights == pytest.approx(weights, rel=1e-12)
    assert sum(proposal.weights) == pytest.approx(1.0, abs=1e-15)
    # The scaled signals land on Opposition's range: their 95th percentiles coincide, clipping is rare.
    for name in ("shift", "noise"):
        assert proposal.fused_statistics[name]["p95"] == pytest.approx(target, rel=1e-12)
        assert proposal.fused_statistics[name]["clipped"] <= 0.05
    assert proposal.target == pytest.approx(target)


def test_proposal_is_invariant_to_the_units_of_shift_and_noise():
    """Multiplying a raw signal by c multiplies its proposed scale by c and leaves the weights unchanged."""
    base = propose({"opposition": OPPOSITION, "shift": SHIFT, "noise": NOISE})
    scaled = propose({"opposition": OPPOSITION, "shift": [3.0 * v for v in SHIFT], "noise": [0.1 * v for v in NOISE]})
    assert scaled.shift_scale == pytest.approx(3.0 * base.shift_scale, rel=1e-12)
    assert scaled.noise_scale == pytest.approx(0.1 * base.noise_scale, rel=1e-12)
    assert scaled.weights == pytest.approx(base.weights, rel=1e-12)


def test_less_spread_signal_gets_more_weight():
    """The 1/sigma rule: after matching the 95th percentiles, the signal with the smaller spread weighs more."""
    flat_noise = [1.0 + 0.01 * v for v in range(21)]  # narrow around its P95
    proposal = propose({"opposition": OPPOSITION, "shift": SHIFT, "noise": flat_noise})
    assert proposal.weights[2] > max(proposal.weights[:2])
    assert SOURCE_MEASURED_WEIGHTS == (0.533, 0.278, 0.189)


@pytest.mark.parametrize("name", ["opposition", "shift", "noise"])
def test_zero_variance_names_the_signal(name):
    raw = {"opposition": OPPOSITION, "shift": SHIFT, "noise": NOISE, name: [0.25] * 21}
    with pytest.raises(ValueError, match=rf"the {name} signal has zero variance"):
        propose(raw)


def test_zero_percentile_is_an_error():
    opposition = [0.0] * 20 + [0.5]
    with pytest.raises(ValueError, match="opposition signal's 95th percentile is 0"):
        propose({"opposition": opposition, "shift": SHIFT, "noise": NOISE})
    with pytest.raises(ValueError, match="one value per token"):
        propose({"opposition": OPPOSITION, "shift": SHIFT[:-1], "noise": NOISE})


# -- the raw helper in signals.py ----------------------------------------------------------------------


def test_layer_mean_unit_distance_matches_hand_computation():
    torch.manual_seed(0)
    ctx = torch.randn(3, 2, 4, dtype=torch.float64)
    no_ctx = torch.randn(3, 2, 4, dtype=torch.float64)
    got = layer_mean_unit_distance(ctx, no_ctx)
    want = []
    for b in range(2):
        total = 0.0
        for layer in range(3):
            a, c = ctx[layer, b].tolist(), no_ctx[layer, b].tolist()
            na, nc = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in c))
            total += math.sqrt(sum((x / na - y / nc) ** 2 for x, y in zip(a, c)))
        want.append(total / 3)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    for scale in (0.5, 10.0):
        assert hidden_state_shift(ctx, no_ctx, scale).tolist() == pytest.approx(
            (got / scale).clamp(0, 1).tolist(), abs=1e-12
        )


# -- the recording rule on a tiny model ------------------------------------------------------------------


def test_raw_rule_is_not_registered():
    assert "fides-raw-signals" not in available_methods()
    assert RawSignalsRule.name == "fides-raw-signals" and FidesRule.name == "fides"


@pytest.mark.parametrize(
    "config",
    [FidesConfig(), FidesConfig(shift_scale=0.05, noise_scale=0.01), FidesConfig(weights=(1.0, 0.0, 0.0))],
    ids=["default", "clipping", "opposition-only"],
)
def test_raw_rule_decodes_like_fides_and_reports_raw_values(tiny_llama, tokenizer, config):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    fides = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=FidesRule(config), max_new_tokens=8)
    raw = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=RawSignalsRule(config), max_new_tokens=8)
    clipped = {"shift": 0, "noise": 0}
    for f, r in zip(fides, raw):
        assert r.method == "fides-raw-signals"
        assert r.token_ids == f.token_ids
        for fs, rs in zip(f.steps, r.steps):
            assert (rs.alpha, rs.score, rs.opposition) == pytest.approx(
                (fs.alpha, fs.score, fs.opposition), rel=1e-6, abs=1e-9
            )
            assert rs.shift >= 0 and rs.noise >= 0
            for name, scale in (("shift", config.shift_scale), ("noise", config.noise_scale)):
                scaled, value = getattr(fs, name), getattr(rs, name)
                if scaled is None:  # a zero-weight signal FIDES does not compute; the raw rule still does
                    continue
                if scaled < 1.0:
                    assert value == pytest.approx(scaled * scale, rel=1e-5, abs=1e-7)
                else:
                    clipped[name] += 1
                    assert value >= scale * (1 - 1e-5)
    if config.noise_scale == 0.01:
        assert clipped["noise"] > 0 and clipped["shift"] > 0  # the clipped branch was exercised


def test_collect_records_every_generated_token(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    raw = collect_raw_signals(decoder, PAIRS, batch_size=3, max_new_tokens=6, progress=False)
    fides = decoder.generate_batch(QUESTIONS, DOCUMENTS, method="fides", max_new_tokens=6)
    assert raw.examples == 4
    assert raw.tokens == sum(len(r.steps) for r in fides)
    assert sorted(raw.values["opposition"].tolist()) == pytest.approx(
        sorted(s.opposition for r in fides for s in r.steps), abs=1e-6
    )
    assert all(v.dtype.name == "float64" and v.size == raw.tokens for v in raw.values.values())


# -- calibrate, files ----------------------------------------------------------------------------------


def test_calibrate_writes_a_config_that_round_trips_and_decodes(tiny_llama, tokenizer, tmp_path):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    report = calibrate(decoder, PAIRS, batch_size=2, max_new_tokens=6, progress=False, source={"model": "tiny-llama"})
    cfg = report.config
    assert sum(cfg.weights) == pytest.approx(1.0)
    assert (cfg.lambda_, cfg.alpha_min, cfg.noise_layer_ratio, cfg.fixed_alpha) == (1.5, 0.1, 0.5, None)
    assert (cfg.shift_scale, cfg.noise_scale) == (report.proposal.shift_scale, report.proposal.noise_scale)
    src = cfg.source
    assert src["model"] == "tiny-llama" and src["max_new_tokens"] == 6 and src["examples"] == 4
    assert src["tokens"] == report.tokens == report.statistics["opposition"]["n"]
    assert set(src["raw_statistics"]) == {"opposition", "shift", "noise"}
    assert src["source_measured_weights"] == [0.533, 0.278, 0.189]
    assert src["fides_rag_version"] and src["date"]

    config_path, md_path = write_report(report, tmp_path / "sub" / "calibrated.json")
    assert md_path == tmp_path / "sub" / "calibrated.md"
    again = FidesConfig.from_file(config_path)
    assert again == cfg and again.source == json.loads(json.dumps(cfg.source))
    text = md_path.read_text()
    assert "0.533, 0.278, 0.189" in text and "| Opposition" in text and "calibrated w" in text
    # The calibrated config drives FIDES; the source's rounded constants stay the default.
    result = FidesDecoder(tiny_llama, tokenizer, config=again).generate(QUESTIONS[0], DOCUMENTS[0], max_new_tokens=3)
    assert result.method_options["shift_scale"] == cfg.shift_scale and all(s.alpha is not None for s in result.steps)
    assert FidesConfig().weights == (0.5, 0.3, 0.2)


def test_pool_errors():
    with pytest.raises(ValueError, match="empty"):
        check_pairs([])
    with pytest.raises(ValueError, match="at least 2 prompts"):
        check_pairs(PAIRS[:1])
    with pytest.raises(ValueError, match="pair 1: no documents"):
        check_pairs([PAIRS[0], ("Q?", [])])
    with pytest.raises(ValueError, match="pair 0: the question"):
        check_pairs([(" ", ["D."]), PAIRS[1]])


def test_calibrate_rejects_bad_input_before_decoding():
    class Exploding:
        def generate_batch(self, *args, **kwargs):
            raise AssertionError("decoded despite bad input")

    with pytest.raises(ValueError, match="at least 2 prompts"):
        calibrate(Exploding(), PAIRS[:1])
    with pytest.raises(ValueError, match="batch_size"):
        calibrate(Exploding(), PAIRS, batch_size=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        calibrate(Exploding(), PAIRS, max_new_tokens=0)


def test_check_writable(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="cannot write"):
        check_writable(tmp_path / "file.txt" / "calibrated.json")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        check_writable(tmp_path / "folder")
    path, md = check_writable(tmp_path / "new" / "cal.json")
    assert (path, md) == (tmp_path / "new" / "cal.json", tmp_path / "new" / "cal.md")
    assert not path.exists() and not md.exists()  # checked, nothing written
    assert markdown_path("calibrated.md").name == "calibrated.md.stats.md"
