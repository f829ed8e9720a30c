"""The decode loop: prefill → per step one backbone forward, one head matmul, each rule's `combine`, the
tokens chosen, one host transfer, rows compacted. Tensor shapes are in the comments where they change."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from fides_rag.generation.choosing import NonFiniteLogitsError, choose, history
from fides_rag.generation.gather import StepPlan
from fides_rag.generation.hooks import HeadMasker, LayerCapture
from fides_rag.generation.kv_cache import RowGroup, left_padded, prefill, prune
from fides_rag.generation.layout import LaneNeeds, RowLayout, Unit
from fides_rag.generation.prompting import PreparedExample
from fides_rag.generation.results import RecordBuffer
from fides_rag.generation.settings import GenerationSettings, RowSettings
from fides_rag.generation.stopping import finish_reason
from fides_rag.result import StepRecord
from fides_rag.rules.base import ContrastRule

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder

Heads = dict[int, tuple[int, ...]]


def decode_loop(
    decoder: FidesDecoder,
    examples: list[PreparedExample],
    rules: list[ContrastRule],
    settings: GenerationSettings,
    heads: list[Heads | None],
    rows: Sequence[RowSettings],
) -> Iterator[list[list[Unit]]]:
    """Decode every example under every rule (lane); yield units[lane][example] after every step.

    `rows[b]`: example b's own token budget, extra stop strings and seed. The caller holds the decoder's lock."""
    anatomy, num_layers, input_device = decoder.anatomy, decoder.anatomy.num_layers, decoder.device
    head_sets = list(dict.fromkeys(tuple(h.items()) for h in heads if h))  # lanes with equal heads share rows
    lanes = [LaneNeeds(tuple(rule.paths), head_sets.index(tuple(h.items())) if h else -1) for rule, h in zip(rules, heads)]
    layout = RowLayout(examples, lanes, rows)
    lens_by_lane = [rule.lens_layers(num_layers) for rule in rules]
    state_layers = tuple(range(1, num_layers + 1)) if any(rule.layer_state_paths for rule in rules) else ()
    pad_id = decoder.tokenizer.pad_token_id if decoder.tokenizer.pad_token_id is not None else 0
    groups = [RowGroup(*left_padded(g.sequences, pad_id, input_device), head_set=g.head_set) for g in layout.groups]
    prompt_ids = groups[0].ids  # [B, Tc], what logits processors see before the generated tokens
    processors = settings.warpers(prompt_ids.shape[1], decoder.eos_token_ids)
    track_history = bool(processors) or bool(settings.stopping_criteria)
    records = RecordBuffer()
    # Rows of equal length need no attention mask: with none, transformers builds none either, with no host sync.
    unpadded = len({len(seq) for g in layout.groups for seq in g.sequences}) == 1
    masking = HeadMasker(anatomy, [dict(h) for h in head_sets]) if head_sets else contextlib.nullcontext()
    with LayerCapture(anatomy, {*state_layers, *(l for ls in lens_by_lane for l in ls)}) as capture, masking as masker:
        state = prefill(anatomy, groups, capture, masker, decoder.split_prefill, padded=not unpadded)
        hidden, cache, mask, positions = state.last_hidden, state.cache, state.attention_mask, state.positions  # [R, H], ..., [R, T], [R, 1]
        if masker is not None:
            masker.set_rows(layout.row_head_sets)
        plan: StepPlan | None = None
        for step in range(max(row.max_new_tokens for row in rows)):
            if step > 0:
                out = anatomy.backbone(
                    input_ids=step_ids, attention_mask=None if unpadded else mask, position_ids=positions, past_key_values=cache, use_cache=True
                )
                cache, hidden = out.past_key_values, out.last_hidden_state[:, -1, :]  # [R, H]
            if plan is None or plan.version != layout.version:
                plan = StepPlan(layout, rules, lens_by_lane)
            logits = head_logits(decoder, hidden, capture, plan)  # [R + n_lens, V], float32
            layer_states = capture.stacked(state_layers, logits.device) if state_layers else None  # [L, R, H]
            packed = [(~torch.isfinite(logits).all()).long()[None]]  # [1]: the NaN/inf flag
            decided_lanes = []
            for lane, rule in enumerate(rules):
                lane_plan = plan.lanes[lane]
                if lane_plan is None:
                    continue
                decided = rule.combine(plan.inputs(lane, logits, layer_states, num_layers))  # logits [n, V]
                ids = history(prompt_ids, plan.examples(lane, input_device), lane_plan.units) if track_history else None
                chosen, has_nan, scores = choose(decided.logits, lane_plan.units, settings, processors, ids)  # [n], [], [n, V]
                packed += [chosen, has_nan.long()[None]]
                if settings.stopping_criteria:
                    with_new = torch.cat([ids.to(chosen.device), chosen[:, None]], dim=-1)  # [n, T + t + 1]
                    packed.append(settings.stopping_criteria(with_new, scores).long().to(chosen.device))  # [n]
                decided_lanes.append((rule, lane_plan.units, decided.records))
            host = torch.cat([p.to(packed[0].device) for p in packed]).tolist()  # the step's one device-to-host transfer
            advance(decoder, host, step, decided_lanes, settings, records)
            yield layout.units
            if not any(layout.active()):
                break
            keep = layout.compact()
            if keep is not None:
                mask, positions = prune(cache, mask, positions, keep)
                if masker is not None:
                    masker.set_rows(layout.row_head_sets)
            step_ids = torch.tensor(layout.next_tokens(), dtype=torch.long).to(input_device)[:, None]  # [R', 1]
            mask = torch.cat([mask, mask.new_ones((layout.num_rows, 1))], dim=-1)  # [R', T + 1]
            positions = positions[:, -1:] + 1  # [R', 1]
    records.flush()


def head_logits(decoder: FidesDecoder, hidden: torch.Tensor, capture: LayerCapture, plan: StepPlan) -> torch.Tensor:
    """One output-head matmul over the final states of all rows, then the logit-lens rows.  -> [R + n_lens, V]"""
    inputs = [hidden]  # [R, H], already final-normed
    for layer, rows in plan.lens_rows.items():
        states = capture.states[layer]
        inputs.append(decoder.anatomy.final_norm(states[rows.on(states.device)].to(hidden.device)))  # [n, H]
    return decoder.anatomy.head_logits(torch.cat(inputs, dim=0)).float()


def advance(
    decoder: FidesDecoder,
    host: list[int],
    step: int,
    lanes: list[tuple[ContrastRule, list[Unit], dict[str, torch.Tensor]]],
    settings: GenerationSettings,
    records: RecordBuffer,
) -> None:
    """Unpack the step's host values; raise on NaN/inf; append each unit's token, record and finish reason."""
    if host[0]:
        raise NonFiniteLogitsError(
            f"the model produced NaN or inf logits at generation step {step}; this usually means the "
            f"weights or dtype ({decoder.model.dtype}) overflow: load the model in float32 or bfloat16"
        )
    at = 1
    for rule, units, values in lanes:
        n = len(units)
        chosen, has_nan = host[at : at + n], host[at + n]
        at += n + 1
        hits = [False] * n
        if settings.stopping_criteria:
            hits, at = [bool(h) for h in host[at : at + n]], at + n
        if has_nan:
            raise NonFiniteLogitsError(f"the contrast rule {rule.name!r} produced NaN scores at step {step}")
        step_records = []
        for unit, token_id, hit in zip(units, chosen, hits):
            unit.generated.append(token_id)
            record = StepRecord(token_id=token_id, token=decoder.tokenizer.decode([token_id]))
            unit.steps.append(record)
            step_records.append(record)
            unit.finish_reason = finish_reason(unit, decoder.eos_token_ids, decoder.decode_text, hit, unit.max_new_tokens)
        records.add(step_records, values)
