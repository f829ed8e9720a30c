"""The KV cache of a decode: prefill of every row group (jointly, or one forward per group), the ragged
cache that holds each group at its own length, and pruning of finished rows.

Why ragged: the context prompt is longer than the no-context prompt (by the documents). Stacking both into
one [R, kv_heads, T, d] tensor left-pads the short rows to the long ones, so FIDES held 2x standard's KV
bytes when the no-context prompt is short. A `RaggedLayer` keeps each group of rows (a segment) in its own
tensor at its own length and appends every step's keys to each segment in place; the attention call
takes each segment as it is (`ragged_attention.py`), so a decode step writes no copy of the cache, and one
batched forward per step is kept.
Per-path caches run as separate forwards would cost about 1.3x per step on a 2-core CPU (batch 2 vs two
batch-1 forwards) and read the weights twice on a GPU; transformers' paged cache needs flattened inputs
and its paged attention kernels, which the logit lens and head hooks do not fit.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from fides_rag.generation.engine.hooks import HeadMasker, LayerCapture
from fides_rag.generation.engine.ragged_attention import hand_over
from fides_rag.method.lens import ModelAnatomy


@dataclass
class RowGroup:
    """Prompts encoded together at prefill: one path of every example (or every document of every example)."""

    ids: torch.Tensor
    """[n, T] left-padded input ids."""
    mask: torch.Tensor
    """[n, T] attention mask."""
    head_set: int = -1
    """Index of the set of masked attention heads these rows run with; -1 for none."""


@dataclass
class Prefilled:
    """What the prefill hands to the decode loop."""

    last_hidden: torch.Tensor
    """[R, H] final-normed state of every row's last prompt token (a copy)."""
    cache: Any
    attention_mask: torch.Tensor
    """[R, T] over the merged cache."""
    positions: torch.Tensor
    """[R, 1] position id of every row's last prompt token (real tokens count from 0)."""


