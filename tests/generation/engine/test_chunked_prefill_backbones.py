"""Chunked prefill and the prefix cache on the real bundled backbones (slow): every method gives its solo
tokens when all are submitted at once under a small token budget, and identical tokens and recorded values
with the prefix cache on and off."""

from __future__ import annotations

import pytest

from fides_rag import FidesDecoder, available_methods, get_method, load_model

pytestmark = pytest.mark.slow

BACKBONES = ["smollm2-135m-instruct", "gemma3-270m"]
QUESTION = "In which city is the Eiffel Tower located?"
DOCUMENTS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.",
    "It was built for the 1889 World's Fair.",
]
METHODS = {name: {"decore": dict(heads={2: [0], 5: [1, 2]})}.get(name, {}) for name in available_methods()}


@pytest.fixture(scope="module", params=BACKBONES)
def loaded(request):
    return load_model(request.param)


@pytest.mark.timeout(3000)
def test_every_method_under_chunking_and_prefix_caching_gives_its_solo_result(loaded):
    model, tokenizer = loaded
    on = FidesDecoder(model, tokenizer, max_num_batched_tokens=64)
    off = FidesDecoder(model, tokenizer, max_num_batched_tokens=64, prefix_caching=False)
    requests, alone = [], []
    for name, options in METHODS.items():
        method = get_method(name, **options)
        solo = off.generate(QUESTION, DOCUMENTS, method=method, max_new_tokens=4)
        cached = on.generate(QUESTION, DOCUMENTS, method=method, max_new_tokens=4)
        assert cached.token_ids == solo.token_ids and [s.values for s in cached.steps] == [
            s.values for s in solo.steps
        ], name
        requests.append(dict(method=method, max_new_tokens=4))
        alone.append(solo)
    stats = on.stats
    assert stats.prefix_cache_hits > 0 and stats.prefill_tokens < stats.prompt_tokens
    assert len(on.prepare(QUESTION, DOCUMENTS, 4).context_ids) > 3 * 64  # prefilled over several chunks
    handles = [on.submit(QUESTION, DOCUMENTS, **options) for options in requests]
    for handle, solo in zip(handles, alone):
        result = handle.result()
        assert result.token_ids == solo.token_ids
        for x, y in zip(result.steps, solo.steps):
            assert x.values == pytest.approx(y.values, abs=1e-4)
