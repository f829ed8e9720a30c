"""The KV cache of a decode: prefill of every row group (jointly, or one forward per group and the caches
merged), and pruning of finished rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from fides_rag.generation.hooks import HeadMasker, LayerCapture
from fides_rag.lens import ModelAnatomy


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
    which our left-padded batches need anyway."""

    @property
    def is_compileable(self) -> bool:
        return True


def left_padded(sequences: Sequence[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask [N, T] for left-padded sequences (built on the host, copied once)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[i, width - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def pad_left(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def mergeable(cache: Any) -> bool:
    """Whether `merge_caches` knows the cache's layer types (dynamic, sliding-window)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


def merge_caches(caches: Sequence[Any]) -> Any:
    """Stack left-padded KV caches along the batch, left-padding the shorter ones' stored keys (into the first).

    Sliding-window layers store only their last window-1 positions and count every position seen; the merged
    layer counts the longest history, and the padded slots fall on positions the attention mask hides.
    """
    first = caches[0]
    for index, merged in enumerate(first.layers):
        parts = [cache.layers[index] for cache in caches]
        length = max(part.keys.shape[-2] for part in parts)
        merged.keys = torch.cat([pad_left(part.keys, length, -2) for part in parts], dim=0)  # [R, kv_heads, T, d]
        merged.values = torch.cat([pad_left(part.values, length, -2) for part in parts], dim=0)
        if isinstance(merged, DynamicSlidingWindowLayer):
            merged.cumulative_length = max(part.cumulative_length for part in parts)
    return first


def cache_bytes(cache: Any) -> int:
    """Bytes held by a cache's key and value tensors."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None)


def _joint(anatomy: ModelAnatomy, groups: list[RowGroup], masker: HeadMasker | None) -> Prefilled:
    width = max(g.ids.shape[1] for g in groups)
    ids = torch.cat([pad_left(g.ids, width, 1) for g in groups])  # [R, T]
    mask = torch.cat([pad_left(g.mask, width, 1) for g in groups])
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [R, T], real tokens count from 0
    if masker is not None:
        masker.set_rows([g.head_set for g in groups for _ in range(g.ids.shape[0])])
    cache = DecodeCache(config=anatomy.config)
    out = anatomy.backbone(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
    return Prefilled(out.last_hidden_state[:, -1, :].clone(), out.past_key_values, mask, positions[:, -1:])


def prefill(
    anatomy: ModelAnatomy, groups: list[RowGroup], capture: LayerCapture, masker: HeadMasker | None, split: bool
) -> Prefilled:
    """Encode the prompts of every row group.

    With `split`, each group is encoded in its own forward (padded only to its own longest prompt, so the
    short no-context prompt costs its own length, not the documents'; masked heads apply to their own group's
    forward only) and the caches are merged; otherwise all rows go through one forward padded to the longest
    prompt. Both give the same states.
    """
    if not split or len(groups) == 1:
        return _joint(anatomy, groups, masker)
    outputs, captures = [], []
    for group in groups:
        if masker is not None:
            masker.set_rows([group.head_set] * group.ids.shape[0])
        positions = (group.mask.cumsum(-1) - 1).clamp_min(0)  # real tokens count from 0
        cache = DecodeCache(config=anatomy.config)
        out = anatomy.backbone(
            input_ids=group.ids, attention_mask=group.mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
        outputs.append((out.last_hidden_state[:, -1, :].clone(), out.past_key_values))
        captures.append(dict(capture.states))
        del out
    caches = [cache for _, cache in outputs]
    if not all(mergeable(c) for c in caches):  # a cache layout we cannot merge: encode again, jointly
        return _joint(anatomy, groups, masker)
    for layer in capture.states:
        capture.states[layer] = torch.cat([c[layer] for c in captures])
    width = max(g.ids.shape[1] for g in groups)
    mask = torch.cat([pad_left(g.mask, width, 1) for g in groups])
    last_positions = torch.cat([g.mask.sum(-1, keepdim=True) - 1 for g in groups])
    last_hidden = torch.cat([hidden for hidden, _ in outputs])
    return Prefilled(last_hidden, merge_caches(caches), mask, last_positions)


def prune(cache: Any, attention_mask: torch.Tensor, positions: torch.Tensor, keep: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep rows `keep` (in that order, repeats allowed) of the cache, mask and positions; return mask and positions."""
    index = torch.tensor(keep, dtype=torch.long)
    cache.batch_select_indices(index)
    index = index.to(attention_mask.device)
    return attention_mask[index], positions[index]
