"""The prefix cache: KV states of every full block of every prompt row, found by a chained hash, so a later prompt
that starts with the same blocks skips computing them (requests on one template share its instructions and
demonstrations, chat requests their system prompt and documents, a request's paths what comes before its documents).

As in vLLM, a block's hash covers its parent block's hash, the block's tokens and the set of masked heads the row
runs with. It also covers where the prompt is cut into prefill chunks (`prefilling.chunk_cuts`: block-aligned,
fixed by the prompt alone, never by what is cached), since a state depends on the forward that computed it. A hit
resumes a prompt at a cut, so it skips whole leading chunks whose states are those its own forwards would compute:
tokens are the same with the cache on or off. Only chunks that end on a block boundary are stored (a prompt's last
chunk usually does not: its states are those of that prompt alone).

The cache is bounded in bytes and evicts the least recently used block, a chain's later blocks before its first. It
belongs to one engine, and is emptied when the engine's model or tokenizer changes.
"""

from __future__ import annotations

import collections
import copy
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_PREFIX_CACHE_BYTES = 512 * 2**20
"""Default bound of the prefix cache: 512 MiB of KV states."""
DEFAULT_PREFIX_BLOCK_SIZE = 16
"""Default tokens per cached block (the smallest prefill chunk, so every chunk cut can fall on a block boundary)."""


@dataclass
class PrefixCacheStats:
    hits: int = 0
    """Prompt rows whose prefill started from cached blocks."""
    misses: int = 0
    """Prompt rows that found none."""
    hit_tokens: int = 0
    """Prompt tokens taken from the cache instead of computed."""
    stored_blocks: int = 0
    evictions: int = 0
    """Blocks evicted to stay within the bytes bound."""


