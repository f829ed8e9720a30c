"""FIDES: CAD whose per-token strength comes from three internal signals (GUIDE §1)."""

from __future__ import annotations

import math
from typing import Any

import torch

from fides_rag.method.config import FidesConfig
from fides_rag.method.signals import (
    adaptive_alpha,
    contrast_logits,
    fused_score,
    hidden_state_shift,
    logit_lens_noise,
    opposition,
)
from fides_rag.rules.base import CONTEXT, NO_CONTEXT, ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import register_method


def _check_gate_options(config: FidesConfig) -> None:
    """Every gate a config carries options for exists and takes them (a ValueError naming the gate otherwise)."""
    from fides_rag.rules.gates import available_gates, get_gate

    for name, options in config.gates.items():
        if name not in available_gates():
            raise ValueError(f"FidesConfig.gates: unknown gate {name!r}; gates: {', '.join(available_gates())}")
        try:
            get_gate(name, **options)
        except ValueError as err:
            raise ValueError(f"FidesConfig.gates: {err}") from None


def noise_layer(num_layers: int, ratio: float) -> int:
    """mid = floor(ratio · L), at least block 1 (1-based, so never the embedding output)."""
    return max(1, math.floor(ratio * num_layers))


@register_method("fides")
class FidesRule(ContrastRule):
    """a_t = max(alpha_min, λ·(w_o·Opposition + w_s·Shift + w_n·Noise)); z = (1+a_t)·z_ctx − a_t·z_noctx.

    >>> FidesRule()                                        # the source's constants
    >>> FidesRule(weights=(1.0, 0.0, 0.0))                 # Opposition-only ablation
    >>> FidesRule(config=FidesConfig().without("noise"))   # leave-one-out ablation
    """

    def __init__(self, config: FidesConfig | None = None, **overrides: Any) -> None:
        config = FidesConfig() if config is None else config
        if not isinstance(config, FidesConfig):
            raise TypeError(f"config must be a FidesConfig, got {type(config).__name__}")
        if overrides:
            config = FidesConfig.from_dict({**config.to_dict(), **overrides})
        _check_gate_options(config)
        self.config = config

    @property
    def layer_state_paths(self) -> tuple[str, ...]:
        return (CONTEXT, NO_CONTEXT) if self.config.weights[1] > 0 else ()

    def lens_layers(self, num_layers: int) -> tuple[int, ...]:
        if self.config.weights[2] == 0:
            return ()
        return (noise_layer(num_layers, self.config.noise_layer_ratio),)

    def combine(self, step: StepInputs) -> StepOutput:
        cfg = self.config
        no_ctx = step.require("no_ctx_logits")
        opp = opposition(step.ctx_logits, no_ctx)
        shift = None
        if cfg.weights[1] > 0:
            shift = hidden_state_shift(
                step.require("ctx_layer_states"), step.require("no_ctx_layer_states"), cfg.shift_scale
            )
        noise = None
        if cfg.weights[2] > 0:
            mid = noise_layer(step.num_layers, cfg.noise_layer_ratio)
            noise = logit_lens_noise(step.lens_logits[mid], step.ctx_logits, cfg.noise_scale)
        score = fused_score(opp if cfg.weights[0] > 0 else None, shift, noise, cfg.weights)
        if cfg.fixed_alpha is not None:
            alpha = torch.full_like(score, cfg.fixed_alpha)
        else:
            alpha = adaptive_alpha(score, cfg.lambda_, cfg.alpha_min)
        signals = {"alpha": alpha, "opposition": opp, "shift": shift, "noise": noise, "score": score}
        return StepOutput(
            logits=contrast_logits(step.ctx_logits, no_ctx, alpha),
            records={name: value for name, value in signals.items() if value is not None},
        )

    def options(self) -> dict:
        cfg = self.config.to_dict()
        cfg.pop("source", None)
        cfg.pop("gates", None)  # the gates' options, not FIDES's: they change nothing here
        return cfg
