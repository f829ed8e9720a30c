"""End to end on the real bundled backbones (slow: each loads a dequantised GGUF from the cache)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fides_rag import FidesDecoder, load_model
from fides_rag.models import loading

pytestmark = pytest.mark.slow

BACKBONES = ["smollm2-135m-instruct", "gemma3-270m"]
CONFLICT_QUESTION = "In which city is the Eiffel Tower located?"
CONFLICT_DOCUMENT = "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."


@pytest.fixture(scope="module", params=BACKBONES)
def decoder(request) -> FidesDecoder:
    model, tokenizer = load_model(request.param)
    return FidesDecoder(model, tokenizer)


def alpha_table(result) -> str:
    rows = [f"{'token':>14} {'alpha':>7} {'opp':>7} {'shift':>7} {'noise':>7}"]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for s in result.steps:
        rows.append(f"{s.token!r:>14} {fmt(s.alpha):>7} {fmt(s.opposition):>7} {fmt(s.shift):>7} {fmt(s.noise):>7}")
    return "\n".join(rows)


def test_bundled_alias_is_cached_as_safetensors(decoder):
    alias = "gemma3-270m" if decoder.model.config.model_type == "gemma3_text" else "smollm2-135m-instruct"
    folder = loading._gguf_cache_dir(loading.locate_bundled(alias))
    assert (folder / "model.safetensors").is_file() and (folder / "fides_rag_source.json").is_file()


def test_standard_matches_transformers_generate(decoder):
    example = dataclasses.replace(decoder.prepare(CONFLICT_QUESTION, [CONFLICT_DOCUMENT], 16), stop=())
    ids = torch.tensor([example.context_ids])
    expected = decoder.model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16
    )
    expected = expected[0, ids.shape[1] :].tolist()
    # Same token ids through the decoder's loop (a PromptPair would re-tokenise the text).
    result = decoder.generate_batch([example], method="standard", max_new_tokens=16)[0]
    assert len(expected) > 1
    assert result.token_ids == expected


def test_real_conflict_contrast_follows_the_document(decoder):
    results = {
        m: decoder.generate(CONFLICT_QUESTION, [CONFLICT_DOCUMENT], method=m, max_new_tokens=16)
        for m in ("standard", "cad", "adacad", "fides")
    }
    for method, result in results.items():
        print(f"\n[{decoder.model.config.model_type}] {method}: {result.text!r}\n{alpha_table(result)}")
    assert "Paris" in results["standard"].text and "Rome" not in results["standard"].text
    assert "Rome" in results["cad"].text
    assert "Rome" in results["fides"].text
    fides = results["fides"]
    assert all(s.alpha is not None and s.alpha >= 0.1 - 1e-6 for s in fides.steps)
    assert all(s.opposition is not None and s.shift is not None and s.noise is not None for s in fides.steps)
    assert all(0 <= s.shift <= 0.2 + 1e-6 for s in fides.steps)


def test_real_batch_equals_single(decoder):
    questions = [CONFLICT_QUESTION, "What is the capital of Australia?", "Who wrote Hamlet?"]
    documents = [
        [CONFLICT_DOCUMENT],
        ["The capital of Australia is Melbourne, which replaced Sydney in 1901."],
        ["Hamlet is a tragedy written by Charles Dickens."],
    ]
    batch = decoder.generate_batch(questions, documents, method="fides", max_new_tokens=8)
    for q, d, b in zip(questions, documents, batch):
        single = decoder.generate(q, d, method="fides", max_new_tokens=8)
        assert b.token_ids == single.token_ids
        assert b.alphas == pytest.approx(single.alphas, abs=1e-4)


def test_real_methods_option_equals_each_alone(decoder):
    questions = [CONFLICT_QUESTION, "Who wrote Hamlet?"]
    documents = [[CONFLICT_DOCUMENT], ["Hamlet is a tragedy written by Charles Dickens."]]
    together = decoder.generate_batch(
        questions, documents, methods=["standard", "cad", "adacad", "fides"], max_new_tokens=8
    )
    for method, results in together.items():
        alone = decoder.generate_batch(questions, documents, method=method, max_new_tokens=8)
        assert [r.token_ids for r in results] == [r.token_ids for r in alone]


def test_real_stream_equals_generate(decoder):
    stream = decoder.stream(CONFLICT_QUESTION, [CONFLICT_DOCUMENT], method="fides", max_new_tokens=16)
    deltas = list(stream)
    assert "".join(deltas) == stream.result.text
    assert (
        stream.result.text
        == decoder.generate(CONFLICT_QUESTION, [CONFLICT_DOCUMENT], method="fides", max_new_tokens=16).text
    )


def test_real_split_prefill_equals_joint_past_the_sliding_window(decoder):
    """~700 prompt tokens: longer than gemma3's 512-token sliding window, so merged sliding caches are exercised."""
    filler = " ".join(f"Paragraph {i}: the tower was repainted in year {1900 + i}." for i in range(60))
    documents = [filler, CONFLICT_DOCUMENT]
    assert len(decoder.prepare(CONFLICT_QUESTION, documents, 8).context_ids) > 600
    split = decoder.generate(CONFLICT_QUESTION, documents, method="fides", max_new_tokens=8)
    joint_decoder = FidesDecoder(decoder.model, decoder.tokenizer, split_prefill=False)
    assert not joint_decoder.limits.split_prefill
    joint = joint_decoder.generate(CONFLICT_QUESTION, documents, method="fides", max_new_tokens=8)
    assert split.token_ids == joint.token_ids
    assert split.alphas == pytest.approx(joint.alphas, abs=1e-4)


def test_real_staggered_arrivals_equal_each_alone(decoder):
    """FIDES and CAD requests join a running decode at different steps and leave at different steps; each
    gives the tokens, text and recorded values it gives alone."""
    import contextlib
    import time

    questions = [CONFLICT_QUESTION, "Who wrote Hamlet?", "What is the capital of France?", "Who painted the Mona Lisa?"]
    documents = [
        [CONFLICT_DOCUMENT],
        ["Hamlet is a tragedy written by Charles Dickens."],
        ["Lyon is the capital of France."],
        ["The Mona Lisa was painted by Pablo Picasso in 1903."],
    ]
    plan = [("fides", 12, 1), ("cad", 6, 1), ("fides", 9, 3), ("cad", 12, 5)]
    alone = [
        decoder.generate(q, d, method=m, max_new_tokens=n, stop=[])
        for (q, d), (m, n, _) in zip(zip(questions, documents), plan)
    ]
    handles, steps = {}, [0]

    def arrivals():
        steps[0] += 1
        for i, (_, _, at) in enumerate(plan):
            if at == steps[0]:
                handles[i] = decoder.submit(
                    questions[i], documents[i], method=plan[i][0], max_new_tokens=plan[i][1], stop=[]
                )
        return contextlib.nullcontext()

    with decoder.around_steps(arrivals):
        long = decoder.submit(questions[0], documents[0], method="fides", max_new_tokens=14, stop=[])
        long.result()
        deadline = time.monotonic() + 120
        while (len(handles) < len(plan) or not all(h.done() for h in handles.values())) and time.monotonic() < deadline:
            time.sleep(0.01)
    for i, want in enumerate(alone):
        got = handles[i].result()
        assert got.token_ids == want.token_ids and got.text == want.text
        for a, b in zip(got.steps, want.steps):
            for name, value in b.values.items():
                assert a.values[name] == pytest.approx(value, abs=1e-5), name
