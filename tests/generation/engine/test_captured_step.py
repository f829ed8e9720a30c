"""The captured decode step (`compile=`): fast mode's one-token forward under torch.compile(fullgraph=True), padded to
a batch bucket, gives eager's tokens, and requests of one bucket join and leave without a recompilation; bad options
are refused when the decoder is built."""

from __future__ import annotations

import logging

import pytest
import torch

from fides_rag import FidesDecoder, PromptTemplate, get_method
from fides_rag.generation.engine.captured_step import DEFAULT_BUCKETS
from fides_rag.testing import build_tiny_model

QUESTIONS = [
    "What is the capital of France?",
    "Who chose Canberra?",
    "What jumps?",
    "Where is the Seine?",
    "Who was chosen?",
]
DOCUMENTS = [["Lyon is the capital of France."], ["Canberra was chosen."], ["The fox jumps."], ["Paris."], ["Nobody."]]
BUDGETS = [3, 9, 5, 12, 7]  # rows leave at different steps while others decode
METHODS = {"standard": "standard", "fides": "fides", "decore": get_method("decore", heads={1: [0], 3: [1, 2]})}


def eager_and_captured(model, tokenizer, **options):
    template = PromptTemplate(stop=())
    return (
        FidesDecoder(model, tokenizer, prompt_template=template, mode="fast"),
        FidesDecoder(
            model, tokenizer, prompt_template=template, mode="fast", compile="eager", kv_pool_tokens=4096, **options
        ),
    )


@pytest.mark.parametrize(
    ("family", "name"), [("llama", "standard"), ("llama", "fides"), ("llama", "decore"), ("gemma3_text", "fides")]
)
def test_requests_of_one_bucket_join_and_leave_without_a_recompilation_and_get_eager_tokens(
    tiny_models, tokenizer, family, name
):
    eager, captured = eager_and_captured(tiny_models[family], tokenizer, buckets=[16])
    method = METHODS[name]
    captured.generate(QUESTIONS[0], DOCUMENTS[0], method=method, max_new_tokens=3)  # compiles the bucket once
    alone = [eager.generate(q, d, method=method, max_new_tokens=n) for q, d, n in zip(QUESTIONS, DOCUMENTS, BUDGETS)]
    with torch.compiler.set_stance("fail_on_recompile"):  # a graph break or a recompilation raises
        handles = [
            captured.submit(q, d, method=method, max_new_tokens=n) for q, d, n in zip(QUESTIONS, DOCUMENTS, BUDGETS)
        ]
        results = [h.result() for h in handles]
    assert captured.stats.captured_fallback_steps == 0 and captured.stats.failed == 0
    for expected, got in zip(alone, results):
        assert got.token_ids == expected.token_ids and got.finish_reason == expected.finish_reason
        for x, y in zip(expected.steps, got.steps):
            for key in x.values:
                assert y.values[key] == pytest.approx(x.values[key], abs=1e-5)


def test_each_compiled_decoder_has_its_own_recompile_limit(tiny_llama, tokenizer):
    """Graphs are kept per decoder: many compiled decoders in one process (a test session, a server that reloads) do
    not add up to one decoder's recompile limit (1 bucket x 8 hook sets x 2 mask kinds = 16 graphs)."""
    template, alive = PromptTemplate(stop=()), []
    for _ in range(9):  # 9 live decoders x 2 hook sets = 18 graphs of one bucket
        captured = FidesDecoder(
            tiny_llama,
            tokenizer,
            prompt_template=template,
            mode="fast",
            compile="eager",
            buckets=[2],
            kv_pool_tokens=1024,
        )
        alive.append(captured)
        for method in ("standard", "fides"):
            captured.generate(QUESTIONS[0], DOCUMENTS[0], method=method, max_new_tokens=2)
        assert captured.stats.captured_fallback_steps == 0 and captured.stats.failed == 0


