"""One decode step after the forward: one output-head matmul over every row's final state and the logit-lens
rows, each lane's `combine`, the tokens chosen, and exactly one device-to-host transfer that carries every
unit's chosen id, its NaN/inf flags, its stopping-criteria verdict and the values its rule recorded.

A lane whose rule fails, or a unit whose logits are not finite, fails only its own requests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fides_rag.errors import NonFiniteLogitsError
from fides_rag.generation.engine.captured_decide import CapturedDecide, compilable, lane_rows
from fides_rag.generation.engine.choosing import choose, criteria_hits
from fides_rag.generation.engine.hooks import stack_states
from fides_rag.generation.engine.lane_inputs import LaneInputs
from fides_rag.generation.engine.lanes import Lane
from fides_rag.generation.engine.layout import Unit
from fides_rag.generation.engine.logprobs import column_count, lane_top_k, logprob_columns, read_logprobs
from fides_rag.generation.engine.runner import Runner
from fides_rag.generation.stopping import finish_reason
from fides_rag.method.lens import ModelAnatomy
from fides_rag.result import StepRecord
from fides_rag.rules.base import StepInputs, StepOutput


@dataclass
class LaneStep:
    """What one lane decided this step, and where its values sit in the step's host transfer."""

    lane: Lane
    units: list[Unit]
    names: list[str] = field(default_factory=list)
    """The names of the values its rule recorded, in the order they are packed."""
    criteria: bool = False
    top_k: int | None = None
    """Alternatives per token packed for the units that asked for log-probabilities (None: none asked)."""
    error: BaseException | None = None
    """Raised by the lane's rule: its units fail, the others go on."""
    unit_errors: dict[int, BaseException] = field(default_factory=dict)
    """Raised by one unit's own processors or stopping criteria: that unit fails."""


def head_logits(anatomy: ModelAnatomy, batch: Runner, lane_inputs: LaneInputs) -> torch.Tensor:
    """One output-head matmul over the final states of all rows, then the logit-lens rows.  -> [R + n_lens, V]"""
    hidden = batch.hidden
    if hidden is None:  # a step decides only for tickets wired in, whose rows have joined the batch
        raise RuntimeError("no rows to take logits of: a decode step runs once rows have joined the batch")
    inputs = [hidden]  # [R, H], already final-normed
    for layer, rows in lane_inputs.lens_rows.items():
        states = batch.states[layer]
        inputs.append(anatomy.final_norm(states[rows.on(states.device)].to(hidden.device)))  # [n, H]
    return anatomy.head_logits(torch.cat(inputs, dim=0)).float()


def _not_finite(step: StepInputs) -> torch.Tensor:
    """[n] whether any logits a unit's rule reads are NaN or inf."""
    bad = [~torch.isfinite(x).flatten(1).all(dim=-1) for x in [*step.logits.values(), *step.lens_logits.values()]]
    return bad[0] if len(bad) == 1 else torch.stack(bad).any(dim=0)


def _combined(rule_name: str, output: object, rows: int) -> StepOutput:
    if not isinstance(output, StepOutput):
        raise TypeError(
            f"the contrast rule {rule_name!r} returned {type(output).__name__} from combine; combine must return "
            f"StepOutput(logits=<[n, V] tensor>, records={{name: <[n] tensor>}})"
        )
    if not isinstance(output.logits, torch.Tensor) or output.logits.dim() != 2 or output.logits.shape[0] != rows:
        shape = tuple(output.logits.shape) if isinstance(output.logits, torch.Tensor) else type(output.logits).__name__
        raise ValueError(f"the contrast rule {rule_name!r} returned logits of shape {shape}; expected [{rows}, vocab]")
    return output


