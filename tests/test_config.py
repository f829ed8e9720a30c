from __future__ import annotations

import json

import pytest

from fides_rag import FidesConfig


def test_defaults_are_the_sources():
    cfg = FidesConfig()
    assert cfg.weights == (0.5, 0.3, 0.2)
    assert (cfg.lambda_, cfg.alpha_min, cfg.shift_scale, cfg.noise_scale, cfg.noise_layer_ratio) == (1.5, 0.1, 10.0, 5.0, 0.5)
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