class DecodeCache(DynamicCache):
    """A DynamicCache whose decode steps never synchronise with the host in mask creation.

    transformers' SDPA mask builder tests on every one-token step whether the padding mask is all ones, to
    skip building the mask (`fast_all(padding_mask)`: a host sync per forward). It skips that test for caches
    that say `is_compileable`, its only use of the flag, and builds the [R, 1, 1, T] boolean mask instead,
    which our left-padded batches need anyway. Rows of equal length (`padded=False`) need no mask: the decode
    forwards pass none, and the cache does not claim `is_compileable`, so transformers builds none either
    (no test, no sync; building it cost standard decoding about 10% per token on CPU)."""

    def __init__(self, *args: Any, padded: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.padded = padded

    @property
    def is_compileable(self) -> bool:
        return self.padded


def left_padded(sequences: Sequence[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask [N, T] for left-padded sequences (built on the host, copied once)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[i, width - len(seq) :] = 1
    return ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)


def pad_left(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def mergeable(cache: Any) -> bool:
    """Whether a `RaggedLayer` can hold the cache's layer types (dynamic, sliding-window)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return False
    return all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


def _kv(layer: CacheLayerMixin) -> tuple[torch.Tensor, torch.Tensor]:
    """A held layer's keys and values. transformers types them optional (None until a layer's first update, or
    after `reset`); every layer the decode cache holds comes from a prefill and is never reset, so they are set."""
    keys, values = layer.keys, layer.values
    if keys is None or values is None:
        raise RuntimeError("a cache layer without keys or values: the decode cache holds prefilled layers only")
    return keys, values


class RaggedLayer(CacheLayerMixin):
    """One attention layer's KV cache held as segments: consecutive rows with their own length each.

    Every segment is a transformers `DynamicLayer` or `DynamicSlidingWindowLayer`, which does its own
    appending and window truncation; this class only splits the step's new states by segment and hands the
    segments to the attention call as they are (`ragged_attention.py`), or, where the model's attention cannot
    take them so, pads them to a common length for it (a transient copy, one layer at a time)."""

    is_compileable = True

    def __init__(self, segments: list[DynamicLayer]) -> None:  # no super().__init__: keys/values are views here
        self.segments = segments
        self.is_sliding = segments[0].is_sliding
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a RaggedLayer is built from prefilled segments")

    @property
    def keys(self) -> torch.Tensor:  # type: ignore[override]  # a padded copy: read-only
        """[R, kv_heads, T, d], padded (a copy; for inspection, not used by the attention)."""
        return _stack([_kv(seg)[0] for seg in self.segments])

    @property
    def values(self) -> torch.Tensor:  # type: ignore[override]  # a padded copy: read-only
        return _stack([_kv(seg)[1] for seg in self.segments])

    def _rows(self) -> list[int]:
        return [_kv(seg)[0].shape[0] for seg in self.segments]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self.segments) == 1:
            return self.segments[0].update(key_states, value_states, *args, **kwargs)
        keys, values, at = [], [], 0
        for seg, rows in zip(self.segments, self._rows()):
            k, v = seg.update(key_states[at : at + rows], value_states[at : at + rows], *args, **kwargs)
            keys.append(k)
            values.append(v)
            at += rows
        if hand_over(list(zip(keys, values))):  # the attention call takes each segment as it is
            return keys[0], values[0]
        return _stack(keys), _stack(values)  # [R, kv_heads, T_max + q, d] for this layer's attention only

    def _longest(self) -> DynamicLayer:
        return max(self.segments, key=lambda seg: seg.get_seq_length())

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._longest().get_mask_sizes(query_length)

    def get_seq_length(self) -> int:
        return self._longest().get_seq_length()

    def get_max_length(self) -> int:
        return self.segments[0].get_max_length()

    def batch_select_indices(self, indices: Sequence[int]) -> None:
        """Keep rows `indices` (in that order, repeats allowed); consecutive rows of one segment stay together."""
        owner = [(s, r) for s, rows in enumerate(self._rows()) for r in range(rows)]
        runs: list[tuple[int, list[int]]] = []
        for index in indices:  # a host list: no device sync
            segment, row = owner[index]
            if runs and runs[-1][0] == segment:
                runs[-1][1].append(row)
            else:
                runs.append((segment, [row]))
        kept = []
        for segment, rows in runs:
            part = copy.copy(self.segments[segment])
            keys, values = _kv(part)
            select = torch.tensor(rows, dtype=torch.long)
            part.keys, part.values = (
                keys[select.to(keys.device, non_blocking=True)],
                values[select.to(values.device, non_blocking=True)],
            )
            kept.append(part)
        self.segments = _merge_equal_lengths(kept)


def _stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """Segments' states, left-padded with zeros to the longest, in one new tensor (one copy of each)."""
    if len(parts) == 1:
        return parts[0]
    length = max(part.shape[-2] for part in parts)
    first = parts[0]
    out = first.new_empty((sum(part.shape[0] for part in parts), *first.shape[1:-2], length, first.shape[-1]))
    at = 0
    for part in parts:
        rows, pad = part.shape[0], length - part.shape[-2]
        out[at : at + rows, ..., :pad, :].zero_()
        out[at : at + rows, ..., pad:, :] = part
        at += rows
    return out


class GrowableLayer(DynamicLayer):
    """A full-attention cache layer that appends each step's states in place, into spare room grown by
    max(16, 1/16) positions at a time, where transformers' DynamicLayer copies the whole history on
    every step (torch.cat). `keys`/`values` are views of the filled part."""

    SPARE_MIN = 16

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._length = 0
        super().__init__()
        self.keys, self.values = keys, values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[..., : self._length, :]

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._keys = tensor
        self._length = 0 if tensor is None else tensor.shape[-2]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[..., : self._length, :]

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._values = tensor

    @property
    def nbytes(self) -> int:
        """Bytes held, spare room included."""
        return sum(t.numel() * t.element_size() for t in (self._keys, self._values) if t is not None)

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers (spare room included): set at construction, and None again only after
        transformers' `reset`, which the decode cache never calls."""
        if self._keys is None or self._values is None:
            raise RuntimeError("a GrowableLayer without key or value buffers: it is built from prefilled states")
        return self._keys, self._values

    def _reserve(self, needed: int) -> None:
        keys, values = self._buffers()
        if needed <= keys.shape[-2]:
            return
        capacity = needed + max(self.SPARE_MIN, needed // 16)
        grown = []
        for buffer in (keys, values):
            bigger = buffer.new_empty((*buffer.shape[:-2], capacity, buffer.shape[-1]))
            bigger[..., : self._length, :] = buffer[..., : self._length, :]
            grown.append(bigger)
        self._keys, self._values = grown

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        new = key_states.shape[-2]
        self._reserve(self._length + new)
        keys, values = self._buffers()
        keys[..., self._length : self._length + new, :] = key_states
        values[..., self._length : self._length + new, :] = value_states
        self._length += new
        return keys[..., : self._length, :], values[..., : self._length, :]  # the filled part, as `keys`/`values`

    def get_seq_length(self) -> int:
        return self._length

    def batch_select_indices(self, indices: Any) -> None:
        length = self._length
        keys, values = self._buffers()
        self._keys, self._values = keys[indices, ...], values[indices, ...]
        self._length = length

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("fides-rag's decode cache is never cropped")


def _merge_equal_lengths(segments: list[DynamicLayer]) -> list[DynamicLayer]:
    """Join neighbouring segments that hold the same length and history (they need no padding)."""
    merged = [segments[0]]
    for seg in segments[1:]:
        last = merged[-1]
        (last_keys, last_values), (keys, values) = _kv(last), _kv(seg)
        same = last_keys.shape[-2] == keys.shape[-2] and getattr(last, "cumulative_length", 0) == getattr(
            seg, "cumulative_length", 0
        )
        if same:
            joined = copy.copy(last)
            joined.keys, joined.values = torch.cat([last_keys, keys]), torch.cat([last_values, values])
            merged[-1] = joined
        else:
            merged.append(seg)
    return merged


def _growable(layer: DynamicLayer) -> DynamicLayer:
    """Full-attention layers append in place from now on; sliding-window layers stay as they are (bounded)."""
    return GrowableLayer(*_kv(layer)) if type(layer) is DynamicLayer else layer


def ragged_cache(caches: Sequence[Any], config: Any, padded: bool = True) -> DecodeCache:
    """One cache over the row groups of `caches` (in order), each kept at its own length."""
    cache = DecodeCache(config=config, padded=padded)
    cache.layers = [
        RaggedLayer(_merge_equal_lengths([_growable(c.layers[i]) for c in caches]))
        for i in range(len(caches[0].layers))
    ]
    return cache


def cache_bytes(cache: Any) -> int:
    """Bytes held by a cache's key and value tensors (every segment of a ragged layer)."""
    total = 0
    for layer in cache.layers:
        for part in getattr(layer, "segments", [layer]):
            held = getattr(part, "nbytes", None)
            total += (
                held
                if held is not None
                else sum(t.numel() * t.element_size() for t in (part.keys, part.values) if t is not None)
            )
    return total


def _joint(anatomy: ModelAnatomy, groups: list[RowGroup], masker: HeadMasker | None, padded: bool) -> Prefilled:
    width = max(g.ids.shape[1] for g in groups)
    ids = torch.cat([pad_left(g.ids, width, 1) for g in groups])  # [R, T]
    mask = torch.cat([pad_left(g.mask, width, 1) for g in groups])
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [R, T], real tokens count from 0
    if masker is not None:
        masker.set_rows([g.head_set for g in groups for _ in range(g.ids.shape[0])])
    cache = DecodeCache(config=anatomy.config, padded=padded)
    hidden, cache = anatomy.run_backbone(ids, mask, positions, cache)
    if mergeable(cache):  # one segment per layer, appended in place from now on
        cache = ragged_cache([cache], anatomy.config, padded)
    return Prefilled(hidden[:, -1, :].clone(), cache, mask, positions[:, -1:])


def extendable(cache: Any) -> bool:
    """Whether rows can join `cache` (every layer ragged): then requests can join a running decode."""
    return isinstance(cache, DecodeCache) and all(isinstance(layer, RaggedLayer) for layer in cache.layers)


def extend(cache: DecodeCache, other: DecodeCache) -> None:
    """Append the rows of `other` (a prefill's ragged cache) after those of `cache`, each segment at its own length."""
    for layer, new in zip(cache.layers, other.layers):
        layer.segments = _merge_equal_lengths([*layer.segments, *new.segments])  # type: ignore[union-attr]  # ragged layers (extendable)


def cached_length(cache: Any) -> int:
    """The longest row's cached positions (host metadata: no device sync)."""
    layer = cache.layers[0]
    return (
        max(seg.get_seq_length() for seg in layer.segments)
        if isinstance(layer, RaggedLayer)
        else layer.get_seq_length()
    )


def prefill(
    anatomy: ModelAnatomy,
    groups: list[RowGroup],
    capture: LayerCapture,
    masker: HeadMasker | None,
    split: bool,
    padded: bool = True,
) -> Prefilled:
    """Encode the prompts of every row group.

    With `split`, each group is encoded in its own forward (padded only to its own longest prompt, so the
    short no-context prompt costs its own length, not the documents'; masked heads apply to their own group's
    forward only) and the caches are merged; otherwise all rows go through one forward padded to the longest
    prompt. Both give the same states. `padded=False` says every row has the same length (see `DecodeCache`).
    """
    if not split or len(groups) == 1:
        return _joint(anatomy, groups, masker, padded)
    outputs, captures = [], []
    for group in groups:
        if masker is not None:
            masker.set_rows([group.head_set] * group.ids.shape[0])
        positions = (group.mask.cumsum(-1) - 1).clamp_min(0)  # real tokens count from 0
        cache = DecodeCache(config=anatomy.config)
        hidden, cache = anatomy.run_backbone(group.ids, group.mask, positions, cache)
        outputs.append((hidden[:, -1, :].clone(), cache))
        captures.append(dict(capture.states))
        del hidden
    caches = [cache for _, cache in outputs]
    if not all(mergeable(c) for c in caches):  # a cache layout we cannot hold ragged: encode again, jointly
        return _joint(anatomy, groups, masker, padded)
    for layer in capture.states:
        capture.states[layer] = torch.cat([c[layer] for c in captures])
    width = max(g.ids.shape[1] for g in groups)
    mask = torch.cat([pad_left(g.mask, width, 1) for g in groups])
    last_positions = torch.cat([g.mask.sum(-1, keepdim=True) - 1 for g in groups])
    last_hidden = torch.cat([hidden for hidden, _ in outputs])
    return Prefilled(last_hidden, ragged_cache(caches, anatomy.config, padded), mask, last_positions)


def prune(
    cache: Any, attention_mask: torch.Tensor, positions: torch.Tensor, keep: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep rows `keep` (in that order, repeats allowed) of the cache, mask and positions; return mask and positions."""
    cache.batch_select_indices(keep)  # a host list: indexes tensors on any device, with no device sync
    index = torch.tensor(keep, dtype=torch.long).to(attention_mask.device, non_blocking=True)
    return attention_mask[index], positions[index]


def prompt_cache_bytes(
    anatomy: ModelAnatomy, groups: Sequence[Sequence[list[int]]], pad_id: int, split: bool = True
) -> int:
    """Bytes of the KV cache a decode holds right after prefilling these row groups (e.g. [[ctx_ids]] for
    standard, [[ctx_ids], [no_ctx_ids]] for FIDES), laid out exactly as the decoder lays them out."""
    block: Any = anatomy.layers[0]  # a transformer block: its attributes depend on the family
    device = block.self_attn.o_proj.weight.device if hasattr(block, "self_attn") else torch.device("cpu")
    rows = [
        RowGroup(*left_padded(list(g), pad_id, device if device.type != "meta" else torch.device("cpu")))
        for g in groups
    ]
    with torch.inference_mode(), LayerCapture(anatomy, ()) as capture:
        state = prefill(anatomy, rows, capture, None, split)
    return cache_bytes(state.cache)
