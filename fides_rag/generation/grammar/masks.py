"""Token bitmasks: one int32 row of ceil(V/32) words per logits row, bit j of word w admitting token 32·w + j
(the layout llguidance, xgrammar and outlines-core share). Filled on the host, copied once, applied in place."""

from __future__ import annotations

import torch

_PENALTIES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int, *, for_device: torch.device | str = "cpu") -> torch.Tensor:
    """A host bitmask [rows, ceil(V/32)] admitting every token, pinned when it is bound for a CUDA device."""
    pinned = torch.device(for_device).type == "cuda"
    return torch.full((rows, bitmask_width(vocab_size)), -1, dtype=torch.int32, pin_memory=pinned)


def _penalty_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[256, 8]: entry (b, j) is -inf when bit j of byte b is clear (the token is refused), else 0."""
    if (device, dtype) not in _PENALTIES:
        refused = ((torch.arange(256).unsqueeze(-1) >> torch.arange(8)) & 1) == 0
        _PENALTIES[device, dtype] = torch.zeros(256, 8, dtype=dtype).masked_fill_(refused, float("-inf")).to(device)
    return _PENALTIES[device, dtype]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set to -inf, in place, every logit whose bit is clear; the others keep their exact values. logits [n, V] on
    any device; bitmask [n, ceil(V/32)] int32 on the host or on that device (one non-blocking copy when it is not
    there yet). Returns `logits`."""
    n, vocab = logits.shape
    if bitmask.shape != (n, bitmask_width(vocab)) or bitmask.dtype != torch.int32:
        raise ValueError(
            f"bitmask {tuple(bitmask.shape)} {bitmask.dtype} does not fit logits {tuple(logits.shape)}: "
            f"it must be int32 [{n}, {bitmask_width(vocab)}]"
        )
    bitmask = bitmask.to(logits.device, non_blocking=True)
    # little-endian int32 -> 4 bytes per word, so byte k, bit j of a row is token 8·k + j. Adding a gathered
    # 0/-inf row is several times faster on CPU than gathering booleans for masked_fill.
    penalty = _penalty_table(logits.device, logits.dtype).index_select(0, bitmask.view(torch.uint8).view(-1).int())
    return logits.add_(penalty.view(n, -1)[:, :vocab])  # [n, 4·W·8] -> [n, V]
