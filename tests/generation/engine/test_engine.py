"""The continuous-batching engine: requests that arrive before, during and after others give what they give
alone; short requests leave first with their results; cancelled requests free their rows; the bounds hold."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from transformers import StoppingCriteria, StoppingCriteriaList

from fides_rag import FidesDecoder, PromptPair, PromptTemplate, QueueFullError, available_methods, get_method
from fides_rag.method.lens import ModelAnatomy

QUESTIONS = [
    "What is the capital of France?",
    "Who chose Canberra?",
    "What jumps?",
    "Which city is the capital of Australia?",
]
DOCUMENTS = [
    ["Lyon is the capital of France.", "Paris is a large city on the Seine."],
    ["The capital of Australia is Melbourne.", "Canberra was chosen as a compromise."],
    ["The quick brown fox jumps over the lazy dog.", "Lyon."],
    ["Canberra was chosen.", "The capital of Australia is Melbourne. " * 3],
]
RULES = {name: {"decore": dict(heads={1: [0], 3: [1, 2]})}.get(name, {}) for name in available_methods()}
RULES.update(
    {
        "fides+agree": {},
        "adacad+agree": {},
        "cad+nwcad": {},
        "dola+agree": {},
        "dvd+agree": {},  # gates, agree keeping state
        "decore+nwcad": dict(heads={1: [0], 3: [1, 2]}),
    }
)


class Arrivals:
    """A step context that submits requests (question, documents, options) on the engine's thread when the engine
    reaches given steps, so that they join a running decode at a chosen step boundary (deterministic staggering)."""

    def __init__(self, decoder, schedule):
        self.decoder, self.schedule, self.handles, self.steps = decoder, dict(schedule), {}, 0

    def __call__(self):
        self.steps += 1
        for key, (question, documents, options) in self.schedule.pop(self.steps, []):
            self.handles[key] = self.decoder.submit(question, documents, **options)
        return contextlib.nullcontext()


def close(a, b):
    assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
    for x, y in zip(a.steps, b.steps):
        assert x.values.keys() == y.values.keys()
        for name in x.values:
            assert x.values[name] == pytest.approx(y.values[name], abs=1e-5), name


@pytest.fixture
def decoder(tiny_llama, tokenizer):
    return FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_staggered_arrivals_equal_each_request_alone(tiny_models, tokenizer, family):
    """Every method, gated ones too; requests arrive at steps 1 (two at once), 3, 4 and 9, with different budgets, so
    they join running decodes of other methods and leave while others go on (gemma3: a 16-token sliding window)."""
    decoder = FidesDecoder(tiny_models[family], tokenizer, prompt_template=PromptTemplate(stop=()))
    requests, expected = {}, {}
    for i, (name, options) in enumerate(RULES.items()):
        q, docs = QUESTIONS[i % 4], DOCUMENTS[i % 4]
        budget = (5, 11, 3, 8)[i % 4]
        requests[name] = (q, docs, dict(method=get_method(name, **options), max_new_tokens=budget))
        expected[name] = decoder.generate(q, docs, method=get_method(name, **options), max_new_tokens=budget)
    names = list(requests)
    steps = [1, 1, 3, 4, 9, 9, 12, 14, 15]
    arrivals = Arrivals(decoder, {})
    for name, step in zip(names, steps + [16] * len(names)):
        arrivals.schedule.setdefault(step, []).append((name, requests[name]))
    with decoder.around_steps(arrivals):
        first = decoder.submit(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=30)
        first.result()
        while len(arrivals.handles) < len(names) or not all(h.done() for h in arrivals.handles.values()):
            time.sleep(0.01)  # the last arrivals may come after the first request ended: the engine goes on
    for name in names:
        close(arrivals.handles[name].result(), expected[name])
    assert decoder.stats.largest_batch >= 4


def test_a_short_request_submitted_during_a_long_one_finishes_first_with_its_values(decoder):
    short = (QUESTIONS[1], DOCUMENTS[1], dict(method="fides", max_new_tokens=3))
    decoder.eos_token_ids = set()
    arrivals = Arrivals(decoder, {2: [("short", short)]})
    with decoder.around_steps(arrivals):
        long_handle = decoder.submit(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=40)
        while "short" not in arrivals.handles:
            time.sleep(0.001)
        short_result = arrivals.handles["short"].result()
        assert not long_handle.done()  # handed back at its finish, not at the end of the batch
        assert len(short_result.token_ids) == 3 and all(s.alpha is not None for s in short_result.steps)
        long_result = long_handle.result()
    assert arrivals.handles["short"].finished_at < long_handle.finished_at
    assert (
        short_result.token_ids
        == decoder.generate(QUESTIONS[1], DOCUMENTS[1], method="fides", max_new_tokens=3).token_ids
    )
    assert len(long_result.token_ids) == 40


def test_a_cancelled_request_frees_its_rows_and_a_closed_stream_too(decoder):
    decoder.eos_token_ids = set()
    rows: list[int] = []
    hook = ModelAnatomy.of(decoder.model).backbone.register_forward_pre_hook(
        lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        keep = decoder.submit(QUESTIONS[0], DOCUMENTS[0], method="cad", max_new_tokens=60)
        doomed = decoder.submit(QUESTIONS[1], DOCUMENTS[1], method="fides", max_new_tokens=60)
        stream = decoder.stream(QUESTIONS[2], DOCUMENTS[2], method="fides", max_new_tokens=60)
        next(stream)
        while decoder.stats.rows_in_flight < 6:
            time.sleep(0.001)
        doomed.cancel()
        stream.close()
        while decoder.stats.rows_in_flight > 2:
            time.sleep(0.001)
        assert (
            keep.result().token_ids
            == decoder.generate(QUESTIONS[0], DOCUMENTS[0], method="cad", max_new_tokens=60).token_ids
        )
    finally:
        hook.remove()
    assert (
        decoder.stats.peak_rows == 6 and rows[-1] == 2
    )  # three requests decoded together, then the cancelled ones' rows left
    assert doomed.cancelled and decoder.stats.cancelled >= 2


def test_bounds_hold_and_the_queue_can_be_read(decoder):
    decoder.configure(max_rows=4, max_queue=3)
    assert (decoder.limits.max_rows, decoder.limits.max_queue) == (4, 3)
    decoder.eos_token_ids = set()
    seen_rows: list[int] = []
    held = threading.Event()  # no step finishes until the queue has been checked: nothing leaves it meanwhile
    extra = []
    try:
        with decoder.around_steps(
            lambda: (held.wait(60), seen_rows.append(decoder.stats.rows_in_flight), contextlib.nullcontext())[-1]
        ):
            handles = [
                decoder.submit(q, d, method="fides", max_new_tokens=6) for q, d in zip(QUESTIONS[:3], DOCUMENTS[:3])
            ]
            stats = decoder.stats  # at most two of the three run (4 rows), and none has finished
            assert (
                1 <= stats.queue_length <= 3
                and stats.queue_length + stats.requests_in_flight <= 3
                and stats.finished == 0
            )
            with pytest.raises(QueueFullError, match="max_queue is 3"):
                for _ in range(3):  # at least 1 of the 3 waits (at most 4 rows run): 1 + 3 > 3
                    extra.append(decoder.submit(QUESTIONS[3], DOCUMENTS[3], method="fides", max_new_tokens=6))
            held.set()
            results = [h.result() for h in handles]
            for handle in extra:
                handle.result()
        with pytest.raises(ValueError, match="needs 4 batch rows.*max_rows=2"):
            decoder.configure(max_rows=2)
            decoder.submit(QUESTIONS[0], DOCUMENTS[0], methods=["cad", "fides"], max_new_tokens=2)
    finally:
        held.set()
        decoder.configure(max_rows=128, max_queue=None)
    assert max(seen_rows) <= 4  # two FIDES requests (two rows each) at most
    assert [r.token_ids for r in results] == [
        decoder.generate(q, d, method="fides", max_new_tokens=6).token_ids for q, d in zip(QUESTIONS, DOCUMENTS[:3])
    ]


def test_fifo_the_head_of_the_queue_is_never_passed(decoder):
    decoder.configure(max_rows=3)
    decoder.eos_token_ids = set()
    order: list[str] = []
    try:
        first = decoder.submit(QUESTIONS[2], DOCUMENTS[2], method="fides", max_new_tokens=8)
        second = decoder.submit(QUESTIONS[0], DOCUMENTS[0], methods=["standard", "fides"], max_new_tokens=4)  # 3 rows
        third = decoder.submit(QUESTIONS[1], DOCUMENTS[1], method="standard", max_new_tokens=4)  # 1 row
        for name, handle in (("first", first), ("second", second), ("third", third)):
            handle.future.add_done_callback(lambda _, name=name: order.append(name))
        for handle in (first, second, third):
            handle.result()
    finally:
        decoder.configure(max_rows=128)
    assert order.index("third") > order.index("first")  # the small request did not pass the big one waiting
    assert third.first_token_at >= second.first_token_at


def test_static_admission_runs_a_batch_to_its_end(decoder):
    decoder.configure(admission="static", window_s=0.2)  # the first two arrive within the window: one batch
    decoder.eos_token_ids = set()
    try:
        arrivals = Arrivals(
            decoder, {2: [("late", (QUESTIONS[1], DOCUMENTS[1], dict(method="cad", max_new_tokens=2)))]}
        )
        with decoder.around_steps(arrivals):
            first, short = (
                decoder.submit(q, d, method="cad", max_new_tokens=n)
                for q, d, n in ((QUESTIONS[0], DOCUMENTS[0], 8), (QUESTIONS[2], DOCUMENTS[2], 2))
            )
            first.result()
            late = arrivals.handles["late"]
            late.result()
    finally:
        decoder.configure(admission="continuous", window_s=0.0)
    assert short.finished_at == pytest.approx(first.finished_at, abs=0.05)  # released with the whole batch
    assert late.first_token_at > first.finished_at  # admitted once the batch ended


def test_seeded_sampling_alone_equals_under_load(decoder):
    sampled = dict(method="fides", max_new_tokens=10, do_sample=True, temperature=1.3, top_p=0.9, top_k=40, seed=11)
    alone = decoder.generate(QUESTIONS[0], DOCUMENTS[0], **sampled)
    arrivals = Arrivals(decoder, {3: [("sampled", (QUESTIONS[0], DOCUMENTS[0], sampled))]})
    with decoder.around_steps(arrivals):
        others = [
            decoder.submit(q, d, method=m, max_new_tokens=14)
            for q, d, m in zip(QUESTIONS, DOCUMENTS, ("cad", "fides", "standard", "adacad"))
        ]
        [h.result() for h in others]
        while "sampled" not in arrivals.handles:
            time.sleep(0.001)
        under_load = arrivals.handles["sampled"].result()
    close(under_load, alone)


def test_a_stream_read_from_several_threads_and_one_left_open_block_nobody(decoder):
    """A server's thread pool reads a stream one next() per thread; an open stream holds no lock."""
    stream = decoder.stream(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=12)
    left_open = decoder.stream(QUESTIONS[1], DOCUMENTS[1], method="cad", max_new_tokens=12)
    next(left_open)
    deltas: list[str] = []

    def read_one():
        deltas.append(next(stream, None))

    for _ in range(40):
        reader = threading.Thread(target=read_one)
        reader.start()
        reader.join(timeout=30)
        if deltas[-1] is None:
            break
    text = "".join(d for d in deltas if d is not None)
    assert (
        text
        == stream.result.text
        == decoder.generate(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=12).text
    )
    done = threading.Event()
    threading.Thread(target=lambda: (decoder.generate("Who?", ["Ada."], max_new_tokens=3), done.set())).start()
    assert done.wait(30)  # generate completes while another stream is still open
    left_open.close()


