"""A decode advanced step by step: for streaming, for cancelling one request's rows mid-decode, and for the
request batcher. Iterating it runs one step per iteration (holding the decoder's lock until it ends)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from fides_rag.generation.layout import Unit
from fides_rag.generation.prompting import PreparedExample
from fides_rag.generation.results import assemble
from fides_rag.generation.settings import GenerationSettings, RowSettings
from fides_rag.result import GenerationResult
from fides_rag.rules.base import ContrastRule

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder


class DecodeRun:
    """Examples decoded together under one rule; each may hold its own budget, stop strings and seed.

    >>> run = DecodeRun(decoder, examples, rule, rule, settings)
    >>> for _ in run:
    ...     print(run.text(0))      # the growing answer of example 0
    >>> run.result(0)
    """

    def __init__(
        self,
        decoder: FidesDecoder,
        examples: Sequence[PreparedExample],
        effective: ContrastRule,
        requested: Sequence[ContrastRule] | ContrastRule,
        settings: GenerationSettings,
        rows: Sequence[RowSettings] | None = None,
    ) -> None:
        self.decoder = decoder
        self.examples = list(examples)
        self.effective = effective
        self.requested = list(requested) if isinstance(requested, Sequence) else [requested] * len(self.examples)
        self.settings = settings
        self.rows = list(rows) if rows is not None else [RowSettings.of(settings)] * len(self.examples)
        self._heads = decoder.setup_rules([effective])  # the rule's setup hook, once, before any decoding
        self._units: list[Unit] | None = None

    def __iter__(self) -> Iterator[DecodeRun]:
        for units in self.decoder._decode_steps(self.examples, [self.effective], self.settings, self._heads, self.rows):
            self._units = units[0]
            yield self

    def text(self, index: int) -> str:
        """Example `index`'s generated text so far (not yet cut at stop strings)."""
        return "" if self._units is None else self.decoder.decode_text(self._units[index].generated)

    def finished(self, index: int) -> bool:
        return self._units is not None and self._units[index].finish_reason is not None

    def cancel(self, index: int) -> None:
        """Stop decoding example `index`: its rows leave the batch after the current step."""
        if self._units is not None and self._units[index].finish_reason is None:
            self._units[index].finish_reason = "cancelled"

    def result(self, index: int) -> GenerationResult:
        """Example `index`'s result (once the run is exhausted, or once that example finished)."""
        if self._units is None:
            raise RuntimeError("the run has not decoded anything yet: iterate it first")
        unit = self._units[index]
        return assemble(self.examples[index], unit, self.effective, self.requested[index], unit.stop, self.decoder.decode_text)
