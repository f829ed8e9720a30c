"""FIDES constants, with the source's defaults and validation that names the offending field."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

SIGNAL_NAMES: tuple[str, ...] = ("opposition", "shift", "noise")
MAX_ALPHA = 1e30
"""The largest contrast strength a_t a config may produce: the rules compute (1 + a)·z_ctx − a·z_noctx in float32,
whose largest value is 3.4e38, so with a ≤ 1e30 the products stay finite for logits up to 1e8 in magnitude."""
_NUMBERS = ("lambda_", "alpha_min", "shift_scale", "noise_scale", "noise_layer_ratio", "fixed_alpha")


def _checked_gates(gates: Any) -> dict[str, dict[str, float]]:
    """`gates` as {gate name: {option: float}} (whether each gate and option exists is checked where a rule takes the
    config: `FidesRule`, below the gates' registry)."""
    _require(
        isinstance(gates, Mapping)
        and all(isinstance(name, str) and isinstance(o, Mapping) for name, o in gates.items())
        and all(isinstance(option, str) and _is_real(v) for o in gates.values() for option, v in o.items()),
        "gates",
        f'expected {{gate name: {{option: finite number}}}}, e.g. {{"evidence": {{"tau": 0.2}}}}, got {gates!r:.120}',
    )
    return {name: {option: float(value) for option, value in options.items()} for name, options in gates.items()}


def _require(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"FidesConfig.{field_name}: {message}")


def _is_real(value: Any) -> bool:
    """A finite real number: Python's or numpy's (np.float32, ...), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class FidesConfig:
    """The constants of FIDES; the defaults are the source's.

    a_t = max(alpha_min, lambda_ * FScore_t), FScore = w · (Opposition, Shift, Noise),
    Shift = clip(sum_l ||ĥ_ctx[l] - ĥ_noctx[l]|| / (shift_scale * L), 0, 1),
    Noise = clip(KL(p̃_mid || p̃_L) / noise_scale, 0, 1), mid = floor(noise_layer_ratio * L).
    """

    weights: tuple[float, float, float] = (0.5, 0.3, 0.2)
    """Fusion weights of (Opposition, Shift, Noise). A zero weight drops that signal (it is not computed)."""
    lambda_: float = 1.5
    """λ: how strongly the fused score turns into contrast strength."""
    alpha_min: float = 0.1
    """Floor of the per-token contrast strength a_t."""
    shift_scale: float = 10.0
    """Divisor of the layer-averaged hidden-state shift (the source's 1/10)."""
    noise_scale: float = 5.0
    """Divisor of the logit-lens KL (the source's 1/5)."""
    noise_layer_ratio: float = 0.5
    """The logit-lens layer is floor(ratio * L); the source finds 0.3-0.6 equivalent."""
    fixed_alpha: float | None = None
    """Ablation: use this constant a_t instead of the fused score (signals are still recorded)."""
    gates: Mapping[str, Mapping[str, float]] = field(default_factory=dict, hash=False)
    """Calibrated options of gates by gate name, e.g. {"evidence": {"tau": 0.21}} (`fides-rag calibrate --gate`): a
    method `rule+gate` built with this config takes them. FIDES itself, ungated, ignores them."""
    source: dict[str, Any] = field(default_factory=dict, compare=False)
    """Free-form provenance, e.g. the model and data a calibrated config came from."""

    def __post_init__(self) -> None:
        weights = self.weights
        _require(
            isinstance(weights, (tuple, list)) and len(weights) == 3,
            "weights",
            f"expected three numbers for (opposition, shift, noise), got {weights!r}",
        )
        _require(
            all(_is_real(w) and w >= 0 for w in weights),
            "weights",
            f"every weight must be a finite number >= 0, got {weights!r}",
        )
        _require(sum(weights) > 0, "weights", "at least one weight must be positive (or set fixed_alpha)")
        object.__setattr__(self, "weights", tuple(float(w) for w in weights))
        _require(
            _is_real(self.lambda_) and self.lambda_ >= 0,
            "lambda_",
            f"must be a finite number >= 0, got {self.lambda_!r}",
        )
        _require(
            _is_real(self.alpha_min) and self.alpha_min >= 0,
            "alpha_min",
            f"must be a finite number >= 0, got {self.alpha_min!r}",
        )
        _require(
            _is_real(self.shift_scale) and self.shift_scale > 0,
            "shift_scale",
            f"must be a finite number > 0, got {self.shift_scale!r}",
        )
        _require(
            _is_real(self.noise_scale) and self.noise_scale > 0,
            "noise_scale",
            f"must be a finite number > 0, got {self.noise_scale!r}",
        )
        _require(
            _is_real(self.noise_layer_ratio) and 0 < self.noise_layer_ratio < 1,
            "noise_layer_ratio",
            f"must lie strictly between 0 and 1, got {self.noise_layer_ratio!r}",
        )
        _require(
            self.fixed_alpha is None or (_is_real(self.fixed_alpha) and self.fixed_alpha >= 0),
            "fixed_alpha",
            f"must be None or a finite number >= 0, got {self.fixed_alpha!r}",
        )
        for name in _NUMBERS:  # numpy scalars become floats (JSON and torch take them)
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        self._check_strengths()
        object.__setattr__(self, "gates", _checked_gates(self.gates))

    def _check_strengths(self) -> None:
        """Every contrast strength this config can produce stays <= MAX_ALPHA (see there why)."""
        too_large = f"its products with logits overflow float32; use a value <= {MAX_ALPHA:g}"
        for name in ("fixed_alpha", "alpha_min", "lambda_"):
            value = getattr(self, name)
            _require(
                value is None or value <= MAX_ALPHA,
                name,
                f"{value!r} is past the largest contrast strength {MAX_ALPHA:g}: {too_large}",
            )
        if self.fixed_alpha is None:  # a_t <= lambda_ * FScore <= lambda_ * sum(weights), every signal being <= 1
            strongest = self.lambda_ * sum(self.weights)
            name = "weights" if sum(self.weights) > MAX_ALPHA else "lambda_"
            _require(
                strongest <= MAX_ALPHA,
                name,
                f"lambda_ * sum(weights) = {strongest:g} is past the largest contrast "
                f"strength {MAX_ALPHA:g}: {too_large}",
            )

    # -- ablations expressible without new code ---------------------------------------------

    @property
    def active_signals(self) -> tuple[str, ...]:
        """The signals with a non-zero weight, i.e. the ones FIDES computes."""
        return tuple(name for name, w in zip(SIGNAL_NAMES, self.weights) if w > 0)

    def with_signals(self, *signals: str, renormalize: bool = True) -> FidesConfig:
        """Keep only `signals` (e.g. "opposition"), zeroing the other weights; renormalise to sum 1 by default."""
        unknown = set(signals) - set(SIGNAL_NAMES)
        if unknown or not signals:
            raise ValueError(f"FidesConfig.weights: choose signals from {SIGNAL_NAMES}, got {signals!r}")
        kept = [w if name in signals else 0.0 for name, w in zip(SIGNAL_NAMES, self.weights)]
        if renormalize and sum(kept) > 0:
            kept = [w / sum(kept) for w in kept]
        return replace(self, weights=tuple(kept))  # type: ignore[arg-type]  # one weight per signal

    def without(self, signal: str, renormalize: bool = True) -> FidesConfig:
        """Drop one signal (the source's leave-one-out ablation)."""
        return self.with_signals(*(s for s in SIGNAL_NAMES if s != signal), renormalize=renormalize)

    def with_fixed_alpha(self, alpha: float = 1.0) -> FidesConfig:
        """The source's fixed-a ablation: a_t = alpha for every token."""
        return replace(self, fixed_alpha=alpha)

    # -- files --------------------------------------------------------------------------------

    def gate_options(self, gate: str) -> dict[str, float]:
        """The calibrated options of the gate named `gate` (empty when this config has none)."""
        return dict(self.gates.get(gate, {}))

    def without_gates(self) -> FidesConfig:
        """This config with no gate options (nor their provenance): the constants of FIDES alone."""
        return replace(self, gates={}, source={k: v for k, v in self.source.items() if k != "gates"})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `gates` only when some gate has options."""
        data = asdict(self)
        data["weights"] = list(self.weights)
        if self.gates:
            data["gates"] = {name: dict(options) for name, options in self.gates.items()}
        else:
            del data["gates"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FidesConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"FidesConfig: unknown field(s) {sorted(unknown)}; known fields are {sorted(known)}")
        data = dict(data)
        if "weights" in data and isinstance(data["weights"], list):
            data["weights"] = tuple(data["weights"])
        return cls(**data)

    def to_file(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def from_file(cls, path: str | Path) -> FidesConfig:
        """Read a JSON config written by `to_file` (or by `fides-rag calibrate`)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"FidesConfig file not found: {path}") from None
        except IsADirectoryError:
            raise ValueError(
                f"FidesConfig file {path} is a directory; pass a JSON file (e.g. one written by fides-rag calibrate)"
            ) from None
        except UnicodeDecodeError:
            raise ValueError(
                f"FidesConfig file {path} is not a text file; pass a JSON file (e.g. one written by fides-rag "
                "calibrate)"
            ) from None
        except json.JSONDecodeError as err:
            raise ValueError(f"FidesConfig file {path} is not valid JSON: {err}") from None
        except OSError as err:
            raise ValueError(f"cannot read the FidesConfig file {path}: {err.strerror or err}") from None
        if not isinstance(data, dict):
            raise ValueError(f"FidesConfig file {path} must hold a JSON object")
        return cls.from_dict(data)
