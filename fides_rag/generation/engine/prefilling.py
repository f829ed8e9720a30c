"""Chunked prefill: each prompt row of an admitted request is encoded in chunks, one forward per chunk, over as
many steps as the scheduler's token budget needs; when every row of the request is done its rows join the
running decode.

Where a prompt is cut depends on the prompt alone (its template's fixed prefix, what it shares with the request's
other prompts, and multiples of the chunk size, each rounded down to a block of the prefix cache), never on what
else is in flight or cached: a request is computed by the same forwards alone, under load, and with the prefix
cache on or off, so its tokens and recorded values are the same in every case.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fides_rag.generation.engine.block_manager import PromptBlocks
from fides_rag.generation.engine.hooks import HeadMasker, LayerCapture
from fides_rag.generation.engine.kv_cache import DecodeCache, Prefilled, ragged_cache
from fides_rag.generation.engine.layout import GroupSpec
from fides_rag.generation.engine.prefix_cache import PrefixCache, head_key
from fides_rag.generation.prompting import common_prefix
from fides_rag.method.lens import ModelAnatomy

MIN_SHARED = 16
"""A shared prefix shorter than this is not worth a forward of its own: no cut (and no cache entry) there."""


def chunk_cuts(length: int, chunk: int, anchors: Sequence[int], block: int = 1) -> list[int]:
    """Where a prompt of `length` tokens is cut: at every anchor inside it and every multiple of `chunk`, each
    rounded down to a multiple of `block`; the last cut is `length`. Chunks are at most max(chunk, block) tokens."""
    stride = max(block, chunk // block * block)
    aligned = {a // block * block for a in anchors if 0 < a < length}
    cuts = {a for a in aligned if a > 0} | set(range(stride, length, stride)) | {length}
    return sorted(cuts)


@dataclass(eq=False)
class RowPrefill:
    """One prompt row being prefilled: its ids, its cuts, and its cache so far."""

    ids: list[int]
    head_set: int
    head_key: tuple
    cuts: list[int]
    done: int = 0
    """Prompt tokens in `cache` (a cut)."""
    started: bool = False
    cache: Any = None
    hidden: torch.Tensor | None = None
    """[1, H] final-normed state of the last prompt token, once done."""
    states: dict[int, torch.Tensor] = field(default_factory=dict)
    """layer -> [1, H] captured block output at the last prompt token, once done."""
    block_hashes: list[bytes] = field(default_factory=list)
    """The prefix cache's chained hashes of its leading full blocks, as far as its lookup and stores have hashed
    them (each block once)."""

    @property
    def finished(self) -> bool:
        return self.done == len(self.ids)

    def prompt_blocks(self, prefixes: PrefixCache) -> PromptBlocks:
        """Its full blocks' chained hashes (the prefix cache's), and the block counts where its chunk cuts fall."""
        size = prefixes.block_size
        hashes = prefixes.block_hashes(self.ids, self.cuts, self.head_key)
        cut_blocks = [c // size for c in self.cuts if c < len(self.ids) and c % size == 0]
        return PromptBlocks(hashes, cut_blocks)

    def next_cut(self) -> int:
        return next(c for c in self.cuts if c > self.done)

    def start(self, anatomy: ModelAnatomy, prefixes: PrefixCache) -> None:
        """Take the longest cached prefix ending at one of the row's cuts (the whole prompt never: its last
        states are computed)."""
        self.started = True
        self.cache = DecodeCache(config=anatomy.config, padded=False)
        length, layers = prefixes.lookup(self.ids, self.cuts, self.head_key, self.block_hashes)
        if layers is not None:
            self.cache.layers = layers
            self.done = length

    def run_chunk(
        self,
        anatomy: ModelAnatomy,
        device: torch.device,
        capture: LayerCapture,
        masker: HeadMasker | None,
        prefixes: PrefixCache,
    ) -> int:
        """Encode the next chunk; returns its token count."""
        end = self.next_cut()
        ids = torch.tensor([self.ids[self.done : end]], dtype=torch.long).to(device, non_blocking=True)  # [1, n]
        positions = torch.arange(self.done, end, device=ids.device)[None]  # [1, n]
        if masker is not None:
            masker.set_rows([self.head_set])
        hidden, self.cache = anatomy.run_backbone(ids, None, positions, self.cache)
        prefixes.store(self.ids, self.cuts, self.head_key, (self.done, end), self.cache.layers, self.block_hashes)
        computed, self.done = end - self.done, end
        if self.finished:
            self.hidden = hidden[:, -1, :].clone()
            self.states = dict(capture.states)
        return computed


@dataclass(eq=False)
class TicketPrefill:
    """Every prompt row of one admitted request, in its row groups' order."""

    ticket: Any
    groups: list[GroupSpec]
    rows: list[RowPrefill]
    pinned: list[list[int]] | None = None
    """Per row, the kept pool blocks held for it since its admission (it takes them by reference when it joins)."""
    prompt_blocks: list[PromptBlocks] | None = None
    """Per row, its prompt blocks' hashes and cut blocks, computed once (at admission, or when it joins) and reused."""

    @property
    def finished(self) -> bool:
        return all(row.finished for row in self.rows)

    @property
    def remaining(self) -> int:
        return sum(len(r.ids) - r.done for r in self.rows)

    def pending(self) -> list[RowPrefill]:
        return [r for r in self.rows if not r.finished]

    def _last_hidden(self) -> list[torch.Tensor]:
        """Every row's [1, H] last state: set by its last chunk, which every row has run once the request is
        `finished` (a prefix cache hit never covers the whole prompt)."""
        hidden = [r.hidden for r in self.rows if r.hidden is not None]
        if len(hidden) != len(self.rows):
            raise RuntimeError("a request's rows are read before every row finished its prefill")
        return hidden

    def prefilled(self, config: Any) -> Prefilled:
        """The rows' states laid out as one prefill's: a ragged cache, the left-padded mask and last positions."""
        lengths = [len(r.ids) for r in self.rows]
        width = max(lengths)
        last_hidden = self._last_hidden()
        device = last_hidden[0].device
        mask = torch.zeros((len(lengths), width), dtype=torch.bool)
        for i, n in enumerate(lengths):
            mask[i, width - n :] = True
        positions = torch.tensor([[n - 1] for n in lengths], dtype=torch.long)
        cache = ragged_cache([r.cache for r in self.rows], config, padded=len(set(lengths)) > 1)
        hidden = torch.cat(last_hidden)
        return Prefilled(hidden, cache, mask.to(device, non_blocking=True), positions.to(device, non_blocking=True))

    def states(self, layers: Sequence[int]) -> dict[int, torch.Tensor]:
        """layer -> [n, H] captured states of every row (zeros at a layer a row's forward did not capture: no rule
        of this request reads it there)."""
        out = {}
        for layer in layers:
            parts = [r.states.get(layer) for r in self.rows]
            like = next((p for p in parts if p is not None), None)
            if like is None:
                like = self._last_hidden()[0]
            out[layer] = torch.cat([p if p is not None else torch.zeros_like(like) for p in parts])
        return out


def row_prefills(
    groups: Sequence[GroupSpec], chunk: int, references: Sequence[Sequence[int]], heads: Sequence[Any], block: int = 1
) -> list[RowPrefill]:
    """One `RowPrefill` per sequence of `groups`, cut at its anchors, the length of what it shares with each of
    `references` (the example's context and no-context prompts, its template's fixed prefixes: properties of the
    example, whatever methods decode it), and at every multiple of `chunk`, on multiples of `block` (the prefix
    cache's). `heads[s]`: head set s (cache key)."""
    rows = []
    for group in groups:
        for seq in group.sequences:
            anchors = [common_prefix(seq, reference) for reference in references]
            key = head_key(heads[group.head_set]) if group.head_set >= 0 else ()
            inside = [a for a in anchors if MIN_SHARED <= a < len(seq)]
            rows.append(RowPrefill(list(seq), group.head_set, key, chunk_cuts(len(seq), chunk, inside, block)))
    return rows
