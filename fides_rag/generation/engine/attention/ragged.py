"""`ragged`: exact mode's attention. Each group of rows of one length is attended on its own, over the ragged
cache's segments, by the model's own attention (`ragged_attention.py`), so a row's result does not depend on the
other rows."""

from __future__ import annotations

from fides_rag.generation.engine.attention.backend import AttentionBackend


class RaggedAttention(AttentionBackend):
    name = "ragged"
    mode = "exact"
