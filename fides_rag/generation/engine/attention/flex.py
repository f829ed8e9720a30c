"""`flex`: fast mode's attention on CUDA. `flex_attention` runs over a layer's whole pool ([1, kv_heads, S, d], a
batch of 1 every query row shares) under a `BlockMask` that lists each row's blocks.

Three choices make the compiled kernel right by construction, each checked on the CPU (tests/generation/engine/
attention/test_flex_contract.py):
- kernel options sized to the pool's block (`KERNEL_OPTIONS`): inductor's default flex config on sm90 in bfloat16 is
  BLOCK_M 128 x BLOCK_N 64, which does not divide 16-slot blocks and raises at compile time;
- a static batch: every step is padded to a bucket (`static_batch`), so the batch size is a constant of the graph and
  inductor keeps its flex-decoding kernel (which needs it) instead of falling back to the main kernel;
- every block partial (no full blocks): the flex-decoding template then sizes each KV split from the row's own
  blocks; with full blocks it sizes them from the pool's length, and a short row lands in one split
  (`decode_split_shares`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

from fides_rag.generation.engine.attention.backend import PoolAttention, Window
from fides_rag.generation.engine.kv_pool_size import BLOCK
from fides_rag.generation.engine.pool_index import NUM_BLOCKS, POS

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import FlexKernelOptions

KERNEL_OPTIONS: FlexKernelOptions = {"BLOCK_M": BLOCK, "BLOCK_N": BLOCK}
"""flex's tile sizes: the pool's block, which they must divide (vLLM's flex backend passes 16 too)."""
RECOMPILE_LIMIT = 64
"""Graphs the compiled flex call may keep: one per bucket and window family."""


def flex_unavailable() -> str | None:
    """Why this torch cannot run flex attention over a block list (None: it can)."""
    try:
        from torch.nn.attention.flex_attention import BlockMask

        BlockMask.from_kv_blocks  # noqa: B018
    except (ImportError, AttributeError):
        return f"torch {torch.__version__} has no flex attention with BlockMask.from_kv_blocks (torch 2.5 or later)"
    return None


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    # Static shapes: every step is padded to a bucket, so a graph per bucket; a dynamic batch would cost inductor
    # its flex-decoding kernel.
    return torch.compile(flex_attention, dynamic=False)


def run_flex(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask: Any,
    scale: float | None,
    compiled: bool,
    kernel_options: FlexKernelOptions | None = None,
) -> torch.Tensor:
    """flex attention of R query rows ([R, heads, 1, d]) over one pool ([1, kv_heads, S, d]) under `block_mask`:
    [R, heads, 1, d]. Inside a graph being compiled (a captured step) flex is traced as is; else the compiled call
    runs with room for a graph per bucket, or eager flex (which materialises every score) when `compiled` is off."""
    from torch.nn.attention.flex_attention import flex_attention

    options = KERNEL_OPTIONS if kernel_options is None else kernel_options
    if not torch.compiler.is_compiling() and _get_current_dispatch_mode() is not None:
        # flex compiles even its eager form, which a dispatch mode (counting aten ops) refuses: the call runs outside
        # the mode, which then sees no op of it.
        with _disable_current_modes():
            return run_flex(query, key, value, block_mask, scale, compiled, options)
    if torch.compiler.is_compiling() or not compiled:
        return flex_attention(
            query,
            key,
            value,
            block_mask=block_mask,
            scale=scale,
            enable_gqa=True,
            kernel_options=options,
        )
    accumulated = max(torch._dynamo.config.accumulated_recompile_limit, RECOMPILE_LIMIT)
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, accumulated_recompile_limit=accumulated):
        return _compiled_flex()(
            query, key, value, block_mask=block_mask, scale=scale, enable_gqa=True, kernel_options=options
        )


