"""The memory check that runs before a GGUF model is dequantised or loaded."""

from __future__ import annotations

import numpy as np
import pytest

from fides_rag.models import loading
from fides_rag.models.memory import available_bytes, check_fits, float32_bytes


@pytest.fixture
def tiny_gguf(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_tensor("a.weight", np.zeros((64, 32), dtype=np.float16))
    writer.add_tensor("b.weight", np.zeros((10,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_float32_size_comes_from_the_tensor_shapes(tiny_gguf):
    assert float32_bytes(tiny_gguf) == 4 * (64 * 32 + 10)


def test_a_model_larger_than_the_free_memory_is_refused_with_both_sizes(tiny_gguf):
    with pytest.raises(MemoryError, match=r"tiny\.gguf needs about .* GiB .* only .* GiB of memory is available"):
        check_fits(tiny_gguf, available=100)
    check_fits(tiny_gguf, available=10**9)


def test_loading_checks_memory_before_dequantising(tiny_gguf, monkeypatch):
    monkeypatch.setattr("fides_rag.models.memory.available_bytes", lambda: 100)
    monkeypatch.setattr(loading, "AutoModelForCausalLM", None)  # any load attempt would fail differently
    with pytest.raises(MemoryError, match="needs about"):
        loading.load_model(str(tiny_gguf), device="cpu")


def test_available_memory_is_reported_on_this_platform():
    assert available_bytes() is None or available_bytes() > 0


@pytest.mark.slow
def test_a_dequantised_copy_is_checked_by_its_size_on_disk_without_parsing_the_gguf_again(monkeypatch):
    """Reading the header parses the whole vocabulary (about 20 s for gemma3's 262k tokens); a load of the cached copy
    takes the size of its safetensors files instead, and is refused all the same when it does not fit."""
    folder = loading.resolve_model_source("smollm2-135m-instruct")  # dequantised here once, if not yet

    def parse_again(path):
        raise AssertionError(f"the GGUF header of {path} was parsed again")

    monkeypatch.setattr("fides_rag.models.memory.float32_bytes", parse_again)
    assert loading.resolve_model_source("smollm2-135m-instruct") == folder
    monkeypatch.setattr("fides_rag.models.memory.available_bytes", lambda: 100)
    with pytest.raises(MemoryError, match=r"needs about 0\.[0-9] GiB once dequantised"):
        loading.resolve_model_source("smollm2-135m-instruct")
