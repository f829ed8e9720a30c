"""Label-free calibration of a gate's threshold for a backbone (`fides-rag calibrate --gate NAME`).

A thresholded gate (`Gate.threshold`) leaves a token to the contrast rule on one side of a threshold on one per-token
statistic (the evidence gate: JSD(p_ctx ‖ p_noctx) ≥ τ; the blend gate: the context margin < κ). Its default was
chosen without the backbone at hand, and the statistic's range differs from one backbone to the next. Calibration
reads only (question, documents) pairs, never answers:

1. decode every pair greedily on the context path (standard decoding's tokens), recording per token the gate's
   statistic from both paths' logits;
2. set the threshold so that the rule acts on `target_share` of those tokens: midway between the last token the rule
   takes and the first it leaves, in the order of the statistic;
3. refuse, writing nothing, when the share reached on the pool is more than `tolerance` (relative) from the target:
   too few tokens, or a statistic whose ties leave no threshold near it.

The threshold is written into the config file (`FidesConfig.gates`) that the decoder, the CLI, the server and the
integrations load; `rule+gate` methods built with that config take it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fides_rag.eval.calibration import Pair, check_pairs, check_writable, decode_pool, signal_statistics
from fides_rag.method.config import FidesConfig
from fides_rag.rules.base import CONTEXT, NO_CONTEXT, ContrastRule, StepInputs, StepOutput
from fides_rag.rules.gates import Gate, calibrated_gates, get_gate

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder

DEFAULT_TARGET_SHARE = 0.10
"""The share of tokens the rule acts on by default: the tenth of the tokens the documents move most (evidence)."""
SHARE_TOLERANCE = 0.2
"""How far (relative) the share reached on the pool may be from the target before calibration refuses."""
DEFAULT_MAX_NEW_TOKENS = 16


class TargetShareUnreachable(ValueError):
    """The pool admits no threshold whose share of tokens is near the target; nothing is written."""


class GateStatisticRule(ContrastRule):
    """Decodes the context path as it is (standard decoding's tokens) and records `statistic`: the gate's per-token
    statistic from both paths' logits. Not registered: pass the object itself as `method=`."""

    name = "gate-statistic"
    paths = (CONTEXT, NO_CONTEXT)

    def __init__(self, gate: Gate) -> None:
        if gate.threshold is None:
            raise ValueError(_not_thresholded(gate.name))
        self.gate = gate

    def combine(self, step: StepInputs) -> StepOutput:
        return StepOutput(logits=step.ctx_logits, records={"statistic": self.gate.statistic(step)})

    def options(self) -> dict[str, Any]:
        return {"gate": self.gate.name, "gate_options": self.gate.options()}


def _not_thresholded(gate: str) -> str:
    return f"the gate {gate!r} has no threshold to calibrate; gates that have one: {', '.join(calibrated_gates())}"


def thresholded_gate(name: str) -> Gate:
    """The registered gate `name` with its defaults; a ValueError naming the calibratable gates otherwise."""
    gate = get_gate(name)
    if gate.threshold is None:
        raise ValueError(_not_thresholded(name))
    return gate


def check_target_share(target_share: Any) -> float:
    """`target_share` as a float strictly between 0 and 1."""
    if isinstance(target_share, bool) or not isinstance(target_share, (int, float)) or not 0 < target_share < 1:
        raise ValueError(f"target_share must be a number strictly between 0 and 1, got {target_share!r}")
    return float(target_share)


def fit_threshold(
    values: Any,
    target_share: float,
    *,
    rule_above: bool,
    tolerance: float = SHARE_TOLERANCE,
) -> tuple[float, float]:
    """(threshold, share reached) such that the rule acts on `target_share` of `values`: where value >= threshold
    (`rule_above`) or value < threshold. The threshold lies midway between the last value taken and the first left.
    Raises TargetShareUnreachable when the share reached is more than `tolerance` (relative)
    from the target."""
    target = check_target_share(target_share)
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or not np.isfinite(x).all():
        raise ValueError("values must be a flat sequence of finite per-token values")
    taken = round(target * x.size)
    if taken < 1:
        raise TargetShareUnreachable(
            f"{x.size} tokens cannot hold a share of {target:g} (not one token); decode more or longer prompts"
        )
    ordered = np.sort(x)[::-1] if rule_above else np.sort(x)  # the rule takes ordered[:taken]
    last = ordered[taken - 1]
    edge = last if rule_above else np.nextafter(last, np.inf)  # the rule takes every token
    threshold = float(edge if taken == x.size else (last + ordered[taken]) / 2)
    share = float(np.mean(x >= threshold) if rule_above else np.mean(x < threshold))
    if abs(share / target - 1) > tolerance:
        raise TargetShareUnreachable(
            f"no threshold lets the rule act on {target:.1%} of the {x.size} tokens: the nearest reaches {share:.1%} "
            f"(the statistic ties at {last:.6g}); calibrate on more or other prompts, or choose another target share"
        )
    return threshold, share


def collect_gate_statistic(
    decoder: FidesDecoder,
    pairs: Sequence[Pair],
    gate: Gate,
    *,
    batch_size: int = 8,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    progress: bool = True,
) -> tuple[np.ndarray, int]:
    """The gate's statistic at every token of standard decoding over `pairs` (float64 [tokens]), and the number of
    prompts whose documents were trimmed to fit."""
    checked = check_pairs(pairs)
    for value, name in ((batch_size, "batch_size"), (max_new_tokens, "max_new_tokens")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    rule = GateStatisticRule(gate)
    values: list[float] = []
    trimmed = 0
    for result in decode_pool(decoder, checked, rule, batch_size, max_new_tokens, progress):
        trimmed += int(result.documents_trimmed)
        values += [float(step.values["statistic"]) for step in result.steps]
    return np.asarray(values, dtype=np.float64), trimmed


@dataclass
class GateCalibration:
    """A gate's fitted threshold, the config that carries it, and the statistics it came from."""

    gate: str
    option: str
    value: float
    target_share: float
    share: float
    """The share of the pool's tokens the rule acts on at `value`."""
    statistics: dict[str, float]
    examples: int
    config: FidesConfig

    def markdown(self) -> str:
        stats = self.statistics
        side = ">=" if get_gate(self.gate).rule_above else "<"
        rows = [
            "| gate | option | value | rule acts where | target share | share on the pool | examples | tokens |",
            "|---|---|---|---|---|---|---|---|",
            f"| {self.gate} | {self.option} | {self.value:.4g} | statistic {side} {self.value:.4g} | "
            f"{self.target_share:.1%} | {self.share:.1%} | {self.examples} | {int(stats['n'])} |",
            "",
            "| statistic | min | p5 | p25 | median | mean | p75 | p95 | max |",
            "|---|---|---|---|---|---|---|---|---|",
            "| "
            + " | ".join(
                [self.gate, *(f"{stats[k]:.4g}" for k in ("min", "p5", "p25", "median", "mean", "p75", "p95", "max"))]
            )
            + " |",
        ]
        return "\n".join(rows) + "\n"


def calibrate_gate(
    decoder: FidesDecoder,
    pairs: Sequence[Pair],
    gate: str,
    *,
    target_share: float = DEFAULT_TARGET_SHARE,
    base: FidesConfig | None = None,
    batch_size: int = 8,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    progress: bool = True,
    source: Mapping[str, Any] | None = None,
) -> GateCalibration:
    """Fit the threshold of the gate named `gate` for `decoder`'s backbone on unlabelled (question, documents)
    pairs; the returned config is `base` (default FidesConfig()) with the gate's options set."""
    from fides_rag import __version__

    target = check_target_share(target_share)
    prototype = thresholded_gate(gate)
    base = base or FidesConfig()
    values, trimmed = collect_gate_statistic(
        decoder, pairs, prototype, batch_size=batch_size, max_new_tokens=max_new_tokens, progress=progress
    )
    if values.size < 2:
        raise TargetShareUnreachable(f"the pool gave {values.size} tokens; decode more or longer prompts")
    option = str(prototype.threshold)
    value, share = fit_threshold(values, target, rule_above=prototype.rule_above)
    try:
        get_gate(gate, **{option: value})
    except ValueError as err:
        raise TargetShareUnreachable(f"the threshold for {target:.1%} of the tokens is out of range: {err}") from None
    statistics = signal_statistics(values, None, gate)
    provenance = {
        **dict(source or {}),
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
        "examples": len(pairs),
        "tokens": int(values.size),
        "documents_trimmed": trimmed,
        "decoding": f"greedy standard decoding (the context path), {GateStatisticRule.__name__} recording it",
        "rule": f"{option}: the rule acts on target_share of the tokens, midway between the last taken and first left",
        "target_share": target,
        "share": share,
        "statistic": statistics,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "fides_rag_version": __version__,
    }
    options = {**base.gate_options(gate), option: value}
    config = replace(
        base,
        gates={**base.gates, gate: options},
        source={**base.source, "gates": {**dict(base.source.get("gates", {})), gate: provenance}},
    )
    return GateCalibration(gate, option, value, target, share, statistics, len(pairs), config)


def write_gate_calibration(calibration: GateCalibration, config_path: str | Path) -> tuple[Path, Path]:
    """Write the config (FidesConfig JSON, the gate's options in `gates`) and the markdown table beside it."""
    path, md = check_writable(config_path)
    calibration.config.to_file(path)
    md.write_text(calibration.markdown())
    return path, md


__all__ = [
    "DEFAULT_TARGET_SHARE",
    "GateCalibration",
    "GateStatisticRule",
    "TargetShareUnreachable",
    "calibrate_gate",
    "check_target_share",
    "collect_gate_statistic",
    "fit_threshold",
    "thresholded_gate",
    "write_gate_calibration",
]
