"""Result assembly: the values rules record stay on the device while decoding and reach the host in one
transfer at the end; then each unit becomes a `GenerationResult`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fides_rag.generation.layout import Unit
from fides_rag.generation.prompting import PreparedExample
from fides_rag.generation.stopping import first_stop_index
from fides_rag.result import GenerationResult, StepRecord
from fides_rag.rules.base import NO_CONTEXT, ContrastRule


class RecordBuffer:
    """Per-step recorded values of every unit, kept on the device until `flush`."""

    def __init__(self) -> None:
        self._pending: list[tuple[list[StepRecord], list[str], torch.Tensor]] = []

    def add(self, records: list[StepRecord], values: dict[str, torch.Tensor]) -> None:
        """`values`: name -> [n] for the n step records of one lane's step."""
        if values:
            names = list(values)
            device = values[names[0]].device
            stacked = torch.stack([values[name].detach().to(device, torch.float32).reshape(-1) for name in names], dim=-1)  # [n, K]
            self._pending.append((records, names, stacked))

    def flush(self) -> None:
        """Move every pending value to the host at once and fill the step records."""
        if not self._pending:
            return
        devices = {t.device for _, _, t in self._pending}
        target = next(iter(devices))
        flat = torch.cat([t.to(target).reshape(-1) for _, _, t in self._pending]).tolist()  # the one transfer
        at = 0
        for records, names, stacked in self._pending:
            for record in records:
                record.values = dict(zip(names, flat[at : at + len(names)]))
                at += len(names)
        self._pending = []


def assemble(
    example: PreparedExample,
    unit: Unit,
    effective: ContrastRule,
    requested: ContrastRule,
    stops: tuple[str, ...],
    decode: Callable[[list[int]], str],
) -> GenerationResult:
    """The result of `unit`: its text cut at the first stop string, its records, and how it came to be."""
    text = decode(unit.generated)
    cut = first_stop_index(text, stops)
    if cut is not None:
        text = text[:cut]
    return GenerationResult(
        text=text.strip(),
        token_ids=list(unit.generated),
        steps=list(unit.steps),
        method=effective.name,
        requested_method=requested.name,
        method_options=effective.options(),
        finish_reason=unit.finish_reason or "length",
        context_prompt=example.context_prompt,
        no_context_prompt=example.no_context_prompt if NO_CONTEXT in effective.paths else None,
        prompt_tokens=len(example.context_ids),
        notes=list(example.notes),
        documents_trimmed=example.documents_trimmed,
        document_tokens=example.document_tokens,
    )