def test_a_step_past_the_largest_bucket_runs_eagerly_with_the_same_tokens(tiny_llama, tokenizer):
    eager, captured = eager_and_captured(tiny_llama, tokenizer, buckets=[1])
    expected = eager.generate(
        QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=6
    )  # two rows: more than bucket 1
    assert (
        captured.generate(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=6).token_ids == expected.token_ids
    )


@pytest.mark.slow
def test_the_inductor_captured_step_gives_eager_tokens(tiny_llama, tokenizer):
    template = PromptTemplate(stop=())
    eager = FidesDecoder(tiny_llama, tokenizer, prompt_template=template, mode="fast")
    captured = FidesDecoder(
        tiny_llama, tokenizer, prompt_template=template, mode="fast", compile=True, buckets=[4], kv_pool_tokens=2048
    )
    for question, documents in zip(QUESTIONS[:2], DOCUMENTS[:2]):
        expected = eager.generate(question, documents, method="fides", max_new_tokens=5)
        assert captured.generate(question, documents, method="fides", max_new_tokens=5).token_ids == expected.token_ids


@pytest.mark.parametrize("buckets", [[], [4, 2], [0, 8], [1, 1], [2.0], "8", [True]])
def test_buckets_that_are_not_increasing_positive_integers_are_refused(tiny_llama, tokenizer, buckets):
    with pytest.raises(
        ValueError, match="buckets must be a non-empty sequence of strictly increasing positive integers"
    ):
        FidesDecoder(tiny_llama, tokenizer, mode="fast", compile="eager", buckets=buckets)


def test_compile_needs_fast_mode_and_a_backend_name(tiny_llama, tokenizer):
    with pytest.raises(ValueError, match="compile=True captures fast mode's decode step, but mode='exact'"):
        FidesDecoder(tiny_llama, tokenizer, mode="exact", compile=True)
    with pytest.raises(ValueError, match="compile must be True, False or the name of a torch.compile backend"):
        FidesDecoder(tiny_llama, tokenizer, mode="fast", compile=3)
    with pytest.raises(ValueError, match="kv_pool_tokens must be None or an integer >= 1"):
        FidesDecoder(tiny_llama, tokenizer, mode="fast", kv_pool_tokens=0)


def test_warmup_compiles_every_bucket_and_hook_set_so_requests_of_every_method_join_and_leave_without_a_recompilation(
    tiny_llama, tokenizer
):
    methods = ["standard", "cad", "fides", METHODS["decore"]]
    eager, captured = eager_and_captured(tiny_llama, tokenizer, buckets=[4, 8], warmup=methods)
    assert captured.stats.warmup_s > 0 and captured.stats.captured_fallback_steps == 0
    jobs = [(q, d, n, m) for (q, d, n), m in zip(zip(QUESTIONS, DOCUMENTS, BUDGETS), [*methods, "cad"])]
    alone = [eager.generate(q, d, method=m, max_new_tokens=n).token_ids for q, d, n, m in jobs]
    with torch.compiler.set_stance("fail_on_recompile"):
        handles = [captured.submit(q, d, method=m, max_new_tokens=n) for q, d, n, m in jobs]
        together = [h.result().token_ids for h in handles]
    assert together == alone
    assert captured.stats.captured_fallback_steps == 0 and captured.stats.failed == 0


def test_a_step_that_would_recompile_after_warmup_runs_eagerly_with_the_same_tokens_and_is_counted(
    tiny_llama, tokenizer, caplog
):
    eager, captured = eager_and_captured(tiny_llama, tokenizer, buckets=[4], warmup=["standard"])
    expected = [
        eager.generate(q, d, method="fides", max_new_tokens=4).token_ids for q, d in zip(QUESTIONS[:2], DOCUMENTS[:2])
    ]
    with caplog.at_level(logging.WARNING, logger="fides_rag.generation.engine.captured_step"):
        got = [
            captured.generate(q, d, method="fides", max_new_tokens=4).token_ids
            for q, d in zip(QUESTIONS[:2], DOCUMENTS[:2])
        ]
    assert got == expected  # fides' layer-capture hooks were not warmed up: its steps run eagerly
    assert captured.stats.captured_fallback_steps >= 6 and captured.stats.failed == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "a recompilation was refused" in warnings[0]  # once per reason


