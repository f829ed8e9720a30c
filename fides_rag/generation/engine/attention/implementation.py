"""Switching a model's attention implementation for the length of one engine call.

The engine switches it at every step (to its pooled or per-segment attention, and back). transformers' setter checks
the value against the config's declared type and walks the sub-configs on every set: about 25 us a set on a CPU, a
tenth of a small model's decode step. A config with no sub-configs (every text-only family) takes the value in its
internal field directly; any other goes through the setter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_INTERNAL = "_attn_implementation_internal"
"""Where `PretrainedConfig._attn_implementation` keeps its value."""


def set_implementation(config: Any, name: str) -> None:
    """`config._attn_implementation = name`, without the setter's per-call work where the config has no sub-configs."""
    fields = vars(config)
    if _INTERNAL in fields and not getattr(config, "sub_configs", None):
        fields[_INTERNAL] = name
    else:
        config._attn_implementation = name


@contextlib.contextmanager
def attention_implementation(config: Any, name: str) -> Iterator[None]:
    """Within it, `config`'s attention implementation is `name`; the previous one is back after, even on error."""
    previous = config._attn_implementation
    set_implementation(config, name)
    try:
        yield
    finally:
        set_implementation(config, previous)
