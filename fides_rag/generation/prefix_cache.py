"""The prefix cache: KV states computed for a prompt's first tokens, kept for later prompts that start with the
same tokens (every request on one template shares its instructions and demonstrations; a request's paths share
what comes before its documents).

Entries are stored only at a prompt's chunk cuts (see `prefilling.chunk_cuts`), which do not depend on what is
cached, so a prompt is computed by the same forwards with the cache on or off: a hit reuses bitwise the states the
forwards would compute. The cache is bounded in bytes and evicts the least recently used entry. It belongs to one
engine, and its keys hold the identity of the model and tokenizer it was filled with: a change of either empties it.
"""

from __future__ import annotations

import collections
import copy
from dataclasses import dataclass
from typing import Any

DEFAULT_PREFIX_CACHE_BYTES = 512 * 2**20
"""Default bound of the prefix cache: 512 MiB of KV states."""


@dataclass
class PrefixCacheStats:
    hits: int = 0
    """Prompt rows whose prefill started from a cached prefix."""
    misses: int = 0
    """Prompt rows that found no cached prefix."""
    hit_tokens: int = 0
    """Prompt tokens taken from the cache instead of computed."""
    evictions: int = 0


def _layer_bytes(layer: Any) -> int:
    return sum(t.numel() * t.element_size() for t in (layer.keys, layer.values) if t is not None)


class PrefixCache:
    """Token prefix -> the KV cache layers after it (for one head set), LRU within `max_bytes`; 0 disables it."""

    def __init__(self, max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"the prefix cache size must be a number of bytes >= 0 (0 disables it), got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.stats = PrefixCacheStats()
        self.bytes = 0
        self._entries: collections.OrderedDict[tuple, tuple[list[Any], int]] = collections.OrderedDict()
        self._owner: tuple[int, int] | None = None

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def bind(self, model: Any, tokenizer: Any) -> None:
        """Empty the cache unless it was filled with this model and tokenizer (objects and vocabulary)."""
        owner = (id(model), id(tokenizer), len(tokenizer))
        if owner != self._owner:
            self.clear()
            self._owner = owner

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def lookup(self, tokens: list[int], cuts: list[int], head_key: tuple) -> tuple[int, list[Any] | None]:
        """The longest cached prefix of `tokens` ending at one of `cuts` (ascending): (its length, fresh copies of
        its cache layers), or (0, None). The copies share the cached tensors, which are never written in place."""
        if not self.enabled:
            return 0, None
        for cut in reversed(cuts):
            key = (head_key, tuple(tokens[:cut]))
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                self.stats.hit_tokens += cut
                return cut, [copy.copy(layer) for layer in found[0]]
        self.stats.misses += 1
        return 0, None

    def store(self, tokens: list[int], head_key: tuple, layers: list[Any]) -> None:
        """Keep a copy of `layers` (the cache after exactly `tokens`), evicting the least recently used entries."""
        if not self.enabled:
            return
        key = (head_key, tuple(tokens))
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        kept = []
        for layer in layers:
            stored = copy.copy(layer)
            stored.keys, stored.values = layer.keys.clone(), layer.values.clone()  # sliding layers hold views
            kept.append(stored)
        size = sum(_layer_bytes(layer) for layer in kept)
        if size > self.max_bytes:
            return
        while self.bytes + size > self.max_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
            self.stats.evictions += 1
        self._entries[key] = (kept, size)
        self.bytes += size


def head_key(heads: dict[int, tuple[int, ...]] | None) -> tuple:
    """A hashable name of a set of masked heads (the states of masked rows differ from the plain rows')."""
    return tuple(sorted((layer, tuple(h)) for layer, h in heads.items())) if heads else ()
