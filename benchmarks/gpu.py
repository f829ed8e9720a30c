"""The GPU check in one command: a random-weight model with Llama-3.1-8B's configuration in bfloat16 (weights do not
matter for timing; nothing is downloaded), on CUDA when present. Sections, each written to --out when it ends, in
the order of `--call 1`:

- correctness: the engine's tokens and log-probabilities against a teacher-forced SDPA forward of the same model
  (top-1 agreement), before anything is timed;
- default: the configuration a user gets by default (fast mode, eager, flex attention on CUDA) at 1, 2, 3, 5, 9, 17
  and 33 rows, counting failed requests;
- attention alone: the whole-pool masked `scaled_dot_product_attention`, block attention (each row's slots gathered,
  then one padded call) and flex attention as the engine calls it, at R rows and P pool positions (one short row in
  the largest pool);
- floor: one read of every weight, the least a batch-1 decode step must spend;
- latency: per-token latency of standard, CAD and FIDES (and, timed by CUDA events on CUDA, how much of a step is the
  backbone's forward: the captured graph's device time) and of the peers (transformers' CFG, `generate` with
  `guidance_scale`; with `--peers`, `generate` with a static cache and `torch.compile`), with host syncs per token on
  CUDA and aten ops per step;
- batch: standard and FIDES at --batch-sizes requests decoding together;
- serving (`fides_rag.eval.serving`): continuous against static batching at --loads times the sequential capacity.
Outside the call: exactness (alone against together, in each mode) and budget (the step-budget sweep).

Prompts are token ids (a word-level tokenizer over the model's vocabulary is built offline): an instruction prefix,
the documents and a question; the no-context prompt is the prefix and the question. It needs torch, transformers and
accelerate only. With `--compile` fast mode's decode step is captured at `--buckets`, every bucket compiled before
the first section (reported apart, as `compile`), and dynamo's recompile and CUDA-graph log lines are kept.

Modes: exact and fast on the CPU; fast only on CUDA (exact mode is refused there, see
`fides_rag/generation/engine/modes.py`).

    TORCHINDUCTOR_CACHE_DIR=results/gpu/inductor python benchmarks/gpu.py --call 1 --out results/gpu/h200.json
    python benchmarks/gpu.py --tiny --device cpu --call 1 --out /tmp/gpu.json      # seconds on a CPU (CI runs it)
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

LLAMA_31_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    bos_token_id=128000,
    eos_token_id=[128001, 128008, 128009],
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
)
"""meta-llama/Llama-3.1-8B-Instruct's config.json (the values that shape the computation)."""
TINY = dict(
    LLAMA_31_8B,
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    bos_token_id=500,
    eos_token_id=[501],
)
SPECIAL = {"pad": -252, "unk": -254}
"""The pad and unknown-word ids, from the end of the vocabulary (Llama 3.1: 128004, its fine-tuning pad, and 128002)."""
METHODS = ("standard", "cad", "fides")
PEER = "hf-cfg"
STATIC_PEER = "hf-static-compile"
CALLS = {1: ("correctness", "default", "attention", "floor", "latency", "batch", "serving")}
"""The sections of the one GPU call, in order: correctness first, then the default configuration, then timings."""
MODED = ("exactness", "latency", "batch")
"""Sections run once per engine mode."""
OPTIONAL = ("gguf", "pandas", "fastapi", "llguidance")
"""Packages the GPU machine may lack: the run reports any of them it imported (it should import none)."""


