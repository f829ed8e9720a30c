"""The attention backend is chosen once, by name: "auto" picks the mode's and device's, a name the mode or device
cannot run is refused at construction, and a backend that pads steps to buckets refuses a max_rows they do not
cover."""

from __future__ import annotations

import pytest
import torch

from fides_rag import FidesDecoder
from fides_rag.decoder import attention_choices
from fides_rag.generation.engine.attention import BACKENDS, resolve_attention

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_every_backend_is_registered_by_name_and_auto_comes_first():
    assert attention_choices() == ["auto", "ragged", "gather", "flex"]
    assert {name: b.mode for name, b in BACKENDS.items()} == {"ragged": "exact", "gather": "fast", "flex": "fast"}


def test_only_flex_declares_that_its_masks_read_the_blocks_ordinals():
    pool_backends = {name: b for name, b in BACKENDS.items() if b.mode == "fast"}
    assert {name: b.reads_block_ordinals for name, b in pool_backends.items()} == {"gather": False, "flex": True}


@pytest.mark.parametrize(
    ("mode", "device", "expected"),
    [("exact", CPU, "ragged"), ("fast", CPU, "gather"), ("fast", CUDA, "flex")],
)
def test_auto_picks_the_modes_backend_and_flex_on_cuda(mode, device, expected):
    assert resolve_attention("auto", mode, device) == expected
    assert resolve_attention(None, mode, device) == expected


@pytest.mark.parametrize(
    ("attention", "mode", "message"),
    [
        ("paged", "fast", r"attention must be one of \['auto', 'ragged', 'gather', 'flex'\], got 'paged'"),
        ("flex", "exact", r"attention='flex' attends over mode='fast'.*one of \['ragged'\]"),
        ("ragged", "fast", r"attention='ragged' attends over mode='exact'.*one of \['gather', 'flex'\]"),
    ],
)
def test_a_backend_the_mode_cannot_use_is_refused_naming_what_is_accepted(attention, mode, message):
    with pytest.raises(ValueError, match=message):
        resolve_attention(attention, mode, CPU)


def test_the_decoder_reports_its_backend_and_refuses_a_bad_one_at_construction(tiny_llama, tokenizer):
    assert FidesDecoder(tiny_llama, tokenizer).limits.attention == "ragged"
    assert FidesDecoder(tiny_llama, tokenizer, mode="fast").limits.attention == "gather"
    with pytest.raises(ValueError, match="attention must be one of"):
        FidesDecoder(tiny_llama, tokenizer, mode="fast", attention="paged")


def test_a_static_batch_backend_refuses_rows_its_buckets_do_not_cover(tiny_llama, tokenizer):
    with pytest.raises(ValueError, match=r"max_rows=300: attention='flex' pads every decode step.*at most 256"):
        FidesDecoder(tiny_llama, tokenizer, mode="fast", attention="flex", max_rows=300)
    with pytest.raises(ValueError, match=r"max_rows=None"):
        FidesDecoder(tiny_llama, tokenizer, mode="fast", attention="flex", max_rows=None)
    decoder = FidesDecoder(tiny_llama, tokenizer, mode="fast", attention="flex", kv_pool_tokens=8192)
    with pytest.raises(ValueError, match="at most 256"):
        decoder.configure(max_rows=512)
    assert decoder.limits.max_rows == 128  # nothing changed


def test_rows_past_the_pool_sized_at_construction_are_refused(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer, mode="fast", kv_pool_tokens=8192, max_rows=4)
    with pytest.raises(ValueError, match="sized for at most 4 rows"):
        decoder.configure(max_rows=64)
    decoder.configure(max_rows=2)
    assert decoder.limits.max_rows == 2