def decide(
    anatomy: ModelAnatomy,
    batch: Runner,
    lanes: Sequence[Lane],
    lane_inputs: LaneInputs,
    state_layers: Sequence[int],
) -> tuple[list[float], list[LaneStep]]:
    """Every lane's combine and choice; returns the step's host values (one transfer) and what each lane packed."""
    logits = head_logits(anatomy, batch, lane_inputs)  # [R + n_lens, V], float32
    layer_states = stack_states(batch.states, state_layers, logits.device) if state_layers else None  # [L, R, H]
    compiled = batch.captured.decide if batch.captured is not None else None
    packed: list[torch.Tensor] = []
    steps: list[LaneStep] = []
    for index, lane in enumerate(lanes):
        taken = LaneStep(lane, list(lane.units))
        steps.append(taken)
        n = len(taken.units)
        try:
            parts = _compiled_parts(compiled, lane, lane_inputs.lanes[index], logits, layer_states, anatomy, taken)
            if parts is not None:
                packed.append(_pack(parts, logits.device))
                continue
            inputs = lane_inputs.inputs(index, logits, layer_states, anatomy.num_layers)
            if lane.rule.state_size:
                inputs.state = _lane_state(taken.units, lane.rule.state_size, logits)  # [n, state_size]
            decided = _combined(lane.rule.name, lane.rule.combine(inputs), n)
            if lane.rule.state_size:
                _keep_state(lane.rule.name, decided, taken.units)
            scores = constrain(
                decided, inputs.ctx_logits, taken.units, taken.unit_errors
            )  # after combine: the contrast picks among valid tokens
            chosen, has_nan, scores = choose(scores, lane, taken.unit_errors)  # [n], [n], [n, V]
            parts = [chosen, _not_finite(inputs), has_nan]
            if any(u.criteria is not None for u in taken.units):
                taken.criteria = True
                parts.append(criteria_hits(taken.units, chosen, scores, taken.unit_errors))
            taken.top_k = lane_top_k([u.logprobs for u in taken.units])
            if taken.top_k is not None:  # only when asked: the scores chosen from, on the device
                parts += logprob_columns(scores, chosen, taken.top_k)
            taken.names = list(decided.records)
            parts += [decided.records[name].detach().reshape(-1) for name in taken.names]  # [n] each
        except Exception as error:  # the lane's requests get it
            taken.error = error
            continue
        packed.append(_pack(parts, logits.device))
    if not packed:
        return [], steps
    return torch.cat(packed).tolist(), steps  # the step's one device-to-host transfer


