"""A lane's combine and greedy choice, compiled with the captured step's backend (fast mode with `compile`): the rule's
signals, its final logits, the argmax and the NaN/inf checks run as one compiled function per rule instead of one
launch per tensor operation.

Where it can: a greedy lane of a stateless rule whose units have no grammar, no logits processors, no stopping
criteria, no log-probabilities asked and no EOS held back this step, and whose paths are single rows (no
per-document paths). Every other lane, and every step under a dispatch mode (counting aten ops), runs eagerly as
before (`step.decide`). Shapes are dynamic (a lane's rows change as requests join and leave), so a rule compiles once
or twice, not once per row count.

A compilation that fails never fails a request: that rule's lanes run eagerly from then on (the same tokens in
exact arithmetic), `fallback_lanes` counts them and the log says why once. On CUDA the function is compiled without
CUDA graphs: a lane's outputs are read after other lanes run, which a graph replay may overwrite.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from fides_rag.generation.engine.lanes import Lane
from fides_rag.rules.base import ContrastRule, StepInputs

logger = logging.getLogger(__name__)

RECOMPILE_LIMIT = 64
"""Graphs dynamo may keep of the lane function: rules x (static, then dynamic) shapes x path sets."""


def compilable(lane: Lane, padded_paths: bool) -> bool:
    """Whether `lane`'s combine and choice can run compiled this step (see the module's docstring)."""
    if lane.do_sample or lane.rule.state_size or padded_paths:
        return False
    return all(
        u.grammar is None
        and u.processors is None
        and u.criteria is None
        and u.logprobs is None
        and not (u.eos_ids and len(u.generated) < u.min_new_tokens)
        for u in lane.units
    )


def decide_lane(
    rule: ContrastRule,
    logits: torch.Tensor,
    layer_states: torch.Tensor | None,
    rows: Mapping[str, torch.Tensor],
    lens: Mapping[int, torch.Tensor],
    num_layers: int,
    end_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """logits [R + n_lens, V], layer_states [L, R, H] or None, rows: path -> [n], lens: layer -> [n], end_tokens:
    [K] the ids that end the lane's answers (rules that read them) or None.
    -> chosen [n], not finite [n], NaN in the scores [n], the rule's records (name -> [n])."""
    step = StepInputs(
        logits={path: logits[index] for path, index in rows.items()},  # [n, V] each
        lens_logits={layer: logits[index] for layer, index in lens.items()},
        num_layers=num_layers,
        end_tokens=end_tokens,
    )
    if layer_states is not None:
        for path in rule.layer_state_paths:
            step.layer_states[path] = layer_states[:, rows[path]]  # [L, n, H]
    decided = rule.combine(step)
    scores = decided.logits  # [n, V]
    read = [*step.logits.values(), *step.lens_logits.values()]
    not_finite = torch.stack([~torch.isfinite(x).flatten(1).all(dim=-1) for x in read]).any(dim=0)
    return scores.argmax(dim=-1), not_finite, torch.isnan(scores).any(dim=-1), dict(decided.records)


class CapturedDecide:
    """The compiled lane function, and the rules whose lanes run eagerly because it could not compile for them."""

    def __init__(self, backend: str) -> None:
        # A code object of its own: dynamo counts recompiles per code object, so decoders must not share one.
        own = types.FunctionType(decide_lane.__code__.replace(), decide_lane.__globals__, "decide_lane")
        self._compiled = torch.compile(own, fullgraph=False, dynamic=None, backend=backend)
        self.compiled_lanes = 0
        """Lane steps whose combine and choice ran compiled."""
        self.fallback_lanes = 0
        """Lane steps that ran eagerly because the lane function could not be compiled for their rule."""
        self._failed: dict[tuple[str, str], str] = {}
        self._warned: set[str] = set()

    def __call__(
        self,
        rule: ContrastRule,
        logits: torch.Tensor,
        layer_states: torch.Tensor | None,
        rows: Mapping[str, torch.Tensor],
        lens: Mapping[int, torch.Tensor],
        num_layers: int,
        end_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]] | None:
        """The lane's outputs, computed by the compiled function; None where it runs eagerly instead (under a
        dispatch mode, or for a rule it failed to compile for). `end_tokens`: `StepInputs.end_tokens`."""
        if _get_current_dispatch_mode() is not None:
            return None
        key = (rule.name or type(rule).__name__, repr(rule.options()))
        if key in self._failed:
            self.fallback_lanes += 1
            return None
        limits: dict[str, Any] = {
            "recompile_limit": RECOMPILE_LIMIT,
            "accumulated_recompile_limit": max(torch._dynamo.config.accumulated_recompile_limit, RECOMPILE_LIMIT),
        }
        try:
            with torch._dynamo.config.patch(**limits):
                out = self._compiled(rule, logits, layer_states, rows, lens, num_layers, end_tokens)
            self.compiled_lanes += 1
            return out
        except Exception as error:  # compiling changes no result: the lane runs eagerly instead
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error) else ''}"
            self._failed[key] = reason
            if reason not in self._warned:
                self._warned.add(reason)
                logger.warning("the compiled combine of rule %r runs eagerly from now on: %s", key[0], reason)
        self.fallback_lanes += 1
        return None


def lane_rows(plan: Any, device: torch.device) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """A lane plan's row indices on `device`: path -> [n], lens layer -> [n]."""
    return (
        {path: index.on(device) for path, index in plan.rows.items()},
        {layer: index.on(device) for layer, index in plan.lens.items()},
    )