def test_cancelling_an_async_reader_cancels_its_request(decoder):
    decoder.eos_token_ids = set()

    async def main():
        stream = decoder.astream(QUESTIONS[0], DOCUMENTS[0], max_new_tokens=200)

        async def read():
            async for _ in stream:
                pass

        task = asyncio.create_task(read())
        while decoder.stats.rows_in_flight == 0:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while decoder.stats.rows_in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert decoder.stats.rows_in_flight == 0 and decoder.stats.cancelled == 1


class _Raise(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        raise RuntimeError("criteria broke")


def test_one_requests_failure_fails_it_alone(decoder):
    class Broken(get_method("cad").__class__):
        name = "broken"

        def combine(self, step):
            return step.ctx_logits  # not a StepOutput

    handles = [
        decoder.submit(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=6),
        decoder.submit(QUESTIONS[1], DOCUMENTS[1], method=Broken(), max_new_tokens=6),
        decoder.submit(
            QUESTIONS[2], DOCUMENTS[2], max_new_tokens=6, stopping_criteria=StoppingCriteriaList([_Raise()])
        ),
    ]
    assert (
        handles[0].result().token_ids
        == decoder.generate(QUESTIONS[0], DOCUMENTS[0], method="fides", max_new_tokens=6).token_ids
    )
    with pytest.raises(TypeError, match="combine must return StepOutput"):
        handles[1].result()
    with pytest.raises(RuntimeError, match="criteria broke"):
        handles[2].result()


def test_prompt_pairs_and_questions_share_the_steps(decoder):
    pair = PromptPair("Lyon is the capital of France.\nQ: capital?\nA:", "Q: capital?\nA:")
    together = decoder.generate_batch([pair, QUESTIONS[1]], [None, DOCUMENTS[1]], method="fides", max_new_tokens=5)
    assert together[0].token_ids == decoder.generate(pair, method="fides", max_new_tokens=5).token_ids
    assert (
        together[1].token_ids
        == decoder.generate(QUESTIONS[1], DOCUMENTS[1], method="fides", max_new_tokens=5).token_ids
    )
    with pytest.raises(ValueError, match="PromptPair already holds its documents"):
        decoder.generate(pair, ["a document"])


def test_a_program_that_exits_with_requests_in_flight_exits_cleanly():
    """The engine's thread stops at its next step boundary at interpreter exit instead of dying inside a kernel."""
    program = textwrap.dedent("""
        import time
        from fides_rag import FidesDecoder
        from fides_rag.testing import build_tiny_model, build_tokenizer
        tokenizer = build_tokenizer()
        decoder = FidesDecoder(build_tiny_model("llama", len(tokenizer)), tokenizer)
        question, documents = "What is the capital?", ["Lyon is the capital."]
        handles = [decoder.submit(question, documents, max_new_tokens=600) for _ in range(3)]
        deadline = time.monotonic() + 60
        while decoder.stats.requests_in_flight < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        print("in flight:", decoder.stats.requests_in_flight)
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "in flight: 3" in done.stdout
    assert "terminate called" not in done.stderr


def test_two_decoders_on_one_model_decode_at_once_without_mixing_their_states(tiny_llama, tokenizer):
    """The hooks that capture layer states live on the model: two engines on one model take turns at their steps,
    so concurrent FIDES requests of two decoders each equal the request alone."""
    first, second = (FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=())) for _ in range(2))
    for decoder in (first, second):
        decoder.eos_token_ids = set()
    alone = [first.generate(q, d, method="fides", max_new_tokens=6) for q, d in zip(QUESTIONS, DOCUMENTS)]
    handles = [
        d.submit(q, docs, method="fides", max_new_tokens=6)
        for q, docs in zip(QUESTIONS, DOCUMENTS)
        for d in (first, second)
    ]
    results = [h.result(timeout=120) for h in handles]
    assert [r.token_ids for r in results] == [a.token_ids for a in alone for _ in range(2)]
    got = [x for r in results for x in r.alphas]
    assert got == pytest.approx([x for a in alone for _ in range(2) for x in a.alphas], abs=1e-5)
