from __future__ import annotations

import json

import pytest

from fides_rag import FidesConfig, get_method


def test_defaults_are_the_sources():
    cfg = FidesConfig()
    assert cfg.weights == (0.5, 0.3, 0.2)
    assert (cfg.lambda_, cfg.alpha_min, cfg.shift_scale, cfg.noise_scale, cfg.noise_layer_ratio) == (
        1.5,
        0.1,
        10.0,
        5.0,
        0.5,
    )
    assert cfg.fixed_alpha is None
    assert cfg.active_signals == ("opposition", "shift", "noise")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"weights": (0.5, 0.3)}, "weights"),
        ({"weights": (0.5, -0.3, 0.2)}, "weights"),
        ({"weights": (0.0, 0.0, 0.0)}, "weights"),
        ({"weights": (float("nan"), 0.3, 0.2)}, "weights"),
        ({"lambda_": -1.0}, "lambda_"),
        ({"alpha_min": float("inf")}, "alpha_min"),
        ({"shift_scale": 0}, "shift_scale"),
        ({"noise_scale": -5}, "noise_scale"),
        ({"noise_layer_ratio": 1.0}, "noise_layer_ratio"),
        ({"noise_layer_ratio": 0}, "noise_layer_ratio"),
        ({"fixed_alpha": -0.1}, "fixed_alpha"),
        ({"lambda_": True}, "lambda_"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"FidesConfig\.{field}"):
        FidesConfig(**kwargs)


def test_ablations_without_new_code():
    cfg = FidesConfig()
    assert cfg.with_signals("opposition").weights == (1.0, 0.0, 0.0)
    assert cfg.with_signals("opposition", renormalize=False).weights == (0.5, 0.0, 0.0)
    no_shift = cfg.without("shift")
    assert no_shift.weights == pytest.approx((0.5 / 0.7, 0.0, 0.2 / 0.7))
    assert no_shift.active_signals == ("opposition", "noise")
    assert cfg.with_fixed_alpha(1.0).fixed_alpha == 1.0
    with pytest.raises(ValueError, match="choose signals"):
        cfg.with_signals("entropy")


def test_file_round_trip_and_unknown_fields(tmp_path):
    cfg = FidesConfig(weights=(0.533, 0.278, 0.189), source={"model": "gemma3-270m"})
    path = cfg.to_file(tmp_path / "fides.json")
    again = FidesConfig.from_file(path)
    assert again == cfg and again.source == {"model": "gemma3-270m"}
    (tmp_path / "bad.json").write_text(json.dumps({"weights": [1, 0, 0], "lamda": 2}))
    with pytest.raises(ValueError, match="unknown field"):
        FidesConfig.from_file(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        FidesConfig.from_file(tmp_path / "broken.json")


def test_numpy_numbers_are_accepted_and_stored_as_floats():
    np = pytest.importorskip("numpy")
    cfg = FidesConfig(
        weights=tuple(np.float32(w) for w in (0.5, 0.25, 0.25)),
        lambda_=np.float32(2.0),
        alpha_min=np.float64(0.1),
        fixed_alpha=np.int64(1),
    )
    assert cfg.weights == (0.5, 0.25, 0.25) and cfg.lambda_ == 2.0 and cfg.fixed_alpha == 1.0
    assert all(type(v) is float for v in (*cfg.weights, cfg.lambda_, cfg.alpha_min, cfg.fixed_alpha))
    assert FidesConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match=r"FidesConfig\.lambda_"):
        FidesConfig(lambda_=np.bool_(True))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"fixed_alpha": 1e300}, "fixed_alpha"),
        ({"lambda_": 1e308}, "lambda_"),
        ({"alpha_min": 1e31}, "alpha_min"),
        ({"lambda_": 1e30, "weights": (1.0, 1.0, 1.0)}, "lambda_"),  # a_t can reach lambda_ * sum(weights)
        ({"weights": (1e300, 0.0, 0.0)}, "weights"),
    ],
)
def test_strengths_whose_products_with_logits_overflow_are_refused(kwargs, field):
    with pytest.raises(
        ValueError,
        match=rf"FidesConfig\.{field}: .*past the largest contrast strength 1e\+30: its products with logits "
        r"overflow float32",
    ):
        FidesConfig(**kwargs)


def test_the_largest_strength_still_decodes_to_finite_logits(tokenizer, tiny_llama):
    from fides_rag import FidesDecoder, get_method
    from fides_rag.method.config import MAX_ALPHA

    decoder = FidesDecoder(tiny_llama, tokenizer)
    for config in (FidesConfig(fixed_alpha=MAX_ALPHA), FidesConfig(lambda_=MAX_ALPHA / 1.0, weights=(1.0, 0.0, 0.0))):
        result = decoder.generate(
            "What is the capital?",
            ["Lyon is the capital of France."],
            method=get_method("fides", config=config),
            max_new_tokens=3,
        )
        assert len(result.token_ids) >= 1 and all(
            s.alpha is not None and s.alpha <= MAX_ALPHA * 1.0001 for s in result.steps
        )


def test_from_file_names_a_directory_or_a_binary_file(tmp_path):
    with pytest.raises(ValueError, match=rf"FidesConfig file {tmp_path} is a directory; pass a JSON file"):
        FidesConfig.from_file(tmp_path)
    (tmp_path / "weights.bin").write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match=r"FidesConfig file .*weights\.bin is not a text file; pass a JSON file"):
        FidesConfig.from_file(tmp_path / "weights.bin")


def test_gate_options_round_trip_and_leave_the_constants_alone(tmp_path):
    config = FidesConfig(gates={"evidence": {"tau": 0.2}, "blend": {"kappa": 0.1}})
    assert config.gate_options("evidence") == {"tau": 0.2} and config.gate_options("agree") == {}
    again = FidesConfig.from_file(config.to_file(tmp_path / "c.json"))
    assert again == config and again != FidesConfig()
    assert config.without_gates() == FidesConfig() and "gates" not in FidesConfig().to_dict()


@pytest.mark.parametrize(
    "gates, message",
    [
        ({"evidence": {"tau": "0.1"}}, "expected {gate name: {option: finite number}}"),
        ({"evidence": 0.1}, "expected {gate name: {option: finite number}}"),
        ({"evidence": {"tau": float("nan")}}, "expected {gate name: {option: finite number}}"),
    ],
)
def test_gate_options_that_are_not_numbers_by_name_are_refused(gates, message):
    with pytest.raises(ValueError, match=rf"FidesConfig.gates: {message}"):
        FidesConfig(gates=gates)


@pytest.mark.parametrize(
    "gates, message",
    [
        ({"nope": {"tau": 0.1}}, "unknown gate 'nope'"),
        ({"evidence": {"tau": 0.9}}, r"evidence: tau must be a number in \[0, 0.693147\]"),
        ({"evidence": {"threshold": 0.1}}, "bad options for gate 'evidence'"),
    ],
)
def test_a_config_naming_an_unknown_gate_or_option_is_refused_where_fides_takes_it(gates, message):
    config = FidesConfig(gates=gates)  # the config knows no gates; the rules do
    with pytest.raises(ValueError, match=rf"FidesConfig.gates: .*{message}"):
        get_method("fides", config=config)
