"""The hot loop's host-sync budget: one device-to-host transfer per step (the chosen ids), and no blocking
host-to-device copy (on CUDA, a blocking one waits for the stream), counted on CPU."""

from __future__ import annotations

import traceback
import weakref
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode

from fides_rag import FidesDecoder, PromptTemplate

SYNCING = {"item", "tolist", "__bool__", "cpu", "__int__", "__float__", "__index__", "numpy"}


class SyncCounter(TorchFunctionMode):
    """Counts tensor calls that move values to the host (or block on them) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_cpu = name == "to" and any(isinstance(a, str) and a == "cpu" for a in [*args[1:], *kwargs.values()])
        if name in SYNCING or to_cpu:
            self.calls[name] += 1
        return func(*args, **kwargs)


class BlockingCopyCounter(TorchFunctionMode):
    """Counts, by the calling line, tensors built on the host (from Python data, with no device) that are copied to a
    device without `non_blocking=True`, and tensors built from Python data straight on a device
    (`torch.tensor(..., device=...)`): on CUDA each such copy waits for the stream."""

    BUILDERS = {"tensor", "as_tensor", "full", "zeros", "ones", "arange"}

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.host_built: dict[int, weakref.ref] = {}  # id -> the tensor (tensors compare elementwise: no WeakSet)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        out = func(*args, **kwargs)
        if name in self.BUILDERS and isinstance(out, torch.Tensor):
            if kwargs.get("device") is None:
                self.host_built[id(out)] = weakref.ref(out)
            elif name in ("tensor", "as_tensor"):
                self._count()
        elif (
            name == "to"
            and self._host_built(args[0])
            and not kwargs.get("non_blocking", False)
            and any(isinstance(a, (torch.device, str)) for a in [*args[1:], kwargs.get("device")])
        ):
            self._count()
        return out

    def _host_built(self, tensor: object) -> bool:
        ref = self.host_built.get(id(tensor))
        return ref is not None and ref() is tensor

    def _count(self) -> None:
        caller = traceback.extract_stack(limit=3)[0]
        self.calls[f"{caller.filename}:{caller.lineno}"] += 1


@pytest.mark.parametrize(
    "method, options", [("fides", {}), ("cad", {"min_new_tokens": 4}), ("standard", {"logprobs": 3})]
)
def test_the_engine_copies_to_the_device_without_blocking(tiny_llama, tokenizer, method, options):
    decoder = FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))
    counter = BlockingCopyCounter()
    with decoder.around_steps(lambda: counter):
        decoder.generate(
            "What is the capital?", ["Lyon is the capital of France."], method=method, max_new_tokens=6, **options
        )
    assert not [line for line in counter.calls if "fides_rag" in line], counter.calls


@pytest.mark.parametrize("logprobs", [None, 5])
@pytest.mark.parametrize(
    "method, sampling",
    [
        ("fides", {}),
        ("cad", {}),
        ("standard", {}),
        ("fides", {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "seed": 0}),
    ],
)
def test_a_decode_makes_one_host_transfer_per_step(tiny_llama, tokenizer, method, sampling, logprobs):
    decoder = FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))
    decoder.eos_token_ids = set()  # every generation runs its full length
    for new_tokens in (6, 12):
        counter = SyncCounter()
        with decoder.around_steps(
            lambda counter=counter: counter
        ):  # torch modes are per thread: count on the engine's thread
            result = decoder.generate(
                "What is the capital?",
                ["Lyon is the capital of France."],
                method=method,
                max_new_tokens=new_tokens,
                logprobs=logprobs,
                **sampling,
            )
        assert len(result.token_ids) == new_tokens
        total = sum(counter.calls.values())
        # N transfers of the chosen ids (with every recorded value and any logprobs packed beside them), and
        # transformers' mask check in each prefill forward (one per path with split prefill).
        assert counter.calls["tolist"] == new_tokens, counter.calls
        assert total <= new_tokens + 2, counter.calls
    if method == "fides":
        assert all(step.alpha is not None and step.noise is not None for step in result.steps)


def test_non_finite_logits_still_raise_naming_the_step(tokenizer):
    from fides_rag import NonFiniteLogitsError
    from fides_rag.testing import build_tiny_model

    model = build_tiny_model("llama", len(tokenizer))
    decoder = FidesDecoder(model, tokenizer)
    import torch

    with torch.no_grad():
        model.lm_head.weight[7, 1] = float("inf")
        model.lm_head.weight[7, 2] = float("-inf")
    with pytest.raises(NonFiniteLogitsError, match="at generation step 0"):
        decoder.generate("Q?", ["doc"], method="fides", max_new_tokens=3)