def _failing_backend(graph, example_inputs):
    raise RuntimeError("this backend cannot compile anything")


def test_a_compilation_that_fails_never_fails_a_request_its_steps_run_eagerly(tiny_llama, tokenizer, caplog):
    torch._dynamo.register_backend(_failing_backend, name="fides_test_failing")
    template = PromptTemplate(stop=())
    eager = FidesDecoder(tiny_llama, tokenizer, prompt_template=template, mode="fast")
    broken = FidesDecoder(
        tiny_llama, tokenizer, prompt_template=template, mode="fast", compile="fides_test_failing", buckets=[4]
    )
    with caplog.at_level(logging.WARNING, logger="fides_rag.generation.engine.captured_step"):
        for method in ("standard", "fides"):
            expected = eager.generate(QUESTIONS[0], DOCUMENTS[0], method=method, max_new_tokens=5).token_ids
            assert broken.generate(QUESTIONS[0], DOCUMENTS[0], method=method, max_new_tokens=5).token_ids == expected
    assert broken.stats.failed == 0 and broken.stats.captured_fallback_steps >= 8
    assert any("its compilation failed" in r.getMessage() for r in caplog.records)
    assert broken.generate(QUESTIONS[1], DOCUMENTS[1], method="cad", max_new_tokens=3).finish_reason is not None


def test_many_methods_at_many_batch_sizes_fit_in_the_recompile_limit(tiny_llama, tokenizer):
    _, captured = eager_and_captured(tiny_llama, tokenizer, buckets=[1, 2, 4, 8])
    for size in range(1, 6):
        for method in ("standard", "cad", "fides", METHODS["decore"]):
            results = captured.generate_batch(QUESTIONS[:size], DOCUMENTS[:size], method=method, max_new_tokens=3)
            assert len(results) == size
    assert captured.stats.failed == 0 and captured.stats.captured_fallback_steps == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "fast", "warmup": True}, "warmup=True needs compile="),
        ({"mode": "exact", "warmup": ["standard"]}, "needs compile="),
        (
            {"mode": "fast", "compile": "eager", "warmup": "fides"},
            "warmup must be True, False or a non-empty list of methods",
        ),
        (
            {"mode": "fast", "compile": "eager", "warmup": []},
            "warmup must be True, False or a non-empty list of methods",
        ),
    ],
)
def test_warmup_without_compile_or_of_no_methods_is_refused(tiny_llama, tokenizer, options, message):
    with pytest.raises(ValueError, match=message):
        FidesDecoder(tiny_llama, tokenizer, **options)


def test_a_decode_step_carries_only_its_own_rows_hooks_so_a_request_still_prefilling_costs_no_recompilation(
    tiny_llama, tokenizer, monkeypatch
):
    """Long prompts are prefilled in chunks while other rows decode: the decode step's hooks (part of its graph) are
    those of the rows it runs, so after warm-up no step of any method recompiles. Run on flex attention, the path
    whose shapes stay fixed from step to step, as on CUDA."""
    methods = ["standard", "cad", "fides"]
    _, captured = eager_and_captured(
        tiny_llama, tokenizer, buckets=[1, 2], warmup=methods, attention="flex", max_rows=2
    )
    captured.configure(max_num_batched_tokens=64)
    document = [" ".join(["Lyon is the capital of France."] * 40)]
    for method in methods:  # alone: a FIDES request's short no-context row is prefilled before its long one
        assert (
            len(captured.generate(QUESTIONS[0], document, method=method, max_new_tokens=4, min_new_tokens=4).token_ids)
            == 4
        )
    handles = [captured.submit(QUESTIONS[1], document, method=m, max_new_tokens=6) for m in methods]
    assert all(h.result().finish_reason is not None for h in handles)
    assert captured.stats.captured_fallback_steps == 0 and captured.stats.failed == 0