def decode_split_shares(
    row_blocks: int, pool_positions: int, num_sms: int, batch: int, kv_heads: int, full_blocks: bool
) -> list[int]:
    """Positions of one row that each KV split of inductor's flex-decoding kernel attends, by its template's formula
    (torch/_inductor/kernel/flex/templates/flex_decode.py.jinja and `get_split_k`): SPLIT_KV = SMs // (batch x KV
    heads) x 2 splits, each of TILE_KV positions from the row's first block; TILE_KV is the pool's length over the
    splits when the mask has full blocks, else the row's blocks' length over the splits (rounded up to BLOCK_N)."""
    splits = max(num_sms // max(batch * kv_heads, 1) * 2, 1)
    length = pool_positions if full_blocks else row_blocks * BLOCK
    tile = math.ceil(math.ceil(length / splits) / BLOCK) * BLOCK
    row = row_blocks * BLOCK
    return [max(0, min(row, (s + 1) * tile) - s * tile) for s in range(splits)]


class FlexAttention(PoolAttention):
    name = "flex"
    implementation = "fides_pool_flex"
    static_batch = True
    reads_block_ordinals = True  # the mask_mod finds a key slot's position from its block's place

    def __init__(self) -> None:
        self._masks: dict[tuple[int, Window], Any] = {}

    @classmethod
    def unavailable(cls, device: torch.device) -> str | None:
        return flex_unavailable()

    def bind(self, pool: Any) -> None:
        super().bind(pool)
        self._mask_mods = {w: self._mask_mod(w) for w in [None, *pool.window_sizes]}

    def block_mask_tensors(self, index: torch.Tensor, window: Window) -> dict[str, torch.Tensor]:
        """flex's block lists of every row (`BlockMask.from_kv_blocks`'s arguments), views of `index` ([Rb, columns]):
        every block of the row (in a window, every block within it), all partial: the mask_mod decides each slot."""
        pool, width = self.pool, self.pool.max_row_blocks
        start = pool.regions["full" if window is None else window]
        count = NUM_BLOCKS if window is None else pool.count_columns[window]
        return {
            "kv_num_blocks": index[:, None, count : count + 1],
            "kv_indices": index[:, None, None, start : start + width],
        }

    def begin_step(self, index: torch.Tensor, width: int) -> dict[Window, Any]:
        rows = index.shape[0]
        return {w: self._block_mask(rows, w, index) for w in {*self.pool.windows}}

    def _block_mask(self, rows: int, window: Window, index: torch.Tensor) -> Any:
        """This step's BlockMask of `window` (built once per row count over the persistent buffers, then reused)."""
        from torch.nn.attention.flex_attention import BlockMask

        key = (rows, window)
        if key not in self._masks:
            self._masks[key] = BlockMask.from_kv_blocks(
                **self.block_mask_tensors(index, window),
                BLOCK_SIZE=(BLOCK, BLOCK),
                mask_mod=self._mask_mods[window],
                seq_lengths=(1, (self.pool.blocks + 1) * BLOCK),
                compute_q_blocks=False,
            )
        return self._masks[key]

    def _mask_mod(self, window: Window) -> Callable[..., torch.Tensor]:
        """flex's mask_mod: key slot `kv` is visible to row `b` when the row's table holds its block (at the block's
        place, which every row sharing the block shares) and its position is at most the row's (and, in a window,
        within it). It reads the persistent buffers: one function per window for every step (no new closure, no
        recompilation)."""
        pool = self.pool
        index, ordinal, full = pool.index, pool.block_ordinal, pool.regions["full"]

        def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            block = kv // BLOCK
            place = ordinal[block]  # the block's place in the tables that hold it (rows sharing it hold it alike)
            position = place * BLOCK + kv % BLOCK
            visible = (index[b, full + place] == block) & (position <= index[b, POS])
            if window is not None:
                visible = visible & (position > index[b, POS] - window)
            return visible

        return mask_mod

    def read(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return keys, values

    @staticmethod
    def attend(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, scale: float | None
    ) -> torch.Tensor:
        # Compiled on CUDA; eager on the CPU, where compiling costs more than the eager call's whole-pool scores.
        return run_flex(query, key, value, mask, scale, compiled=query.device.type == "cuda")
