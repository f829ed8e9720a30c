"""Per-step measurements of one greedy decode, by fides-rag's engine or by transformers' `generate`: the first
`counted` decode steps run under a `DispatchCounter` (aten ops and bytes written, per step) and, on CUDA, with
`torch.cuda.set_sync_debug_mode` counting host synchronisations; the steps after them are timed without either.

Step 0 is the prefill and the first token; decode step i (i >= 1) produces token i. A step's boundary is the end
of the engine's step (its `step_context`) or transformers' stopping-criteria call, both once per token.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from fides_rag.decoder import ForwardTimer, PreparedExample
from fides_rag.eval.dispatch_counts import DispatchCounter, DispatchTotals

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder

SYNC_WARNING = "synchroniz"
"""What torch's sync debug mode says in every warning it emits ("called a synchronizing CUDA operation")."""


class StepProbe(StoppingCriteria):
    """Marks the end of every step (time, dispatch totals, host syncs so far); counts decode steps 1..`counted`."""

    def __init__(
        self,
        counted: int,
        device: torch.device,
        tokens: Callable[[], int] | None = None,
        count_ops: bool | None = None,
        forwards: Callable[[], int] | None = None,
    ) -> None:
        self.counted = counted
        self.tokens = tokens
        """For an engine: the tokens it has decoded so far; a step that decoded none (a prompt chunk) is no mark."""
        self.forwards = forwards
        """For an engine: the backbone forwards timed so far (`ForwardTimer`), read at each of its marks."""
        self.forwards_at_mark: list[int] = []
        self.cuda = device.type == "cuda"
        self.count_ops = not self.cuda if count_ops is None else count_ops
        """Whether counted steps count aten ops (default: off on CUDA, where a counted step would run eagerly instead
        of replaying its captured graph, and flex attention would run unfused: another program than the one timed;
        host syncs are counted either way)."""
        self.counter = DispatchCounter()
        self.marks: list[tuple[float, DispatchTotals, int]] = []
        self._caught: list[warnings.WarningMessage] = []
        self._active: list[warnings.WarningMessage] = []
        self._modes: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def _counting(self) -> Iterator[None]:
        with (
            self.counter if self.count_ops else contextlib.nullcontext(),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            self._active = caught
            if self.cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                if self.cuda:
                    torch.cuda.set_sync_debug_mode("default")
                self._caught.extend(caught)
                self._active = []

    def _syncs(self) -> int:
        return sum(SYNC_WARNING in str(w.message) for w in [*self._caught, *self._active])

    def _mark(self) -> None:
        if self.cuda and len(self.marks) > self.counted:
            torch.cuda.synchronize()  # timed steps only: a counted step's syncs are what is being counted
        self.marks.append((time.perf_counter(), self.counter.totals.copy(), self._syncs()))

    # -- fides-rag's engine: FidesDecoder.around_steps --------------------------------------------

    @contextlib.contextmanager
    def engine_step(self) -> Iterator[None]:
        """Entered around every engine step (`with decoder.around_steps(probe.engine_step): ...`)."""
        step = len(self.marks)
        before = self.tokens() if self.tokens is not None else None
        with self._counting() if 1 <= step <= self.counted else contextlib.nullcontext():
            yield
            if before is None or self.tokens() > before:  # type: ignore[misc]  # tokens is set when before is
                self._mark()
                if self.forwards is not None:
                    self.forwards_at_mark.append(self.forwards())

    # -- transformers' generate: a stopping criterion called once per token --------------------------

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        step = len(self.marks)
        if step == self.counted:
            self.close()
        self._mark()
        if step == 0 and self.counted > 0:
            self._modes = contextlib.ExitStack()
            self._modes.enter_context(self._counting())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]  # transformers' BoolTensor

    def close(self) -> None:
        """Leave the counting modes entered by `__call__` (at the last counted step, or if generation ended first)."""
        if self._modes is not None:
            self._modes.close()
            self._modes = None

    # -- the figures ------------------------------------------------------------------------------

    def timed_forwards(self, forwards_ms: Sequence[float]) -> list[float]:
        """Of every timed forward (`forwards`, in order), those run within the timed steps: after the last counted
        step's mark, up to the last mark (a step with no token of its own counts in the interval that holds it)."""
        marks = self.forwards_at_mark
        return list(forwards_ms[marks[self.counted] : marks[-1]]) if len(marks) > self.counted else []

    def report(self, start: float) -> dict[str, Any]:
        """First-token time, per-step counts of the counted steps, and the mean time of the timed steps."""
        times = [t for t, _, _ in self.marks]
        steps: list[dict[str, Any]] = []
        counted = self.marks[: self.counted + 1]
        for (_, before, syncs_before), (_, after, syncs_after) in zip(counted, counted[1:]):
            step = after - before
            steps.append(
                {
                    "ops": step.op_count,
                    "traffic_bytes": step.traffic(),
                    "host_syncs": syncs_after - syncs_before,
                    "op_calls": dict(step.ops.most_common()),
                }
            )
        timed = len(times) - 1 - self.counted
        traffic = [s["traffic_bytes"]["total"] for s in steps]
        return {
            "tokens": len(times),
            "first_token_ms": (times[0] - start) * 1000 if times else None,
            "decode_ms_per_token": (times[-1] - times[self.counted]) / timed * 1000 if timed > 0 else None,
            "timed_steps": max(timed, 0),
            "counted_steps": len(steps),
            "ops_per_token": statistics.median(s["ops"] for s in steps) if steps and self.count_ops else None,
            "traffic_bytes_per_token": {
                "median": statistics.median(traffic),
                "mean": statistics.fmean(traffic),
                "max": max(traffic),
                "min": min(traffic),
            }
            if steps and self.count_ops
            else None,
            "host_syncs_per_token": statistics.fmean(s["host_syncs"] for s in steps) if steps and self.cuda else None,
            "steps": steps,
        }


