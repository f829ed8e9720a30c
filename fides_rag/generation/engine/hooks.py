"""Forward hooks of a decode, as context managers that always remove themselves: capturing the last-position
output of chosen blocks (Shift, logit lens) and zeroing chosen attention heads on chosen rows (DeCoRe)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from fides_rag.method.lens import ModelAnatomy


class LayerCapture:
    """Keeps a copy of the last position of each hooked block's output after every forward.

    `states[l]` is [R, H]: a copy, so a prefill's [R, T, H] block outputs are freed, never pinned by a view.

    >>> with LayerCapture(anatomy, layers=(4, 8)) as capture:
    ...     anatomy.backbone(input_ids=ids)
    ...     capture.states[4]
    """

    def __init__(self, anatomy: ModelAnatomy, layers: Iterable[int]) -> None:
        self.anatomy = anatomy
        self.layers = tuple(sorted(set(layers)))
        self.states: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []

    def _hook(self, layer: int):
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output  # [R, T, H]
            self.states[layer] = hidden[:, -1, :].clone()  # [R, H]

        return hook

    def __enter__(self) -> LayerCapture:
        self._handles = [
            self.anatomy.layers[layer - 1].register_forward_hook(self._hook(layer)) for layer in self.layers
        ]
        return self

    def __exit__(self, *_exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def stack_states(states: Mapping[int, torch.Tensor], layers: Sequence[int], device: torch.device) -> torch.Tensor:
    """Captured states of `layers` (layer -> [R, H]), on one device, in float32.  -> [len(layers), R, H]"""
    return torch.stack([states[layer].to(device) for layer in layers]).float()


def _table_device(weight: torch.Tensor) -> torch.device:
    # Offloaded (accelerate) weights live on "meta" until their hook loads them: keep the table on the CPU.
    return torch.device("cpu") if weight.device.type == "meta" else weight.device


class HeadMasker:
    """Zeroes chosen attention heads' outputs on chosen rows: a forward pre-hook on each affected block's
    attention output projection, whose input holds the heads' outputs side by side, [R, T, heads * head_dim].

    `head_sets[s]` maps 1-based layers to head indices; `set_rows` says which set (or -1: none) each row uses.
    """

    def __init__(self, anatomy: ModelAnatomy, head_sets: Sequence[Mapping[int, tuple[int, ...]]]) -> None:
        self.anatomy = anatomy
        projections = anatomy.attention_output_projections()
        dim = anatomy.head_dim
        self._projections = projections
        self._tables: dict[int, torch.Tensor] = {}
        """layer -> [1 + S, heads * head_dim] multipliers: row 0 keeps every head, row 1 + s zeroes set s's heads."""
        for layer in sorted(set().union(*head_sets)) if head_sets else ():
            weight = projections[layer - 1].weight
            table = torch.ones(
                1 + len(head_sets), projections[layer - 1].in_features, dtype=weight.dtype, device=_table_device(weight)
            )
            for s, heads in enumerate(head_sets, 1):
                for h in heads.get(layer, ()):
                    table[s, h * dim : (h + 1) * dim] = 0
            self._tables[layer] = table
        self._keep: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []

    def set_rows(self, row_sets: Sequence[int]) -> None:
        """The head set (index, or -1 for none) of every row of the forwards that follow."""
        if all(s < 0 for s in row_sets):
            self._keep = {}
            return
        index = [s + 1 for s in row_sets]
        self._keep = {
            layer: table[torch.tensor(index, dtype=torch.long, device=table.device)]  # [R, heads * head_dim]
            for layer, table in self._tables.items()
        }

    def _hook(self, layer: int):
        def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            keep = self._keep.get(layer)
            if keep is None:
                return None
            heads_out = args[0]  # [R, T, heads * head_dim]
            if heads_out.shape[0] != keep.shape[0]:
                raise RuntimeError(
                    f"head mask for {keep.shape[0]} rows applied to a forward of {heads_out.shape[0]} rows"
                )
            return (heads_out * keep[:, None, :].to(heads_out.device, heads_out.dtype), *args[1:])

        return hook

    def __enter__(self) -> HeadMasker:
        self._handles = [
            self._projections[layer - 1].register_forward_pre_hook(self._hook(layer)) for layer in self._tables
        ]
        return self

    def __exit__(self, *_exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._keep = {}
