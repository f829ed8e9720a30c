"""Each lane's `StepInputs`, read by path from one step's logits (`LaneInputs`): the index tensors are built once per
row layout (they change only when rows finish), kept per device, and reused every step."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fides_rag.generation.engine.end_tokens import EndTokens
from fides_rag.generation.engine.lanes import Lane
from fides_rag.generation.engine.layout import Unit
from fides_rag.generation.paths import PATH_KINDS
from fides_rag.rules.base import CONTEXT, ContrastRule, StepInputs


class _Index:
    """A host index tensor and its copies on the devices it was used on."""

    def __init__(self, values: Sequence | torch.Tensor) -> None:
        self.host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
        self._copies: dict[torch.device, torch.Tensor] = {}

    def on(self, device: torch.device) -> torch.Tensor:
        if device not in self._copies:
            self._copies[device] = self.host.to(device, non_blocking=True)
        return self._copies[device]


class _LanePlan:
    def __init__(
        self,
        rule: ContrastRule,
        units: list[Unit],
        lens_layers: tuple[int, ...],
        lens_position: dict[tuple[int, int], int],
        ends: EndTokens | None = None,
    ) -> None:
        self.rule, self.units, self.ends = rule, units, ends
        self.rows = {
            path: _Index([u.rows[path][0] for u in units])  # [n]
            for path in units[0].rows
            if not PATH_KINDS[path].padded
        }
        self.lens = {
            layer: _Index([lens_position[(layer, u.rows[CONTEXT][0])] for u in units]) for layer in lens_layers
        }
        self.padded: dict[str, tuple[_Index, _Index]] = {}
        """path -> its rows [n, N] (pads repeat a row) and where they are real [n, N], for paths of several rows."""
        for path in (p for p in units[0].rows if PATH_KINDS[p].padded):
            many = [u.rows[path] for u in units]
            most = max(len(d) for d in many)
            rows = _Index([d + d[:1] * (most - len(d)) for d in many])
            self.padded[path] = rows, _Index(torch.tensor([[True] * len(d) + [False] * (most - len(d)) for d in many]))

    def end_tokens(self, vocab: int, device: torch.device) -> torch.Tensor | None:
        """`StepInputs.end_tokens` of this lane's units at this step, for a rule that reads them; else None."""
        if not self.rule.reads_end_tokens or self.ends is None:
            return None
        return self.ends.for_units(self.units, vocab, device)


class LaneInputs:
    """Which rows feed which lane's paths, and which (layer, row) pairs need logit-lens logits."""

    def __init__(self, lanes: Sequence[Lane], num_rows: int, ends: EndTokens | None = None) -> None:
        """`ends`: where the lanes whose rule reads `StepInputs.end_tokens` get them (None: they get none)."""
        lens_rows: dict[int, list[int]] = {}
        for lane in lanes:
            for layer in lane.lens_layers:
                rows = lens_rows.setdefault(layer, [])
                for unit in lane.units:
                    if unit.rows[CONTEXT][0] not in rows:
                        rows.append(unit.rows[CONTEXT][0])
        lens_position: dict[tuple[int, int], int] = {}
        offset = num_rows
        for layer, rows in lens_rows.items():
            lens_position.update({(layer, row): offset + k for k, row in enumerate(rows)})
            offset += len(rows)
        self.lens_rows = {layer: _Index(rows) for layer, rows in lens_rows.items()}
        """layer -> the batch rows whose captured state goes through the lens, in logits order after the R rows."""
        self.lanes = [_LanePlan(lane.rule, lane.units, lane.lens_layers, lens_position, ends) for lane in lanes]

    def inputs(self, lane: int, logits: torch.Tensor, layer_states: torch.Tensor | None, num_layers: int) -> StepInputs:
        """Lane `lane`'s inputs: logits [R + n_lens, V]; layer_states [L, R, H] or None."""
        plan = self.lanes[lane]
        device = logits.device
        step = StepInputs(
            logits={path: logits[index.on(device)] for path, index in plan.rows.items()},  # [n, V] each
            lens_logits={layer: logits[index.on(device)] for layer, index in plan.lens.items()},
            num_layers=num_layers,
            end_tokens=plan.end_tokens(logits.shape[-1], device),
        )
        for path, (rows, present_rows) in plan.padded.items():
            present = present_rows.on(device)
            step.logits[path] = logits[rows.on(device)].masked_fill(~present[..., None], 0.0)  # [n, N, V]
            step.document_mask = present
        if layer_states is not None:
            for path in plan.rule.layer_state_paths:
                step.layer_states[path] = layer_states[:, plan.rows[path].on(layer_states.device)]  # [L, n, H]
        return step
