"""Lanes: the units in flight grouped by what one `combine` and one choice per step can serve together (the
same rule, the same masked heads, the same sampling settings). Requests under different methods or sampling
settings share every forward; each lane runs its own rule and warpers over its own rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from transformers import LogitsProcessorList

from fides_rag.generation.engine.layout import Unit
from fides_rag.generation.settings import GenerationSettings
from fides_rag.rules.base import ContrastRule
from fides_rag.rules.registry import is_registered


def lane_key(rule: ContrastRule, settings: GenerationSettings, head_set: int) -> tuple:
    """Units with equal keys decode in one lane: equal heads and sampling, and rules of one registered type with
    equal options (its `options()` describe it fully), or else the same rule object."""
    if is_registered(rule):
        identity: object = (type(rule), rule.name, json.dumps(rule.options(), sort_keys=True, default=str))
    else:
        identity = id(rule)
    return (identity, head_set, settings.sampling_key())


class Lane:
    """Units decoded by one rule under one set of sampling settings."""

    def __init__(self, key: tuple, rule: ContrastRule, settings: GenerationSettings, num_layers: int) -> None:
        self.key = key
        self.rule = rule
        self.warpers: LogitsProcessorList = settings.sampling_warpers()
        self.do_sample = settings.do_sample
        self.lens_layers: tuple[int, ...] = tuple(rule.lens_layers(num_layers))
        self.units: list[Unit] = []

    @property
    def needs_layer_states(self) -> bool:
        return bool(self.rule.layer_state_paths)

    def __repr__(self) -> str:
        return f"Lane({self.rule!r}, units={len(self.units)})"


class Lanes:
    """The lanes of the running decode, in order of creation; a lane with no unit left is dropped."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self._lanes: dict[tuple, Lane] = {}

    def add(self, unit: Unit, rule: ContrastRule, settings: GenerationSettings, head_set: int) -> Lane:
        key = lane_key(rule, settings, head_set)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(key, rule, settings, self.num_layers)
        lane.units.append(unit)
        return lane

    def keep(self, active: Any) -> None:
        """Keep only the units for which `active(unit)` holds; drop lanes left empty."""
        for key in list(self._lanes):
            lane = self._lanes[key]
            lane.units = [u for u in lane.units if active(u)]
            if not lane.units:
                del self._lanes[key]

    def __iter__(self):
        return iter(list(self._lanes.values()))

    def __len__(self) -> int:
        return len(self._lanes)

    @property
    def units(self) -> list[Unit]:
        return [u for lane in self._lanes.values() for u in lane.units]

    def capture_layers(self, coming: Sequence[ContrastRule] = ()) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(layers whose per-layer states some rule reads, every layer to capture: those and the lens layers, of the
        lanes' rules and of the `coming` rules of requests still being prefilled)."""
        every = tuple(range(1, self.num_layers + 1))
        state_layers = every if any(lane.needs_layer_states for lane in self._lanes.values()) else ()
        lens = {layer for lane in self._lanes.values() for layer in lane.lens_layers}
        for rule in coming:
            lens |= set(every if rule.layer_state_paths else ()) | set(rule.lens_layers(self.num_layers))
        return state_layers, tuple(sorted({*state_layers, *lens}))