def _pack(parts: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A lane's values, unit by unit: [n] each -> [n * k]."""
    return torch.stack([p.to(device, _packed_dtype(device)) for p in parts], dim=-1).reshape(-1)


def _compiled_parts(
    compiled: CapturedDecide | None,
    lane: Lane,
    lane_plan: Any,
    logits: torch.Tensor,
    layer_states: torch.Tensor | None,
    anatomy: ModelAnatomy,
    taken: LaneStep,
) -> list[torch.Tensor] | None:
    """The lane's packed parts from its compiled combine and choice; None where the lane runs eagerly."""
    if compiled is None or not compilable(lane, bool(lane_plan.padded)):
        return None
    rows, lens = lane_rows(lane_plan, logits.device)
    ends = lane_plan.end_tokens(logits.shape[-1], logits.device)
    out = compiled(lane.rule, logits, layer_states, rows, lens, anatomy.num_layers, ends)
    if out is None:
        return None
    chosen, not_finite, has_nan, records = out
    taken.names = list(records)
    return [chosen, not_finite, has_nan, *(records[name].detach().reshape(-1) for name in taken.names)]


def _lane_state(units: Sequence[Unit], size: int, like: torch.Tensor) -> torch.Tensor:
    """[n, size] the units' states from their previous step; zeros for a unit at its first step."""
    kept = [u.rule_state for u in units if u.rule_state is not None]
    if len(kept) == len(units):
        return torch.stack(kept)
    zeros = torch.zeros(size, dtype=like.dtype, device=like.device)
    return torch.stack([zeros if u.rule_state is None else u.rule_state for u in units])


def _keep_state(rule_name: str, decided: StepOutput, units: Sequence[Unit]) -> None:
    state = decided.state
    if not isinstance(state, torch.Tensor) or state.dim() != 2 or state.shape[0] != len(units):
        raise ValueError(
            f"the contrast rule {rule_name!r} keeps state but returned state={state!r} from combine; expected "
            f"[{len(units)}, state_size]"
        )
    for unit, row in zip(units, state.detach().unbind(0)):
        unit.rule_state = row


def constrain(
    decided: StepOutput, context_logits: torch.Tensor, units: Sequence[Unit], errors: dict[int, BaseException]
) -> torch.Tensor:
    """The final logits [n, V] with every token a unit's grammar refuses set to -inf (a copy; units without a
    grammar untouched). Where the rule left no token the grammar allows (DoLa's relative-top filter, say), the unit
    chooses among the allowed tokens by its context path's logits, and its step records `grammar_fallback` 1.
    A grammar that reaches a dead end fails its own unit only. Near the token budget a grammar admits only the
    next token of its completion (`GrammarState.reserve`), so the answer closes before the budget ends."""
    states = [u.grammar for u in units]
    if all(state is None for state in states):
        return decided.logits
    from fides_rag.errors import GrammarViolation
    from fides_rag.generation.grammar.constraint import mask_logits_rows

    for unit in units:
        if unit.grammar is not None:
            unit.grammar.reserve(unit.max_new_tokens - len(unit.generated))

    masked, fallback = decided.logits.clone(), context_logits.clone()
    try:
        mask_logits_rows(states, masked)
        mask_logits_rows(states, fallback)
    except GrammarViolation:
        for i, state in enumerate(states):  # find the failing rows, mask the others one by one
            try:
                if state is not None:
                    mask_logits_rows([state], masked[i : i + 1])
                    mask_logits_rows([state], fallback[i : i + 1])
            except GrammarViolation as error:
                errors.setdefault(i, error)
    dead = torch.isneginf(masked).all(dim=-1) & torch.tensor([s is not None for s in states]).to(
        masked.device, non_blocking=True
    )  # [n]
    decided.records["grammar_fallback"] = dead.float()
    return torch.where(dead[:, None], fallback, masked)


def _packed_dtype(device: torch.device) -> torch.dtype:
    # float64 holds every token id and float32 value exactly; MPS has no float64 (ids below 2**24 stay exact).
    return torch.float32 if device.type == "mps" else torch.float64


def advance(
    host: Sequence[float],
    steps: Sequence[LaneStep],
    tokenizer_decode: Callable[[list[int]], str],
    eos_token_ids: set[int],
    dtype: object,
) -> list[tuple[Unit, BaseException]]:
    """Unpack the step's host values into each unit: its token, its record, its finish reason. Returns the units
    that failed, with their error (a failing rule, NaN or inf logits); the others took one token each."""
    failed: list[tuple[Unit, BaseException]] = []
    at = 0
    for taken in steps:
        if taken.error is not None:
            failed += [(unit, taken.error) for unit in taken.units]
            continue
        extra = column_count(taken.top_k)
        width = 3 + taken.criteria + extra + len(taken.names)
        for i, unit in enumerate(taken.units):
            values, at = host[at : at + width], at + width
            step = len(unit.generated)
            if i in taken.unit_errors:
                failed.append((unit, taken.unit_errors[i]))
                continue
            if values[1]:
                failed.append(
                    (
                        unit,
                        NonFiniteLogitsError(
                            f"the model produced NaN or inf logits at generation step {step}; this usually means the "
                            f"weights or dtype ({dtype}) overflow: load the model in float32 or bfloat16"
                        ),
                    )
                )
                continue
            if values[2]:
                failed.append(
                    (
                        unit,
                        NonFiniteLogitsError(
                            f"the contrast rule {taken.lane.rule.name!r} produced NaN scores at step {step}"
                        ),
                    )
                )
                continue
            token_id = int(values[0])
            if unit.grammar is not None:
                try:  # the grammar may take its completion's next token instead, to close within the budget
                    token_id = unit.grammar.accept(token_id, left=unit.max_new_tokens - len(unit.generated) - 1)
                except ValueError as error:  # GrammarViolation
                    failed.append((unit, error))
                    continue
            unit.generated.append(token_id)
            record = StepRecord(
                token_id, tokenizer_decode([token_id]), dict(zip(taken.names, values[width - len(taken.names) :]))
            )
            if unit.logprobs is not None:
                if taken.top_k is None:  # lane_top_k gives None only when no unit of the lane asked
                    raise RuntimeError("a unit asked for log-probabilities but its lane packed none")
                at_logprobs = 3 + taken.criteria
                record.logprob, record.top_logprobs = read_logprobs(
                    values[at_logprobs : at_logprobs + extra], taken.top_k, unit.logprobs
                )
            unit.steps.append(record)
            unit.text.push(token_id)
            unit.finish_reason = finish_reason(unit, eos_token_ids, bool(taken.criteria and values[3]))
    return failed
