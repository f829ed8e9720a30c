"""The attention backends by name, and the choice of one when the engine resolves its mode."""

from __future__ import annotations

import torch

from fides_rag.generation.engine.attention.backend import AttentionBackend
from fides_rag.generation.engine.attention.flex import FlexAttention
from fides_rag.generation.engine.attention.gather import GatherAttention
from fides_rag.generation.engine.attention.ragged import RaggedAttention

BACKENDS: dict[str, type[AttentionBackend]] = {}
AUTO = "auto"


def register(backend: type[AttentionBackend]) -> type[AttentionBackend]:
    """Add a backend under its name (a new backend is one file and this call)."""
    BACKENDS[backend.name] = backend
    return backend


for _backend in (RaggedAttention, GatherAttention, FlexAttention):
    register(_backend)


def attention_choices() -> list[str]:
    return [AUTO, *BACKENDS]


def resolve_attention(attention: object, mode: str, device: torch.device) -> str:
    """The backend `attention` names, checked against the engine's mode and device; "auto" (or None): `ragged` in
    exact mode, and in fast mode `flex` on CUDA where torch has it, else `gather`."""
    if attention is None or attention == AUTO:
        if mode == "exact":
            return RaggedAttention.name
        if device.type == "cuda" and FlexAttention.unavailable(device) is None:
            return FlexAttention.name
        return GatherAttention.name
    if not isinstance(attention, str) or attention not in BACKENDS:
        raise ValueError(f"attention must be one of {attention_choices()}, got {attention!r}")
    backend = BACKENDS[attention]
    if backend.mode != mode:
        fitting = [name for name, b in BACKENDS.items() if b.mode == mode]
        raise ValueError(
            f"attention={attention!r} attends over mode={backend.mode!r}'s KV store, but the engine runs "
            f"mode={mode!r}: use attention='auto' or one of {fitting}"
        )
    reason = backend.unavailable(device)
    if reason is not None:
        raise ValueError(f"attention={attention!r} cannot run on {device.type}: {reason}; use attention='auto'")
    return attention