def prepared_from_ids(tokenizer: Any, context_ids: Sequence[int], no_context_ids: Sequence[int]) -> PreparedExample:
    """A prompt pair given as token ids, ready for the decoder (no template, no stop strings)."""
    return PreparedExample(
        context_prompt=tokenizer.decode(list(context_ids)),
        no_context_prompt=tokenizer.decode(list(no_context_ids)),
        context_ids=list(context_ids),
        no_context_ids=list(no_context_ids),
        stop=(),
        has_documents=True,
    )


def measure_engine(
    decoder: FidesDecoder, example: PreparedExample, method: Any, new_tokens: int, counted: int
) -> dict[str, Any]:
    """One forced-length greedy decode of `example` by `decoder` (a FidesDecoder), measured step by step."""
    timer = ForwardTimer(decoder.device)
    probe = StepProbe(counted, decoder.device, tokens=lambda: decoder.stats.tokens, forwards=lambda: len(timer))
    with decoder.around_steps(probe.engine_step), decoder.around_forwards(timer):
        start = time.perf_counter()
        result = decoder.generate(example, method=method, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    report = probe.report(start)
    split = forward_split(probe.timed_forwards(timer.times_ms()), report)
    return {**report, **split, "token_ids": list(result.token_ids)}


def forward_split(window_ms: Sequence[float], report: dict[str, Any]) -> dict[str, Any]:
    """The backbone forwards run within the timed steps (`window_ms`; device time on CUDA: a captured step's graph)
    beside the whole steps: milliseconds per token and their share of the step's (the rest is the engine's host work
    and the choice). A step with no token of its own (no mark) counts in the interval that holds it."""
    timed = report["timed_steps"]
    step_ms = report["decode_ms_per_token"]
    if not timed or step_ms is None or not window_ms:
        return {"forward_ms_per_token": None, "forward_share": None}
    forward_ms = sum(window_ms) / timed
    return {"forward_ms_per_token": forward_ms, "forward_share": forward_ms / step_ms}


def measure_generate(
    model: Any,
    context_ids: Sequence[int],
    new_tokens: int,
    counted: int,
    *,
    pad_token_id: int = 0,
    negative_ids: Sequence[int] | None = None,
    guidance_scale: float | None = None,
    inference_mode: bool = False,
    **generate_options: Any,
) -> dict[str, Any]:
    """One forced-length greedy `model.generate` (with `guidance_scale` and `negative_ids`: transformers' CFG; with
    `cache_implementation="static"`: a static cache, whose decode step transformers compiles on CUDA),
    measured step by step; as users call it (under its own no_grad), or inside torch.inference_mode as fides-rag's
    engine runs, where the dispatcher sees whole `linear` calls rather than their parts."""
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([list(context_ids)], device=device)
    extra: dict[str, Any] = dict(generate_options)
    if guidance_scale is not None:
        negative = torch.tensor([list(negative_ids or [])], device=device)
        extra |= {
            "guidance_scale": guidance_scale,
            "negative_prompt_ids": negative,
            "negative_prompt_attention_mask": torch.ones_like(negative),
        }
    probe = StepProbe(counted, device)
    try:
        start = time.perf_counter()
        with torch.inference_mode() if inference_mode else contextlib.nullcontext():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                stopping_criteria=StoppingCriteriaList([probe]),
                pad_token_id=pad_token_id,
                **extra,
            )
    finally:
        probe.close()
    return {**probe.report(start), "token_ids": out[0, ids.shape[1] :].tolist()}
