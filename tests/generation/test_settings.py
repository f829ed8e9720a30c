"""Generation settings refuse bad values with a message that names the setting."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import LogitsProcessorList

from fides_rag import FidesDecoder, GenerationSettings, PromptPair


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": float("inf")}, "temperature must be a number in"),
        ({"temperature": float("nan")}, "temperature must be a number in"),
        ({"temperature": "hot"}, "temperature must be a number in"),
        ({"temperature": 0}, "temperature must be a number in"),
        ({"do_sample": "yes"}, "do_sample must be True or False"),
        ({"seed": "42"}, "seed must be None or an integer"),
        ({"seed": 4.2}, "seed must be None or an integer"),
        ({"seed": -1}, "seed must be None or an integer"),
        ({"seed": 2**64}, "seed must be None or an integer"),
        ({"top_p": "0.9"}, "top_p must lie in"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"max_new_tokens": True}, "max_new_tokens must be a positive integer"),
        ({"stop": ("",)}, "stop strings must be non-empty"),
    ],
)
def test_bad_settings_name_the_setting(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenerationSettings(**kwargs)


def test_good_settings_pass():
    settings = GenerationSettings(do_sample=True, temperature=0.7, top_p=0.9, top_k=5, seed=2**63 - 1, stop=("\n",))
    assert [type(p).__name__ for p in settings.sampling_warpers()] == [
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
    ]
    assert settings.unit_processors() is None  # nothing that reads a request's own history


def test_lone_surrogates_are_refused_with_their_position(tiny_llama, tokenizer):
    from fides_rag import FidesDecoder

    decoder = FidesDecoder(tiny_llama, tokenizer)
    with pytest.raises(ValueError, match=r"question holds a lone surrogate character .* at position 4"):
        decoder.generate("What\ud800?", ["doc"])
    with pytest.raises(ValueError, match=r"document 2 holds a lone surrogate character .* at position 1"):
        decoder.generate("What?", ["fine", "b\udc80ad"])
    with pytest.raises(ValueError, match=r"no_context_prompt holds a lone surrogate"):
        decoder.generate(PromptPair("ok", "n\ud83do"))


def test_sampling_options_drop_greedy_knobs_and_read_temperature_zero_as_greedy():
    from fides_rag.generation.settings import sampling_options

    assert sampling_options(False, temperature=0.7, top_p=0.9, top_k=5, seed=3) == {}
    assert sampling_options(True, temperature=0) == {}
    assert sampling_options(True) == {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": None}
    assert sampling_options(True, temperature=0.5, seed=7)["temperature"] == 0.5
    with pytest.raises(
        ValueError, match="do_sample must be True or False"
    ):  # passed on unchecked, named by the settings
        GenerationSettings(**sampling_options("yes"))


def test_the_greedy_sampling_warning_points_at_the_callers_line(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    with pytest.warns(UserWarning, match="no effect with greedy decoding") as caught:
        decoder.generate("q?", ["a document"], max_new_tokens=1, temperature=0.5)
    assert [w.filename for w in caught] == [__file__]


def test_integer_temperature_and_top_p_work_end_to_end(tiny_llama, tokenizer):
    settings = GenerationSettings(do_sample=True, temperature=2, top_p=1)
    assert (settings.temperature, settings.top_p) == (2.0, 1.0) and type(settings.temperature) is float
    decoder = FidesDecoder(tiny_llama, tokenizer)
    sampled = decoder.generate("q?", ["a document"], max_new_tokens=3, do_sample=True, temperature=2, seed=0)
    again = decoder.generate("q?", ["a document"], max_new_tokens=3, do_sample=True, temperature=2.0, seed=0)
    assert sampled.token_ids and sampled.token_ids == again.token_ids


def test_a_seed_with_greedy_decoding_warns_at_the_callers_line(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    with pytest.warns(UserWarning, match="seed have no effect with greedy decoding; pass do_sample=True") as caught:
        decoder.generate("q?", ["a document"], max_new_tokens=1, seed=3)
    assert [w.filename for w in caught] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GenerationSettings(do_sample=True, seed=3)
        GenerationSettings()


def test_a_temperature_below_1e_5_decodes_greedily_alone_and_in_a_batch(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    greedy = decoder.generate("q?", ["a document"], max_new_tokens=6)
    for temperature in (1e-300, 5e-324, 9e-6):
        settings = GenerationSettings(do_sample=True, temperature=temperature, top_p=0.5, seed=3)
        assert (settings.do_sample, settings.sampling_key()) == (False, GenerationSettings().sampling_key())
        tiny = decoder.generate("q?", ["a document"], max_new_tokens=6, do_sample=True, temperature=temperature, seed=1)
        assert tiny.token_ids == greedy.token_ids
    batch = decoder.generate_batch(
        ["q?", "other q?"], [["a document"], ["another document"]], max_new_tokens=6, do_sample=True, temperature=1e-300
    )
    assert batch[0].token_ids == greedy.token_ids


def test_sampling_extremes_are_greedy_equivalent_or_refused(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    greedy = decoder.generate("q?", ["a document"], max_new_tokens=6)
    narrow = decoder.generate("q?", ["a document"], max_new_tokens=6, do_sample=True, top_p=1e-300, seed=2)
    assert narrow.token_ids == greedy.token_ids  # top_p keeps the best token only
    assert (
        decoder.generate("q?", ["a document"], max_new_tokens=6, do_sample=True, top_k=1, seed=2).token_ids
        == greedy.token_ids
    )
    hot = decoder.generate(
        "q?", ["a document"], max_new_tokens=6, do_sample=True, temperature=1e30, top_k=2**64, seed=2**63 - 1
    )
    assert len(hot.token_ids) == 6
    for bad in ({"temperature": 1e31}, {"seed": -1}, {"seed": 2**64}, {"top_p": 0.0}, {"top_k": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            decoder.generate("q?", ["a document"], max_new_tokens=2, **{"do_sample": True, **bad})


class _Certain:
    """A logits processor that makes token `token` infinitely likely."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores):
        return scores.index_fill(-1, torch.tensor([self.token]), float("inf"))


def test_an_infinitely_likely_token_is_the_one_drawn(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    decoder.eos_token_ids = set()
    result = decoder.generate(
        "q?",
        ["a document"],
        max_new_tokens=5,
        do_sample=True,
        seed=0,
        logits_processor=LogitsProcessorList([_Certain(7)]),
    )
    assert result.token_ids == [7] * 5