def test_a_step_under_a_dispatch_mode_runs_eagerly_and_keeps_its_bucket_captured(tiny_llama, tokenizer):
    from fides_rag.eval.dispatch_counts import DispatchCounter

    _, captured = eager_and_captured(tiny_llama, tokenizer, buckets=[1], warmup=["standard"])
    counter = DispatchCounter()
    with counter:  # counting aten ops: a graph replay would hide them, so this step runs eagerly
        counted = captured.generate(QUESTIONS[0], DOCUMENTS[0], max_new_tokens=3, min_new_tokens=3).token_ids
    with torch.compiler.set_stance("fail_on_recompile"):
        again = captured.generate(QUESTIONS[0], DOCUMENTS[0], max_new_tokens=3, min_new_tokens=3).token_ids
    assert again == counted and captured.stats.captured_fallback_steps == 0 and captured.stats.failed == 0


def test_one_warm_up_serves_prompts_of_any_length_on_the_gather(tokenizer):
    """A captured step's shapes depend on its bucket only: the gather's width (the longest row's blocks) is a dynamic
    dimension of the graph, so prompts of 1 to 5,000 tokens after a warm-up on a short one run captured."""
    model = build_tiny_model("llama", len(tokenizer), max_position_embeddings=8192)
    template = PromptTemplate(stop=())
    captured = FidesDecoder(
        model, tokenizer, prompt_template=template, mode="fast", compile="eager", buckets=[1], warmup=["standard"]
    )
    eager = FidesDecoder(model, tokenizer, prompt_template=template, mode="fast")
    for words in (1, 13, 100, 400, 1600):  # about 3 tokens a word
        document = " ".join(["Lyon"] * words)
        assert len(tokenizer(document).input_ids) <= 5000
        got = captured.generate("Where?", [document], method="standard", max_new_tokens=6, min_new_tokens=6)
        want = eager.generate("Where?", [document], method="standard", max_new_tokens=6, min_new_tokens=6)
        assert got.token_ids == want.token_ids
    stats = captured.stats
    assert stats.captured_fallback_steps <= 0.05 * stats.steps, (stats.captured_fallback_steps, stats.steps)
    assert stats.failed == 0


def test_a_warm_up_over_the_gather_compiles_as_many_graphs_for_the_default_buckets_as_for_three(tiny_llama, tokenizer):
    """Over the gather the rows are a dynamic dimension of the captured step: a warm-up compiles a graph for one row
    and one for every bucket past it, so its graphs do not grow with the bucket count; each bucket then runs
    captured, with eager's tokens."""
    from torch._dynamo.utils import counters

    graphs = {}
    for buckets in ((1, 2, 4), DEFAULT_BUCKETS):
        before = counters["stats"]["unique_graphs"]
        eager, captured = eager_and_captured(tiny_llama, tokenizer, buckets=list(buckets), warmup=["standard"])
        graphs[len(buckets)] = counters["stats"]["unique_graphs"] - before
        options = {"method": "standard", "max_new_tokens": 3}
        handles = [captured.submit(QUESTIONS[i % 2], DOCUMENTS[i % 2], **options) for i in range(9)]
        want = [eager.generate(QUESTIONS[i % 2], DOCUMENTS[i % 2], **options).token_ids for i in range(9)]
        assert [h.result().token_ids for h in handles] == want
        assert captured.stats.captured_fallback_steps == 0 and captured.stats.failed == 0
    assert len(DEFAULT_BUCKETS) > 3 and graphs[3] == graphs[len(DEFAULT_BUCKETS)] <= 2, graphs