@dataclass
class _Block:
    kv: torch.Tensor | list[torch.Tensor]
    """The block's keys and values in every full-attention layer, in layer order (keys, values, keys, ...): one
    tensor [2 * layers, 1, kv_heads, block, d] where the layers' shapes agree (one copy), else one tensor each."""
    at_cut: list[Any] | None
    """Where the block ends a prefill chunk: per layer, a shell to rebuild the cache from (a sliding-window layer
    with its states; a full layer without); else None."""
    nbytes: int


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class PrefixCache:
    """Block hash -> that block's KV states (for one head set), LRU within `max_bytes`; 0 bytes disables it."""

    def __init__(
        self, max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES, block_size: int = DEFAULT_PREFIX_BLOCK_SIZE
    ) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"the prefix cache size must be a number of bytes >= 0 (0 disables it), got {max_bytes!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"prefix_block_size must be an integer >= 1 (tokens per cached block), got {block_size!r}")
        self.max_bytes = max_bytes
        self.block_size = block_size
        self.stats = PrefixCacheStats()
        self.bytes = 0
        self._blocks: collections.OrderedDict[bytes, _Block] = collections.OrderedDict()
        self._owner: tuple[int, int, int] | None = None

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._blocks)

    def bind(self, model: Any, tokenizer: Any) -> None:
        """Empty the cache unless it was filled with this model and tokenizer (objects and vocabulary)."""
        owner = (id(model), id(tokenizer), len(tokenizer))
        if owner != self._owner:
            self.clear()
            self._owner = owner

    def clear(self) -> None:
        self._blocks.clear()
        self.bytes = 0

    def block_hashes(self, tokens: Sequence[int], cuts: Sequence[int], head_key: tuple) -> list[bytes]:
        """The chained hash of every full block of `tokens`: parent hash, head set, the block's tokens, and whether
        a chunk cut falls at its end."""
        return self.extend_hashes([], tokens, cuts, head_key, len(tokens))

    def extend_hashes(
        self, hashes: list[bytes], tokens: Sequence[int], cuts: Sequence[int], head_key: tuple, end: int
    ) -> list[bytes]:
        """Extend `hashes`, the chained hashes of the leading full blocks of `tokens` known so far, in place to every
        full block of `tokens[:end]`, and return it; the blocks already in it are not hashed again."""
        size, cut_at = self.block_size, set(cuts)
        parent = hashes[-1] if hashes else hashlib.blake2b(repr((head_key, size)).encode(), digest_size=16).digest()
        for stop in range(size * (len(hashes) + 1), min(end, len(tokens)) + 1, size):
            block = repr((list(tokens[stop - size : stop]), stop in cut_at)).encode()
            parent = hashlib.blake2b(parent + block, digest_size=16).digest()
            hashes.append(parent)
        return hashes

    def lookup(
        self, tokens: Sequence[int], cuts: Sequence[int], head_key: tuple, hashes: list[bytes] | None = None
    ) -> tuple[int, list[Any] | None]:
        """The longest cached run of leading blocks that ends at a cut before the prompt's end: (its length, fresh
        cache layers holding its states), or (0, None). Sliding-window layers share the cached tensors, which are
        never written in place (nor are the full layers' views of their joined blocks). `hashes`: as for `store`."""
        if not self.enabled:
            return 0, None
        hashes = self.extend_hashes([] if hashes is None else hashes, tokens, cuts, head_key, len(tokens))
        found: list[_Block] = []
        resume = 0
        for number, key in enumerate(hashes, 1):
            block = self._blocks.get(key)
            if block is None or number * self.block_size >= len(tokens):
                break
            found.append(block)
            if block.at_cut is not None:
                resume = number
        if not resume:
            self.stats.misses += 1
            return 0, None
        self._touch(hashes[:resume])
        self.stats.hits += 1
        self.stats.hit_tokens += resume * self.block_size
        return resume * self.block_size, _rebuilt(found[:resume])

    def store(
        self,
        tokens: Sequence[int],
        cuts: Sequence[int],
        head_key: tuple,
        chunk: tuple[int, int],
        layers: Sequence[Any],
        hashes: list[bytes] | None = None,
    ) -> None:
        """Keep the blocks of the prefill chunk (start, end) just computed, `layers` being the row's cache after its
        first `end` tokens; a chunk that does not start and end on block boundaries is not kept. `hashes`: the
        prompt's leading block hashes known so far, kept by the caller across its chunks and extended here in place
        (`extend_hashes`), so each block of a prompt is hashed once."""
        (start, end), size = chunk, self.block_size
        if not self.enabled or end % size or start % size:
            return
        hashes = self.extend_hashes([] if hashes is None else hashes, tokens, cuts, head_key, end)[: end // size]
        for number in range(start // size + 1, end // size + 1):
            key = hashes[number - 1]
            if key in self._blocks:
                continue
            if number > 1 and hashes[number - 2] not in self._blocks:
                break  # its parent is gone: no lookup could reach it
            block = _block(layers, (number - 1) * size, size, at_cut=number * size in set(cuts))
            if not self._make_room(block.nbytes, keep=set(hashes[: number - 1])):
                break
            self._blocks[key] = block
            self.bytes += block.nbytes
            self.stats.stored_blocks += 1
        self._touch(hashes)

    def _make_room(self, nbytes: int, keep: set[bytes]) -> bool:
        """Evict least recently used blocks, never those in `keep` (the chain being stored), until `nbytes` fit."""
        if self.bytes + nbytes <= self.max_bytes:
            return True
        if nbytes > self.max_bytes:
            return False
        for key in [k for k in self._blocks if k not in keep]:
            self.bytes -= self._blocks.pop(key).nbytes
            self.stats.evictions += 1
            if self.bytes + nbytes <= self.max_bytes:
                return True
        return False

    def _touch(self, hashes: Sequence[bytes]) -> None:
        """Mark a chain used: its first block the most recent, so eviction takes chains from their ends."""
        for key in reversed(hashes):
            if key in self._blocks:
                self._blocks.move_to_end(key)


def _sliding(layer: Any) -> bool:
    return getattr(layer, "is_sliding", False)


def _block(layers: Sequence[Any], start: int, size: int, at_cut: bool) -> _Block:
    """Positions [start, start + size) of each full layer (copies), and the shells at a chunk's end."""
    parts = [
        t[..., start : start + size, :] for layer in layers if not _sliding(layer) for t in (layer.keys, layer.values)
    ]
    kv = torch.stack(parts) if parts and all(p.shape == parts[0].shape for p in parts) else [p.clone() for p in parts]
    nbytes = _nbytes(*kv) if isinstance(kv, list) else _nbytes(kv)
    shells = None
    if at_cut:
        shells = []
        for layer in layers:
            shell = copy.copy(layer)
            if _sliding(layer):
                shell.keys, shell.values = layer.keys.clone(), layer.values.clone()  # sliding layers hold views
                nbytes += _nbytes(shell.keys, shell.values)
            else:
                shell.keys = shell.values = None
            shells.append(shell)
    return _Block(kv, shells, nbytes)


def _rebuilt(blocks: Sequence[_Block]) -> list[Any]:
    """Cache layers after `blocks` (the last one ends at a chunk cut)."""
    kv: torch.Tensor | list[torch.Tensor]
    if isinstance(blocks[0].kv, torch.Tensor):
        kv = torch.cat([b.kv for b in blocks], dim=-2)  # type: ignore[misc]  # one copy; each layer's states are views of it
    else:
        kv = [torch.cat([b.kv[i] for b in blocks], dim=-2) for i in range(len(blocks[0].kv))]
    layers, at = [], 0
    for shell in blocks[-1].at_cut:  # type: ignore[union-attr]  # the last block ends at a cut
        layer = copy.copy(shell)
        if not _sliding(shell):
            layer.keys, layer.values = kv[at], kv[at + 1]
            at += 2
        layers.append(layer)
    return layers


def head_key(heads: dict[int, tuple[int, ...]] | None) -> tuple:
    """A hashable name of a set of masked heads (the states of masked rows differ from the plain rows')."""
    return tuple(sorted((layer, tuple(h)) for layer, h in heads.items())) if heads else ()
