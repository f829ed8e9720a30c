"""A setting that has no effect in the chosen mode is refused, naming the setting and the mode that uses it: in
process (`FidesDecoder`, and `from_pretrained` before any model loads) and as a one-line error of `fides-rag serve`
(`generate` and `eval` take no engine settings but --mode)."""

from __future__ import annotations

import re

import pytest

from fides_rag import FidesDecoder
from fides_rag.cli.main import main

IGNORED_IN_EXACT_MODE = [
    ({"kv_pool_tokens": 1024}, r"kv_pool_tokens=1024 sizes fast mode's KV pool, but mode='exact'"),
    ({"kv_cache_memory": 2**20}, r"kv_cache_memory=1048576 sizes fast mode's KV pool, but mode='exact'"),
    ({"compile": True}, r"compile=True captures fast mode's decode step, but mode='exact'"),
    ({"buckets": [1, 2]}, r"buckets=\[1, 2\] are the row counts compile= captures .* without compile"),
    ({"warmup": True}, r"warmup=True needs compile="),
]


@pytest.mark.parametrize("mode", ["exact", None])  # None: the CPU's default, exact
@pytest.mark.parametrize("settings, message", IGNORED_IN_EXACT_MODE)
def test_a_setting_exact_mode_would_ignore_is_a_value_error(tiny_llama, tokenizer, mode, settings, message):
    with pytest.raises(ValueError, match=message):
        FidesDecoder(tiny_llama, tokenizer, mode=mode, **settings)


def test_buckets_without_compile_are_refused_in_fast_mode_too(tiny_llama, tokenizer):
    with pytest.raises(ValueError, match="buckets=.* without compile they have no effect"):
        FidesDecoder(tiny_llama, tokenizer, mode="fast", buckets=[1, 2])
    assert FidesDecoder(tiny_llama, tokenizer, mode="fast", kv_pool_tokens=1024).stats.kv_pool_tokens == 1024


@pytest.mark.parametrize("settings, message", IGNORED_IN_EXACT_MODE[:2])
def test_from_pretrained_refuses_before_loading_anything(settings, message):
    """The model named does not exist: the error is the setting's, so nothing was loaded first."""
    with pytest.raises(ValueError, match=message):
        FidesDecoder.from_pretrained("no/such-model", device="cpu", **settings)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve", "--model", "no/such-model", "--device", "cpu", "--kv-pool-tokens", "1024"], "kv_pool_tokens=1024"),
        (["serve", "--model", "no/such-model", "--device", "cpu", "--buckets", "1,2"], r"buckets=\[1, 2\]"),
        (["serve", "--model", "no/such-model", "--mode", "exact", "--compile"], "compile=True"),
    ],
)
def test_serve_refuses_a_setting_its_mode_ignores_in_one_line(argv, message, capsys):
    pytest.importorskip("fastapi")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fides-rag serve: error: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