def word_tokenizer(vocab_size: int, bos: int, eos: int, max_length: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose words are w0 ... w{V-1}: any id decodes, and text of such words encodes back
    (other words, such as the prompt template's, encode as the unknown word)."""
    vocab = {f"w{i}": i for i in range(vocab_size)}
    special = {"<bos>": bos, "<eos>": eos, "<pad>": vocab_size + SPECIAL["pad"], "<unk>": vocab_size + SPECIAL["unk"]}
    for name, i in special.items():
        del vocab[f"w{i}"]
        vocab[name] = i
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.model_max_length = max_length
    return tokenizer


def build(config_values: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0) -> tuple[Any, Any]:
    """The random-weight model, initialised on `device`, and its tokenizer."""
    config = LlamaConfig(**config_values)
    torch.manual_seed(seed)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    tokenizer = word_tokenizer(
        config.vocab_size, config.bos_token_id, config_values["eos_token_id"][0], config.max_position_embeddings
    )
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


class Prompts:
    """Random token-id prompts: [prefix, documents, question] and [prefix, question]."""

    def __init__(self, vocab_size: int, reserved: set[int], seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.words = [i for i in range(min(vocab_size, 100_000)) if i not in reserved]
        self.prefix = self.ids(64)

    def ids(self, n: int) -> list[int]:
        return [self.rng.choice(self.words) for _ in range(n)]

    def pair(self, context_tokens: int, question_tokens: int) -> tuple[list[int], list[int]]:
        question = self.ids(question_tokens)
        documents = self.ids(max(1, context_tokens - len(self.prefix) - question_tokens))
        return self.prefix + documents + question, self.prefix + question

    def text(self, n: int) -> str:
        return " ".join(f"w{i}" for i in self.ids(n))


def peak_memory(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
        }
    import resource

    return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _time_ms(fn: Any, device: torch.device, repeats: int) -> float:
    """Median milliseconds of `fn()` after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def whole_pool_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """query [R, heads, 1, d] over the whole pool [1, kv_heads, P, d], masked by mask [1, 1, R * groups, P]."""
    rows, heads, _, dim = query.shape
    kv_heads = keys.shape[1]
    folded = query.reshape(rows, kv_heads, heads // kv_heads, dim).transpose(0, 1).reshape(1, kv_heads, -1, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        folded, keys, values, attn_mask=mask
    )  # [1, kv_heads, R * groups, d]
    return out.reshape(kv_heads, rows, heads // kv_heads, dim).transpose(0, 1).reshape(rows, heads, dim)


def block_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """query [R, heads, 1, d] over each row's own slots (slots [R, L], valid [R, L]: padding is False), gathered."""
    rows, heads, _, dim = query.shape
    kv_heads = keys.shape[1]
    own_keys = (
        keys[0].index_select(1, slots.reshape(-1)).reshape(kv_heads, rows, -1, dim).transpose(0, 1)
    )  # [R, kv_heads, L, d]
    own_values = values[0].index_select(1, slots.reshape(-1)).reshape(kv_heads, rows, -1, dim).transpose(0, 1)
    folded = query.reshape(rows, kv_heads, heads // kv_heads, dim)  # [R, kv_heads, groups, d]
    out = torch.nn.functional.scaled_dot_product_attention(
        folded, own_keys, own_values, attn_mask=valid[:, None, None, :]
    )
    return out.reshape(rows, heads, dim)


def flex_block_mask(tables: list[list[int]], lengths: list[int], positions: int, device: torch.device) -> Any:
    """The BlockMask the engine's flex backend builds: row r lists its own blocks of 16, every one partial (masked by
    position), over a pool of `positions` slots."""
    from torch.nn.attention.flex_attention import BlockMask

    rows, width = len(tables), max(len(t) for t in tables)
    num = torch.tensor([len(t) for t in tables], dtype=torch.int32)
    indices = torch.zeros((rows, width), dtype=torch.int32)
    owner = torch.full((positions // 16,), -1, dtype=torch.int32)
    ordinal = torch.zeros((positions // 16,), dtype=torch.int32)
    for r, table in enumerate(tables):
        indices[r, : len(table)] = torch.tensor(table, dtype=torch.int32)
        owner[table] = r
        ordinal[table] = torch.arange(len(table), dtype=torch.int32)
    last_position = torch.tensor(lengths, dtype=torch.int32) - 1
    owner, ordinal, last_position = owner.to(device), ordinal.to(device), last_position.to(device)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        block = kv // 16
        return (owner[block] == b) & (ordinal[block] * 16 + kv % 16 <= last_position[b])

    return BlockMask.from_kv_blocks(
        kv_num_blocks=num[:, None, None].to(device),
        kv_indices=indices[:, None, None].to(device),
        BLOCK_SIZE=(16, 16),
        mask_mod=mask_mod,
        seq_lengths=(1, positions),
        compute_q_blocks=False,
    )


FLEX_KERNEL_OPTIONS = {"BLOCK_M": 16, "BLOCK_N": 16}
"""The engine's flex tiles: its pool's block."""


@functools.cache
def _compiled_flex() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_attention_rows(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_mask: Any) -> Any:
    """query [R, heads, 1, d] over the whole pool [1, kv_heads, P, d] under `block_mask`, as the engine's flex backend
    calls it (its kernel options; compiled on CUDA, eager elsewhere)."""
    from torch.nn.attention.flex_attention import flex_attention

    run = _compiled_flex() if query.device.type == "cuda" else flex_attention
    out = run(query, keys, values, block_mask=block_mask, enable_gqa=True, kernel_options=FLEX_KERNEL_OPTIONS)
    return out.reshape(query.shape[0], query.shape[1], -1)


def attention(decoder: Any, prompts: Prompts, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Attention alone, one layer, one decode step: the whole-pool masked SDPA (every slot of the pool, each row's
    queries masked to its own) against block attention, at --attention-rows rows and --attention-positions pool
    positions shared out among them (rows of unequal lengths, in scattered blocks of 16). Block attention is
    measured both ways the engine runs it, written here as the engine writes them: each row's slots gathered, then
    one padded SDPA (the CPU's path), and flex attention under a BlockMask of each row's blocks (CUDA's path).
    `decoder` is unused: the section needs only the configuration (args.config_values), so it runs first, before
    any decoder is built or compiled."""
    config = args.config_values
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    dim = config.get("head_dim") or config["hidden_size"] // heads
    dtype = args.torch_dtype
    generator = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": dim,
        "dtype": str(dtype).removeprefix("torch."),
        "cases": {},
    }
    for positions in args.attention_positions:
        blocks = positions // 16
        keys = torch.randn((1, kv_heads, positions, dim), generator=generator).to(device, dtype)
        values = torch.randn((1, kv_heads, positions, dim), generator=generator).to(device, dtype)
        for rows in args.attention_rows:
            if rows > blocks:
                continue
            order = torch.randperm(blocks, generator=generator)  # each row's blocks are scattered over the pool
            per_row = blocks // rows
            counts = [max(1, per_row - (r % 3)) for r in range(rows)]  # unequal lengths: the gather pads
            if rows == 1 and positions > args.short_row:  # one short row in a large pool: flex's KV splits
                per_row, counts = args.short_row // 16, [args.short_row // 16]
            width = max(counts) * 16
            slot_table = torch.zeros((rows, width), dtype=torch.long)
            valid = torch.zeros((rows, width), dtype=torch.bool)
            owner = torch.full((positions,), -1, dtype=torch.long)
            for r in range(rows):
                own = order[r * per_row : r * per_row + counts[r]]
                slots = (own[:, None] * 16 + torch.arange(16)).reshape(-1)
                slot_table[r, : len(slots)], valid[r, : len(slots)] = slots, True
                owner[slots] = r
            query = torch.randn((rows, heads, 1, dim), generator=generator).to(device, dtype)
            query_rows = torch.arange(rows).repeat_interleave(heads // kv_heads)[:, None]
            mask = (owner[None, :] == query_rows)[None, None].to(device)  # [1, 1, R * groups, P]
            tables = [order[r * per_row : r * per_row + counts[r]].tolist() for r in range(rows)]
            block_mask = flex_block_mask(tables, [c * 16 for c in counts], positions, device)
            slot_table, valid = slot_table.to(device), valid.to(device)
            whole = _time_ms(
                lambda q=query, k=keys, v=values, m=mask: whole_pool_attention(q, k, v, m),
                device,
                args.attention_repeats,
            )
            block = _time_ms(
                lambda q=query, k=keys, v=values, t=slot_table, ok=valid: block_attention(q, k, v, t, ok),
                device,
                args.attention_repeats,
            )
            flex = _time_ms(
                lambda q=query, k=keys, v=values, m=block_mask: flex_attention_rows(q, k, v, m),
                device,
                args.attention_repeats,
            )
            reference = whole_pool_attention(query, keys, values, mask).float()
            difference = (reference - block_attention(query, keys, values, slot_table, valid).float()).abs().max()
            flex_difference = (reference - flex_attention_rows(query, keys, values, block_mask).float()).abs().max()
            out["cases"][f"R={rows},P={positions}"] = {
                "rows": rows,
                "positions": positions,
                "row_positions": [c * 16 for c in counts][:4],
                "whole_pool_ms": whole,
                "block_ms": block,
                "whole_pool/block": whole / block,
                "flex_ms": flex,
                "whole_pool/flex": whole / flex,
                "max_abs_difference": float(difference),
                "flex_max_abs_difference": float(flex_difference),
            }
        del keys, values
    out["memory"] = peak_memory(device)
    return out


def latency(decoder: Any, prompts: Prompts, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Batch 1, greedy, --new-tokens forced; one warm-up prompt, then --samples prompts with the methods interleaved."""
    from fides_rag.eval.step_probe import measure_engine, measure_generate, prepared_from_ids

    pairs = [prompts.pair(args.context_tokens, args.question_tokens) for _ in range(args.samples + 1)]
    peers = [p for p in args.peers if p in (PEER, STATIC_PEER)]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in (*METHODS, *peers)}
    reset_peak(device)
    for i, (context, no_context) in enumerate(pairs):
        for method in runs:
            if method == PEER:
                run = measure_generate(
                    decoder.model,
                    context,
                    args.new_tokens,
                    args.counted_steps,
                    negative_ids=no_context,
                    guidance_scale=2.0,
                    pad_token_id=decoder.tokenizer.pad_token_id,
                )
            elif method == STATIC_PEER:  # transformers compiles the decode step of a static cache on CUDA (CUDA graphs)
                run = measure_generate(
                    decoder.model,
                    context,
                    args.new_tokens,
                    args.counted_steps,
                    pad_token_id=decoder.tokenizer.pad_token_id,
                    cache_implementation="static",
                )
            else:
                run = measure_engine(
                    decoder,
                    prepared_from_ids(decoder.tokenizer, context, no_context),
                    method,
                    args.new_tokens,
                    args.counted_steps,
                )
            if i > 0:
                runs[method].append(run)
    out: dict[str, Any] = {
        "context_tokens": args.context_tokens,
        "no_context_tokens": len(pairs[0][1]),
        "new_tokens": args.new_tokens,
        "methods": {},
    }
    for method, measured in runs.items():
        out["methods"][method] = {
            "decode_ms_per_token": statistics.median(r["decode_ms_per_token"] for r in measured),
            "first_token_ms": statistics.median(r["first_token_ms"] for r in measured),
            "ops_per_token": None
            if measured[0]["ops_per_token"] is None
            else statistics.median(r["ops_per_token"] for r in measured),
            "traffic_bytes_per_token": None
            if measured[0]["traffic_bytes_per_token"] is None
            else statistics.median(r["traffic_bytes_per_token"]["median"] for r in measured),
            "host_syncs_per_token": measured[0]["host_syncs_per_token"],
            "forward_ms_per_token": _median_of(measured, "forward_ms_per_token"),
            "forward_share": _median_of(measured, "forward_share"),
            "samples": len(measured),
        }
    decode = {m: d["decode_ms_per_token"] for m, d in out["methods"].items()}
    out["ratios"] = {
        "fides/cad": decode["fides"] / decode["cad"],
        "fides/standard": decode["fides"] / decode["standard"],
    }
    if PEER in decode:
        out["ratios"]["cad/hf-cfg"] = decode["cad"] / decode[PEER]
    if STATIC_PEER in decode:
        out["ratios"]["standard/hf-static-compile"] = decode["standard"] / decode[STATIC_PEER]
    out["memory"] = peak_memory(device)
    return out


def _median_of(measured: list[dict[str, Any]], key: str) -> float | None:
    """The median of `key` over the runs that report it (the engine's; transformers' runs do not)."""
    values = [r[key] for r in measured if r.get(key) is not None]
    return statistics.median(values) if values else None


def batch_scaling(decoder: Any, prompts: Prompts, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Decode ms per step, tokens/s and aten ops per step of standard and FIDES with 1..32 requests decoding together
    (the first --counted-steps decode steps are counted, the rest timed). Request i's context prompt is 8 i tokens
    longer than the first's, as in serving, where prompts differ (so each request's cache is its own segment). The
    step budget holds every prompt, so all of them are prefilled before the first decode step: the measured steps
    decode only."""
    from fides_rag.eval.step_probe import StepProbe, prepared_from_ids

    out: dict[str, Any] = {}
    default = decoder.limits.max_num_batched_tokens
    try:
        for method in ("standard", "fides"):
            out[method] = {}
            for size in args.batch_sizes:
                pairs = [prompts.pair(args.context_tokens + 8 * i, args.question_tokens) for i in range(size)]
                decoder.configure(max_num_batched_tokens=max(default, sum(len(c) + len(n) for c, n in pairs)))
                examples = [prepared_from_ids(decoder.tokenizer, *pair) for pair in pairs]
                reset_peak(device)
                probe = StepProbe(args.counted_steps, device)
                with decoder.around_steps(probe.engine_step):
                    start = time.perf_counter()
                    decoder.generate_batch(
                        examples, method=method, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens
                    )
                report = probe.report(start)
                step_ms = report["decode_ms_per_token"]
                out[method][str(size)] = {
                    "decode_ms_per_step": step_ms,
                    "first_step_ms": report["first_token_ms"],
                    "tokens_per_s": size * 1000 / step_ms,
                    "ops_per_step": report["ops_per_token"],
                    **peak_memory(device),
                }
    finally:
        decoder.configure(max_num_batched_tokens=default)
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The index of the first token where `a` and `b` differ (a length difference counts), None when equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def exactness(decoder: Any, prompts: Prompts, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Each request decoded alone, then all of them submitted at once (every method's, interleaved, so that they join
    the running batch one after another), greedy: the counts of requests whose tokens are equal. A GPU kernel whose
    reduction order depends on the batch (a matrix product's split, attention's split of the keys) breaks it."""
    from fides_rag.eval.step_probe import prepared_from_ids

    examples = [
        prepared_from_ids(decoder.tokenizer, *prompts.pair(args.context_tokens + 8 * i, args.question_tokens))
        for i in range(args.exact_requests)
    ]
    jobs = [(method, i) for i in range(len(examples)) for method in METHODS]
    alone = {
        job: decoder.generate(examples[job[1]], method=job[0], max_new_tokens=args.exact_tokens).token_ids
        for job in jobs
    }
    handles = {job: decoder.submit(examples[job[1]], method=job[0], max_new_tokens=args.exact_tokens) for job in jobs}
    together = {job: handle.result().token_ids for job, handle in handles.items()}
    out: dict[str, Any] = {"requests": len(examples), "new_tokens": args.exact_tokens, "methods": {}}
    for method in METHODS:
        differences = [first_difference(alone[(method, i)], together[(method, i)]) for i in range(len(examples))]
        out["methods"][method] = {"equal": sum(d is None for d in differences), "first_differing_token": differences}
    return out


DECISIVE_MARGIN = 0.5
"""Nats between the reference's first and second token above which a step is decisive: random weights leave many
near-ties, which any two kernels in bfloat16 may break differently."""


def _teacher_forced(model: Any, prompt: list[int], tokens: list[int], device: torch.device) -> torch.Tensor:
    """Log-probabilities of one SDPA forward over prompt plus tokens, at the positions that chose each token: [N, V]."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens], device=device)).logits[0].float()
    start = len(prompt) - 1
    return logits[start : start + len(tokens)].log_softmax(-1)


def _agreement(reference: torch.Tensor, tokens: list[int]) -> dict[str, Any]:
    top2 = reference.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    chosen = torch.tensor(tokens, device=reference.device)
    same = reference.argmax(-1) == chosen
    decisive = margin >= DECISIVE_MARGIN
    return {"same": int(same.sum()), "decisive": int(decisive.sum()), "decisive_same": int((same & decisive).sum())}


def correctness(decoder: Any, prompts: Prompts, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The engine against a teacher-forced reference on the timed model, before anything is timed. --correct-requests
    standard requests are decoded together (as they are served), and each is fed back through one SDPA forward of
    the same model (prompt plus the engine's tokens): the share of steps whose reference argmax is the engine's token
    (top-1 agreement, over every step and over decisive ones, where the reference's top two are at least
    DECISIVE_MARGIN nats apart), and the largest difference of the chosen token's log-probability. transformers'
    own greedy `generate` (batch 1, its cache, SDPA) is held to the same reference: the floor two correct decoders
    reach in this dtype."""
    from fides_rag.eval.step_probe import prepared_from_ids

    pairs = [prompts.pair(args.context_tokens // 4 + 8 * i, args.question_tokens) for i in range(args.correct_requests)]
    examples = [prepared_from_ids(decoder.tokenizer, *pair) for pair in pairs]
    handles = [decoder.submit(e, method="standard", max_new_tokens=args.correct_tokens, logprobs=0) for e in examples]
    results = [h.result() for h in handles]
    model = decoder.model
    totals = {"engine": [0, 0, 0, 0], "hf-generate": [0, 0, 0, 0]}  # steps, same, decisive, decisive same
    worst = 0.0
    for example, result in zip(examples, results):
        prompt, tokens = list(example.context_ids), list(result.token_ids)
        reference = _teacher_forced(model, prompt, tokens, device)
        counts = _agreement(reference, tokens)
        for step, token in enumerate(tokens):
            recorded = result.steps[step].logprob if step < len(result.steps) else None
            if recorded is not None:
                worst = max(worst, abs(float(reference[step, token]) - recorded))
        with torch.inference_mode():
            generated = model.generate(
                torch.tensor([prompt], device=device),
                max_new_tokens=len(tokens),
                min_new_tokens=len(tokens),
                do_sample=False,
                pad_token_id=decoder.tokenizer.pad_token_id,
            )[0, len(prompt) :].tolist()
        peer = _agreement(_teacher_forced(model, prompt, generated, device), generated)
        for name, c, n in (("engine", counts, len(tokens)), ("hf-generate", peer, len(generated))):
            for i, value in enumerate((n, c["same"], c["decisive"], c["decisive_same"])):
                totals[name][i] += value
    out: dict[str, Any] = {
        "requests": len(examples),
        "decisive_margin": DECISIVE_MARGIN,
        "max_abs_logprob_difference": worst,
        "failed_requests": decoder.stats.failed,
        "attention": decoder.limits.attention,
    }
    for name, (steps, same, decisive, decisive_same) in totals.items():
        out[name] = {
            "tokens": steps,
            "top1_agreement": same / max(steps, 1),
            "decisive_tokens": decisive,
            "decisive_top1_agreement": decisive_same / decisive if decisive else None,
        }
    return out


def default_configuration(
    decoder: Any, prompts: Prompts, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """What a user gets by default (fast mode, eager, flex on CUDA): R standard requests submitted together at each
    row count of --default-rows, every one of which must finish; the step padding and flex graphs per bucket are
    exercised here. Counts failed requests and the seconds each row count took (flex compiles a bucket's graph the
    first time it runs)."""
    from fides_rag.eval.step_probe import prepared_from_ids

    out: dict[str, Any] = {"attention": decoder.limits.attention, "rows": {}}
    for rows in args.default_rows:
        examples = [
            prepared_from_ids(decoder.tokenizer, *prompts.pair(args.context_tokens // 8 + 8 * i, args.question_tokens))
            for i in range(rows)
        ]
        failed_before = decoder.stats.failed
        start = time.perf_counter()
        handles = [decoder.submit(e, method="standard", max_new_tokens=args.default_tokens) for e in examples]
        errors = []
        for handle in handles:
            try:
                handle.result()
            except Exception as error:  # counted and reported: the section's point is that none fail
                errors.append(f"{type(error).__name__}: {error}"[:300])
        out["rows"][str(rows)] = {
            "seconds": time.perf_counter() - start,
            "failed": decoder.stats.failed - failed_before,
            "errors": errors[:2],
        }
    out["failed_requests"] = sum(r["failed"] for r in out["rows"].values())
    return out


def weight_floor(decoder: Any, prompts: Prompts, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The weight-read floor measured on the card: one read of every weight (a sum per tensor), the least a decode
    step of batch 1 must spend; and the bandwidth it implies."""
    params = [p for p in decoder.model.parameters()]
    weights = sum(p.numel() * p.element_size() for p in params)

    def read_all() -> None:
        for p in params:
            p.sum(dtype=torch.float32)

    ms = _time_ms(read_all, device, 5)
    return {"weights_gib": weights / 2**30, "read_ms": ms, "bandwidth_gb_s": weights / ms / 1e6}


def synthetic_examples(prompts: Prompts, args: argparse.Namespace, n: int) -> list[Any]:
    """`n` NQ-Swap-sized examples of the word-level vocabulary: a question and one document of half the context."""
    from fides_rag.eval.datasets import QAExample

    return [
        QAExample(prompts.text(args.question_tokens), (prompts.text(args.context_tokens // 2),), ("w1",))
        for _ in range(n)
    ]


def serving(decoder: Any, prompts: Prompts, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """fides-rag's serving benchmark on synthetic NQ-Swap-sized examples: continuous against static batching."""
    from fides_rag.eval.serving import serving as run_serving

    reset_peak(device)
    low, high = args.serving_tokens
    result = run_serving(
        decoder,
        synthetic_examples(prompts, args, args.serving_requests),
        loads=args.loads,
        n_requests=args.serving_requests,
        tokens=(low, high),
        static_batch=args.static_batch,
        modes=("continuous", "static"),
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    result["memory"] = peak_memory(device)
    return result


def budget_sweep(decoder: Any, prompts: Prompts, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Continuous serving at --budget-load under each --budgets step budget (`fides_rag.eval.budget_sweep`)."""
    from fides_rag.eval.budget_sweep import budget_sweep as sweep

    return sweep(
        decoder,
        synthetic_examples(prompts, args, args.budget_requests),
        budgets=args.budgets,
        load=args.budget_load,
        n_requests=args.budget_requests,
        tokens=tuple(args.serving_tokens),
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )


SECTIONS = {
    "correctness": correctness,
    "default": default_configuration,
    "attention": attention,
    "floor": weight_floor,
    "exactness": exactness,
    "latency": latency,
    "batch": batch_scaling,
    "serving": serving,
    "budget": budget_sweep,
}
"""The sections by name, in the order a full run takes them."""


class CompileLog(logging.Handler):
    """Keeps torch's recompile and CUDA-graph log lines (`TORCH_LOGS=recompiles,cudagraphs`)."""

    LIMIT = 200

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < self.LIMIT:
            self.lines.append(f"{record.name}: {record.getMessage()}"[:500])

    def __enter__(self) -> CompileLog:
        torch._logging.set_logs(recompiles=True, cudagraphs=True, graph_breaks=True)
        logging.getLogger("torch").addHandler(self)
        return self

    def __exit__(self, *_exc: Any) -> None:
        logging.getLogger("torch").removeHandler(self)
        torch._logging.set_logs()

    def summary(self) -> dict[str, Any]:
        from torch._dynamo.utils import counters

        skipped = [line for line in self.lines if "skipping cudagraphs" in line]
        return {
            "cudagraphs_skipped": bool(skipped) or counters["inductor"].get("cudagraph_skips", 0) > 0,
            "recompiles": sum("Recompiling function" in line for line in self.lines),
            "graph_breaks": sum("Graph break" in line for line in self.lines),
            "lines": self.lines,
        }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import transformers

    from fides_rag import FidesDecoder
    from fides_rag.models.loading import select_device

    device = select_device(args.device)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[args.dtype]
    values = dict(TINY if args.tiny else LLAMA_31_8B)
    if args.layers:
        values["num_hidden_layers"] = args.layers
    started = time.perf_counter()
    model, tokenizer = build(values, device, dtype)
    modes = args.modes or (["exact", "fast"] if device.type == "cpu" else ["fast"])
    compile_ = bool(args.compile)
    fast: dict[str, Any] = {"compile": False, "attention": args.attention}  # buckets, warm-up: compiled steps only
    if compile_:
        fast |= {"compile": args.compile_backend, "buckets": args.buckets, "warmup": list(METHODS)}
    if args.kv_pool_tokens is not None:
        fast["kv_pool_tokens"] = args.kv_pool_tokens
    report: dict[str, Any] = {
        "config": "tiny" if args.tiny else "Llama-3.1-8B",
        "config_values": values,
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "modes": modes,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "weights_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "sections": {},
    }
    args.config_values, args.torch_dtype = values, dtype
    with CompileLog() as log:
        decoders: dict[str, Any] = {}
        prompts = Prompts(
            values["vocab_size"],
            {values["bos_token_id"], *values["eos_token_id"], tokenizer.pad_token_id, tokenizer.unk_token_id},
        )
        for name in args.sections:
            if name != "attention" and not decoders:
                # a captured fast decoder compiles every bucket here, timed apart from the sections
                for mode in modes:
                    decoders[mode] = FidesDecoder(model, tokenizer, mode=mode, **(fast if mode == "fast" else {}))
                if "fast" in decoders:
                    report["compile"] = {
                        "enabled": compile_,
                        "backend": args.compile_backend if compile_ else None,
                        "buckets": args.buckets,
                        "warmup_s": decoders["fast"].stats.warmup_s,
                    }
                    report["compile_log"] = log.summary()
                    write(report, args.out)
            print(f"{name} ...", file=sys.stderr, flush=True)
            begun = time.perf_counter()
            try:  # one section's failure is reported in its place, and the call goes on to the next
                if name in MODED:
                    report["sections"][name] = {"modes": {}}
                    for mode, decoder in decoders.items():
                        report["sections"][name]["modes"][mode] = SECTIONS[name](decoder, prompts, args, device)
                        write(report, args.out)
                else:
                    report["sections"][name] = SECTIONS[name](decoders.get(modes[-1]), prompts, args, device)
            except Exception as error:
                report["sections"][name] = {"error": f"{type(error).__name__}: {error}"[:2000]}
                print(f"{name} failed: {report['sections'][name]['error']}", file=sys.stderr, flush=True)
            report["sections"][name]["seconds"] = time.perf_counter() - begun
            if "fast" in decoders:
                report["compile"]["fallback_steps"] = decoders["fast"].stats.captured_fallback_steps
            report["compile_log"] = log.summary()
            write(report, args.out)
    report["seconds"] = time.perf_counter() - started
    report["optional_packages_imported"] = sorted(m for m in OPTIONAL if m in sys.modules)
    write(report, args.out)
    return report


def write(report: dict[str, Any], out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")


def tables(report: dict[str, Any]) -> str:
    """Markdown tables of a report."""
    lines = [
        f"{report['config']} ({report['dtype']}, random weights) on {report['device']}, torch {report['torch']}, "
        f"transformers {report.get('transformers', '?')}.",
        "",
    ]
    sections = {k: v for k, v in report["sections"].items() if "error" not in v}
    lines += [f"Section {k} failed: {v['error']}" for k, v in report["sections"].items() if "error" in v]
    if "correctness" in sections:
        c = sections["correctness"]
        e, h = c["engine"], c["hf-generate"]
        share = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
        lines += [
            f"Correctness ({c['attention']} attention), top-1 agreement with a teacher-forced SDPA forward of the same "
            f"model: the engine {share(e['top1_agreement'])} of {e['tokens']} tokens "
            f"({share(e['decisive_top1_agreement'])} of {e['decisive_tokens']} decisive ones, margin at least "
            f"{c['decisive_margin']} nats); transformers' generate {share(h['top1_agreement'])} "
            f"({share(h['decisive_top1_agreement'])} of {h['decisive_tokens']}); largest log-probability difference "
            f"{c['max_abs_logprob_difference']:.3g}; {c['failed_requests']} failed requests.",
            "",
        ]
    if "default" in sections:
        d = sections["default"]
        per_rows = ", ".join(f"{r} rows {v['seconds']:.1f} s" for r, v in d["rows"].items())
        lines += [f"Default configuration ({d['attention']}): {d['failed_requests']} failed requests; {per_rows}.", ""]
    if "floor" in sections:
        f = sections["floor"]
        lines += [
            f"Weight read: {f['weights_gib']:.1f} GiB in {f['read_ms']:.2f} ms ({f['bandwidth_gb_s']:.0f} GB/s).",
            "",
        ]
    if report.get("compile", {}).get("enabled"):
        c, log = report["compile"], report.get("compile_log", {})
        lines += [
            f"Captured decode step: buckets {c['buckets']} compiled in {c['warmup_s']:.1f} s (not in the times below); "
            f"{c.get('fallback_steps', 0)} eager fallback steps, {log.get('recompiles', 0)} recompiles, "
            f"CUDA graphs skipped: {log.get('cudagraphs_skipped')}.",
            "",
        ]
    if "attention" in sections:
        att = sections["attention"]
        lines += [
            f"Attention alone ({att['heads']} heads, {att['kv_heads']} KV heads, head dim {att['head_dim']}, "
            f"{att['dtype']}):",
            "",
            "| rows | pool positions | whole-pool masked ms | gathered block ms | whole/gathered | flex block ms | "
            "whole/flex |",
            "|---|---|---|---|---|---|---|",
        ]
        for d in att["cases"].values():
            lines.append(
                f"| {d['rows']} | {d['positions']:,} | {d['whole_pool_ms']:.3f} | {d['block_ms']:.3f} | "
                f"{d['whole_pool/block']:.1f}x | {d['flex_ms']:.3f} | {d['whole_pool/flex']:.1f}x |"
            )
        lines.append("")
    for mode, exact in sections.get("exactness", {}).get("modes", {}).items():
        lines += [
            f"{mode} mode: greedy tokens alone and among all {exact['requests'] * len(exact['methods'])} requests "
            "in flight "
            f"({exact['new_tokens']} tokens each):",
            "",
            "| method | requests equal | first differing token |",
            "|---|---|---|",
        ]
        for method, d in exact["methods"].items():
            where = ", ".join(str(i) for i in d["first_differing_token"] if i is not None) or "-"
            lines.append(f"| {method} | {d['equal']}/{exact['requests']} | {where} |")
        lines.append("")
    for mode, lat in sections.get("latency", {}).get("modes", {}).items():
        lines += [
            f"{mode} mode: per-token latency, batch 1, {lat['context_tokens']}-token context prompt, "
            f"{lat['new_tokens']} tokens:",
            "",
            "| method | decode ms/token | of it, the backbone forward (device) | first token ms | host syncs/token | "
            "aten ops/token |",
            "|---|---|---|---|---|---|",
        ]
        for method, d in lat["methods"].items():
            syncs = "-" if d["host_syncs_per_token"] is None else f"{d['host_syncs_per_token']:.1f}"
            forward = d.get("forward_ms_per_token")
            split = "-" if forward is None else f"{forward:.2f} ms ({d['forward_share']:.0%})"
            lines.append(
                f"| {method} | {d['decode_ms_per_token']:.2f} | {split} | {d['first_token_ms']:.1f} | {syncs} | "
                f"{_count(d['ops_per_token'])} |"
            )
        lines += ["", "Ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in lat["ratios"].items()), ""]
    for mode, batch in sections.get("batch", {}).get("modes", {}).items():
        sizes = list(batch["fides"])
        lines += [
            f"{mode} mode: requests decoding together:",
            "",
            "| requests | "
            + " | ".join(f"{m} ms/step | {m} tokens/s | {m} aten ops/step" for m in ("standard", "fides"))
            + " |",
            "|---|" + "---|---|---|" * 2,
        ]
        for size in sizes:
            lines.append(
                f"| {size} | "
                + " | ".join(
                    f"{batch[m][size]['decode_ms_per_step']:.2f} | {batch[m][size]['tokens_per_s']:.1f} | "
                    f"{_count(batch[m][size].get('ops_per_step'))}"
                    for m in ("standard", "fides")
                )
                + " |"
            )
        lines.append("")
    if "serving" in sections:
        from fides_rag.eval.serving import format_serving

        lines += [format_serving(sections["serving"]), ""]
    if "budget" in sections:
        from fides_rag.eval.budget_sweep import format_budget_sweep

        lines += [format_budget_sweep(sections["budget"]), ""]
    return "\n".join(lines)


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--out", required=True, help="JSON results file (written after every section)")
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny configuration (2 layers, hidden 64, vocabulary 512) for tests"
    )
    parser.add_argument("--layers", type=int, default=None, help="override the number of layers")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cuda, cpu (default: %(default)s)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=None,
        help="engine modes of the exactness, latency and batch sections (default: exact,fast on the CPU, fast "
        "elsewhere)",
    )
    parser.add_argument(
        "--peers",
        type=lambda s: s.split(","),
        default=None,
        help=f"peer lanes of the latency section (default: {PEER},{STATIC_PEER} on CUDA, {PEER} elsewhere)",
    )
    parser.add_argument(
        "--call",
        type=int,
        choices=sorted(CALLS),
        default=None,
        help="one of the two GPU calls: " + "; ".join(f"{c}: {','.join(s)}" for c, s in CALLS.items()),
    )
    parser.add_argument(
        "--sections",
        type=lambda s: s.split(","),
        default=None,
        help=f"comma-separated (default: {','.join(SECTIONS)}, or those of --call)",
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="capture fast mode's decode step with torch.compile, every bucket compiled first (default: off, the "
        "configuration a user gets by default)",
    )
    parser.add_argument(
        "--attention",
        default="auto",
        help="fast mode's attention backend (default: auto, flex on CUDA and gather elsewhere; flex runs on a CPU too)",
    )
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend of the captured step (default: inductor; CUDA graphs on CUDA)",
    )
    parser.add_argument(
        "--buckets",
        type=ints,
        default=[1, 2, 4, 8, 16, 32, 64],
        help="row counts the captured step is compiled at (default: 1,2,4,8,16,32,64: 32 FIDES requests)",
    )
    parser.add_argument(
        "--kv-pool-tokens", type=int, default=None, help="fast mode's KV pool in positions (default: the engine's)"
    )
    parser.add_argument(
        "--attention-rows", type=ints, default=None, help="rows of the attention section (default: 1,64; --tiny 1,8)"
    )
    parser.add_argument(
        "--attention-positions",
        type=ints,
        default=None,
        help="pool positions of the attention section (default: 4096,262144; --tiny 512,4096)",
    )
    parser.add_argument(
        "--attention-repeats", type=int, default=20, help="timed calls per attention case (default: %(default)s)"
    )
    parser.add_argument(
        "--short-row",
        type=int,
        default=2048,
        help="positions of the one row of the attention section's 1-row cases (default: %(default)s)",
    )
    parser.add_argument("--correct-requests", type=int, default=4, help="correctness requests (default: %(default)s)")
    parser.add_argument("--correct-tokens", type=int, default=32, help="tokens each (default: %(default)s)")
    parser.add_argument(
        "--default-rows", type=ints, default=[1, 2, 3, 5, 9, 17, 33], help="row counts of the default section"
    )
    parser.add_argument(
        "--default-tokens", type=int, default=16, help="tokens per request there (default: %(default)s)"
    )
    parser.add_argument("--context-tokens", type=int, default=2048, help="context prompt tokens (default: %(default)s)")
    parser.add_argument("--question-tokens", type=int, default=32, help="question tokens (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens decoded per request (default: %(default)s)")
    parser.add_argument(
        "--samples", type=int, default=3, help="latency prompts after one warm-up (default: %(default)s)"
    )
    parser.add_argument(
        "--counted-steps",
        type=int,
        default=2,
        help="decode steps counted for ops and host syncs (default: %(default)s)",
    )
    parser.add_argument(
        "--exact-requests",
        type=int,
        default=8,
        help="requests per method in the exactness section (default: %(default)s)",
    )
    parser.add_argument(
        "--exact-tokens", type=int, default=32, help="greedy tokens per request there (default: %(default)s)"
    )
    parser.add_argument("--batch-sizes", type=ints, default=[1, 2, 4, 8, 16, 32], help="default: 1,2,4,8,16,32")
    parser.add_argument("--serving-requests", type=int, default=32, help="default: %(default)s")
    parser.add_argument(
        "--serving-tokens", type=ints, default=[8, 64], help="new tokens per request, min,max (default: 8,64)"
    )
    parser.add_argument(
        "--loads", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 2.0], help="default: 1,2"
    )
    parser.add_argument("--static-batch", type=int, default=8, help="default: %(default)s")
    parser.add_argument(
        "--budgets", type=ints, default=[512, 2048, 8192], help="step budgets swept (default: 512,2048,8192)"
    )
    parser.add_argument("--budget-requests", type=int, default=16, help="requests per budget (default: %(default)s)")
    parser.add_argument(
        "--budget-load",
        type=float,
        default=2.0,
        help="load of the budget sweep, in sequential capacities (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    args.attention_rows = args.attention_rows or ([1, 8] if args.tiny else [1, 64])
    args.attention_positions = args.attention_positions or ([512, 4096] if args.tiny else [4096, 262144])
    if min(args.attention_positions) < 16 or min(args.attention_rows) < 1 or args.attention_repeats < 1:
        parser.error("--attention-positions must be at least 16, --attention-rows and --attention-repeats at least 1")
    if min(args.buckets) < 1 or any(a >= b for a, b in zip(args.buckets, args.buckets[1:])):
        parser.error("--buckets must be strictly increasing positive row counts")
    if args.call is not None and args.sections is not None:
        parser.error("give --call or --sections, not both")
    args.sections = list(CALLS[args.call]) if args.call is not None else args.sections or list(SECTIONS)
    if args.modes is not None and set(args.modes) - {"exact", "fast"}:
        parser.error(f"--modes takes exact and/or fast, got {','.join(args.modes)}")
    if args.peers is None:
        args.peers = [PEER, STATIC_PEER] if torch.cuda.is_available() and args.device != "cpu" else [PEER]
    elif set(args.peers) - {PEER, STATIC_PEER}:
        parser.error(f"--peers takes {PEER} and/or {STATIC_PEER}, got {','.join(args.peers)}")
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.new_tokens < args.counted_steps + 2:
        parser.error("--new-tokens must exceed --counted-steps by at least 2 (the steps after them are timed)")
    if min(args.exact_requests, args.exact_tokens) < 1:
        parser.error("--exact-requests and --exact-tokens must be at least 1")
    if min(args.serving_requests, args.budget_requests) < 4:
        parser.error(
            "--serving-requests and --budget-requests must be at least 4 (the sequential capacity is measured on 4)"
        )
    if len(args.serving_tokens) != 2:
        parser.error("--serving-tokens takes min,max")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    print(tables(run(args)))


if __name__ == "__main__":
    main()
