"""Log-probabilities of the chosen tokens (`logprobs=k`): from the distribution each token was chosen from (the
contrasted one, after the grammar), recorded per step, without changing a single token."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import FidesDecoder, PromptTemplate

QUESTION, DOCUMENTS = "Which city is the capital of France?", ["Lyon is the capital of France."]


@pytest.fixture
def decoder(tiny_llama, tokenizer):
    return FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))


@pytest.mark.parametrize("method", ["fides", "cad", "standard"])
def test_greedy_tokens_are_the_most_likely_of_their_distribution_and_unchanged(decoder, method):
    plain = decoder.generate(QUESTION, DOCUMENTS, method=method, max_new_tokens=6)
    scored = decoder.generate(QUESTION, DOCUMENTS, method=method, max_new_tokens=6, logprobs=3)
    assert scored.token_ids == plain.token_ids and scored.alphas == plain.alphas
    for step in scored.steps:
        assert len(step.top_logprobs) == 3 and step.top_logprobs[0][0] == step.token_id
        assert step.logprob == pytest.approx(step.top_logprobs[0][1]) and step.logprob <= 0
        assert [lp for _, lp in step.top_logprobs] == sorted((lp for _, lp in step.top_logprobs), reverse=True)
        assert sum(math.exp(lp) for _, lp in step.top_logprobs) <= 1 + 1e-6
    assert all(step.logprob is None and step.top_logprobs is None for step in plain.steps)


def test_standard_logprobs_are_the_models_own(decoder, tiny_llama, tokenizer):
    result = decoder.generate(QUESTION, DOCUMENTS, method="standard", max_new_tokens=1, logprobs=0)
    ids = torch.tensor([tokenizer(result.context_prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        expected = torch.log_softmax(tiny_llama(ids).logits[0, -1].float(), dim=-1)[result.token_ids[0]].item()
    assert result.steps[0].logprob == pytest.approx(expected, abs=1e-4) and result.steps[0].top_logprobs == []


def test_fides_logprobs_are_the_contrasted_distribution_not_the_context_paths(decoder):
    fides = decoder.generate(QUESTION, DOCUMENTS, method="fides", max_new_tokens=4, logprobs=5)
    cad = decoder.generate(QUESTION, DOCUMENTS, method="cad", max_new_tokens=4, logprobs=5)
    assert [s.top_logprobs for s in fides.steps] != [s.top_logprobs for s in cad.steps]


def test_grammar_refused_tokens_are_never_alternatives(decoder):
    result = decoder.generate(QUESTION, DOCUMENTS, method="fides", max_new_tokens=8, regex="(yes|no)", logprobs=20)
    for step in result.steps:
        assert all(math.isfinite(lp) for _, lp in step.top_logprobs)
        assert len(step.top_logprobs) < 20  # the grammar leaves few tokens


def test_steps_round_trip_with_logprobs(decoder):
    from fides_rag import StepRecord

    result = decoder.generate(QUESTION, DOCUMENTS, max_new_tokens=2, logprobs=2)
    assert [StepRecord.from_dict(s.to_dict()) for s in result.steps] == result.steps
    assert "logprob" not in decoder.generate(QUESTION, DOCUMENTS, max_new_tokens=1).steps[0].to_dict()


@pytest.mark.parametrize("value", [-1, 21, 2.0, True])
def test_bad_logprobs_are_refused(decoder, value):
    with pytest.raises(ValueError, match="logprobs"):
        decoder.generate(QUESTION, DOCUMENTS, max_new_tokens=2, logprobs=value)


def test_sampled_logprobs_follow_the_warped_distribution(decoder):
    result = decoder.generate(QUESTION, DOCUMENTS, max_new_tokens=4, do_sample=True, top_k=2, seed=3, logprobs=5)
    for step in result.steps:
        assert len(step.top_logprobs) <= 2 and step.token_id in {i for i, _ in step.top_logprobs}
