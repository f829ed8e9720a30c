"""A lane's combine and greedy choice compiled with the captured step: the same chosen tokens and records as the eager
lane function, used wherever the lane allows it, and never failing a request where a rule cannot be compiled."""

from __future__ import annotations

import logging

import pytest
import torch

from fides_rag import FidesDecoder, PromptTemplate, get_method
from fides_rag.generation.engine.captured_decide import CapturedDecide, decide_lane
from fides_rag.rules.base import CONTEXT, NO_CONTEXT, StepInputs

QUESTIONS = ["What is the capital of France?", "Who chose Canberra?", "What jumps?"]
DOCUMENTS = [["Lyon is the capital of France."], ["Canberra was chosen."], ["The fox jumps."]]


def lane(rule, rows: int = 3, vocab: int = 50, layers: int = 4, hidden: int = 8) -> dict:
    torch.manual_seed(0)
    lens_layers = rule.lens_layers(layers)
    logits = torch.randn(2 * rows + rows * len(lens_layers), vocab) * 3
    return {
        "rule": rule,
        "logits": logits,
        "layer_states": torch.randn(layers, 2 * rows, hidden),
        "rows": {CONTEXT: torch.arange(rows), NO_CONTEXT: torch.arange(rows, 2 * rows)},
        "lens": {layer: torch.arange(2 * rows + k * rows, 3 * rows + k * rows) for k, layer in enumerate(lens_layers)},
        "num_layers": layers,
    }


@pytest.mark.parametrize("method", ["cad", "fides", "fides+evidence", "adacad"])
def test_the_compiled_lane_gives_the_eager_lanes_tokens_and_records(method):
    inputs = lane(get_method(method))
    chosen, not_finite, has_nan, records = decide_lane(**inputs)
    compiled = CapturedDecide("eager")(**inputs)
    assert compiled is not None
    assert torch.equal(compiled[0], chosen) and torch.equal(compiled[1], not_finite)
    assert torch.equal(compiled[2], has_nan)
    assert records.keys() == compiled[3].keys()
    for name, values in records.items():
        torch.testing.assert_close(compiled[3][name], values)


def test_the_eager_lane_is_the_rules_combine_and_argmax():
    rule = get_method("fides")
    inputs = lane(rule)
    step = StepInputs.from_tensors(
        inputs["logits"][:3],
        inputs["logits"][3:6],
        lens_logits={layer: inputs["logits"][index] for layer, index in inputs["lens"].items()},
        ctx_layer_states=inputs["layer_states"][:, :3],
        no_ctx_layer_states=inputs["layer_states"][:, 3:6],
        num_layers=4,
    )
    want = rule.combine(step)
    chosen, not_finite, has_nan, records = decide_lane(**inputs)
    assert torch.equal(chosen, want.logits.argmax(-1)) and not not_finite.any() and not has_nan.any()
    assert records.keys() == want.records.keys()


def failing_backend(graph, example_inputs):
    raise RuntimeError("this backend compiles nothing")


torch._dynamo.register_backend(failing_backend, name="fides-test-failing")


def test_a_lane_that_cannot_compile_runs_eagerly_with_its_tokens_and_is_counted(tiny_llama, tokenizer, caplog):
    template = PromptTemplate(stop=())
    eager = FidesDecoder(tiny_llama, tokenizer, prompt_template=template, mode="fast")
    failing = FidesDecoder(tiny_llama, tokenizer, prompt_template=template, mode="fast", compile="fides-test-failing")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            got = failing.generate(QUESTIONS[0], DOCUMENTS[0], method="cad", max_new_tokens=4)
            assert got.token_ids == eager.generate(QUESTIONS[0], DOCUMENTS[0], method="cad", max_new_tokens=4).token_ids
    stats = failing.stats
    assert stats.captured_combine_fallbacks >= 8 and stats.captured_combine_lanes == 0 and stats.failed == 0
    assert sum("compiled combine of rule 'cad' runs eagerly" in r.message for r in caplog.records) == 1


def test_greedy_lanes_run_compiled_and_sampled_or_constrained_ones_eagerly(tiny_llama, tokenizer):
    template = PromptTemplate(stop=())
    eager = FidesDecoder(tiny_llama, tokenizer, prompt_template=template, mode="fast")
    compiled = FidesDecoder(tiny_llama, tokenizer, prompt_template=template, mode="fast", compile="eager")
    for method in ("standard", "cad", "fides", "fides+evidence"):
        for q, docs in zip(QUESTIONS, DOCUMENTS):
            want = eager.generate(q, docs, method=method, max_new_tokens=5)
            assert compiled.generate(q, docs, method=method, max_new_tokens=5).token_ids == want.token_ids
    greedy = compiled.stats.captured_combine_lanes
    assert greedy > 0 and compiled.stats.captured_combine_fallbacks == 0
    compiled.generate(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=5, do_sample=True, seed=1)
    compiled.generate(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=5, min_new_tokens=5)
    compiled.generate(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=3, logprobs=2)
    after = compiled.stats.captured_combine_lanes
    assert after - greedy <= 3  # only min_new_tokens' last steps (EOS no longer held) may run compiled
