"""A FidesConfig file (e.g. from `fides-rag calibrate`) sets FidesLLM's FIDES constants."""

from __future__ import annotations

import pytest
from llama_index.llms.fides import FidesLLM

from fides_rag import FidesConfig, FidesDecoder
from fides_rag.testing import build_tiny_model, build_tokenizer

DOC = "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."
QUERY = "In which city is the Eiffel Tower located?"
CALIBRATED = FidesConfig(
    weights=(0.4, 0.35, 0.25), shift_scale=2.5, noise_scale=40.0, fixed_alpha=0.7, source={"model": "tiny"}
)


@pytest.fixture()
def config_file(tmp_path):
    return CALIBRATED.to_file(tmp_path / "calibrated.json")


def check(llm: FidesLLM) -> None:
    assert llm.effective_fides_config == CALIBRATED
    response = llm.complete(QUERY, documents=[DOC], max_new_tokens=3)
    assert response.additional_kwargs["alphas"] == pytest.approx([0.7] * len(response.additional_kwargs["alphas"]))


def test_decoder_built_with_the_config_file(config_file):
    tok = build_tokenizer(chat=True)
    decoder = FidesDecoder(build_tiny_model("llama", len(tok)), tok, config=FidesConfig.from_file(config_file))
    check(FidesLLM.from_decoder(decoder))


def test_from_model_id_takes_the_config(config_file, tmp_path):
    tok = build_tokenizer(chat=True)
    folder = tmp_path / "tiny"
    build_tiny_model("llama", len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    check(FidesLLM.from_model_id(str(folder), device="cpu", config=FidesConfig.from_file(config_file)))


def test_fides_config_given_to_the_llm_wins_over_the_decoders():
    tok = build_tokenizer(chat=True)
    decoder = FidesDecoder(build_tiny_model("llama", len(tok)), tok)
    llm = FidesLLM(decoder, fides_config=CALIBRATED)
    assert llm.fides_config is CALIBRATED and decoder.method.config == FidesConfig()
    check(llm)


def test_constants_by_name_fold_into_one_config_on_the_decoders():
    tok = build_tokenizer(chat=True)
    decoder = FidesDecoder(build_tiny_model("llama", len(tok)), tok, config=FidesConfig(noise_scale=40.0))
    llm = FidesLLM(decoder, weights=[0.4, 0.35, 0.25], shift_scale=2.5, fixed_alpha=0.7)
    assert llm.fides_config == CALIBRATED  # noise_scale 40 kept from the decoder's config
    check(llm)
    with pytest.raises(TypeError, match="pass fides_config= or the FIDES constants"):
        FidesLLM(decoder, fides_config=CALIBRATED, lambda_=2.0)
    with pytest.raises(ValueError, match="fides_config must be a fides_rag.FidesConfig"):
        FidesLLM(decoder, fides_config={"lambda_": 2.0})
