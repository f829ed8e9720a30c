"""Label-free retrieval-head discovery (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality"), cached per model; DeCoRe masks the top-ranked heads.

Reference: nightdessert/Retrieval_Head, `retrieval_head_detection.py` (the script DeCoRe's README points to):

- Needle-in-a-haystack prompts: a natural-language needle inserted into Paul Graham essays (1k-50k tokens,
  depths 0-100 %), then a question about it; the model decodes greedily (up to 50 tokens) with attentions.
- At every decoding step, for every head, the top-1 attention position i of the current query is taken; if
  `needle_start <= i < needle_end` and the token just emitted equals `prompt_ids[i]` (the head points at the
  very token being copied), the head's sample score grows by 1 / (needle_end - needle_start).
- A sample counts only if the ROUGE-1 recall of the response against the needle is above 50 %. A head's
  retrieval score is the mean of its sample scores over the counted samples; heads are ranked by it (ties
  keep the layer-major order), keyed "layer-head" with 0-based layers. DeCoRe masks the first
  `num_retrieval_heads` of that ranking.

What this module computes, for S synthetic samples (no data files, no labels):

    sequence = specials + H[:p] + N + H[p:] + C + N,   C = H[p-c:p]

with N a needle of n distinct random words, H a random haystack of the other words, C the c haystack words
just before the needle, and p spread evenly over the haystack (depths (s + ½)/S). Words are word-start tokens
(a "Ġ" or "▁" marker then ≥ 2 ASCII letters, not special or added), the first `vocabulary` of them by id.
Teacher forcing: one forward over the whole sequence, and at the n query positions that predict the copied
needle (the last token of C, then N[:-1]) we read the emitted token e_j = argmax logits and each head's top
attention position a_j, then

    hits(l, h)  = #{j : needle_start <= a_j < needle_end and sequence[a_j] == e_j}
    copy rate   = #{j : e_j == N[j]} / n;  the sample counts if copy rate >= min_copy_rate
    score(l, h) = Σ_counted hits(l, h) / (n · #counted)          (= the mean of the per-sample hits / n)

and heads are ranked by score, ties by (layer, head). Layers are 1-based here.

Deviations, and why:

- Random words, not essays with a natural-language needle: label-free, no downloads, any tokenizer. Frequent
  words (low BPE ids) are used because a small model copies them far better (SmolLM2-135M copies ~25 % of a
  needle of arbitrary word pieces, ~80 % of frequent words with a 16-word cue).
- The copy is cued by repeating the c words before the needle (induction), not by a question.
- Teacher forcing instead of greedy decoding: one batched forward per sample instead of a prefill plus one
  forward per generated token. The prefix of each query is the true needle instead of the model's own output,
  which is the same thing while the model copies correctly, and only samples it mostly copies count. The hit
  rule is the reference's, applied to the emitted (argmax) token.
- The gate is the token-level copy accuracy >= min_copy_rate (default ½), not ROUGE-1 recall > 50 % of the
  decoded text. If no sample passes, discovery fails with an error instead of returning an all-zero ranking.
- Short contexts (128 tokens by default, not 1k-50k) and 12 samples, to stay within a minute or two on a
  2-core CPU for the bundled models.
- Cache key: the model's name_or_path, a hash of its config, a fingerprint of a few weight slices (so random
  or fine-tuned weights behind the same path do not collide), its parameter dtype, the tokenizer's word pool
  and every setting except `batch_size` (an execution setting that can only change float round-off).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import re
import tempfile
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fides_rag.method.lens import ModelAnatomy
from fides_rag.models.cache import cache_root

logger = logging.getLogger(__name__)

SCHEMA = 1
CACHE_SUBDIR = "retrieval_heads"
WORD_MARKERS = "Ġ▁"  # byte-level BPE and SentencePiece word-boundary markers
_RUNTIME_CONFIG_KEYS = {
    "_name_or_path",
    "_attn_implementation",
    "_attn_implementation_internal",
    "_attn_implementation_autoset",
    "attn_implementation",
    "_commit_hash",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
}
_POOLS: weakref.WeakKeyDictionary[Any, dict[int, list[int]]] = weakref.WeakKeyDictionary()  # tokenizer -> {limit: pool}


@dataclass(frozen=True)
class DiscoverySettings:
    """How the synthetic copy samples are built and which count. All but `batch_size` key the cache."""

    num_samples: int = 12
    context_length: int = 128
    """Tokens of haystack plus needle, before the copy."""
    needle_length: int = 16
    cue_length: int = 16
    """Haystack tokens before the needle that are repeated to cue the copy."""
    vocabulary: int = 5000
    """Words are drawn from the first this many word-start tokens by id (BPE ids follow merge frequency)."""
    min_copy_rate: float = 0.5
    """A sample counts if the model's argmax copies at least this fraction of the needle (0 keeps all)."""
    seed: int = 0
    batch_size: int = 4

    def __post_init__(self) -> None:
        for name in ("num_samples", "context_length", "needle_length", "cue_length", "vocabulary", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"retrieval-head discovery: {name} must be an integer >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"retrieval-head discovery: seed must be an integer, got {self.seed!r}")
        rate = self.min_copy_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise ValueError(f"retrieval-head discovery: min_copy_rate must be a number in [0, 1], got {rate!r}")
        if self.context_length < self.needle_length + self.cue_length:
            raise ValueError(
                f"retrieval-head discovery: context_length ({self.context_length}) must hold the needle "
                f"({self.needle_length}) and at least cue_length ({self.cue_length}) haystack tokens before it"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class HeadRanking:
    """Every attention head, best retrieval score first."""

    heads: tuple[tuple[int, int], ...]
    """(layer 1-based, head index), best first."""
    scores: tuple[float, ...]
    samples_counted: int
    samples_total: int
    copy_rate: float
    """Mean copy accuracy over all samples (how well the model copies random words at all)."""
    seconds: float = dataclasses.field(default=0.0, compare=False)
    """Wall time of the discovery that produced this ranking (not compared)."""

    def top(self, k: int) -> dict[int, tuple[int, ...]]:
        """The k best heads as {layer: sorted head indices}, layers ascending."""
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(self.heads):
            raise ValueError(f"top: k must be an integer in [1, {len(self.heads)}] (the number of heads), got {k!r}")
        grouped: dict[int, list[int]] = {}
        for layer, head in self.heads[:k]:
            grouped.setdefault(layer, []).append(head)
        return {layer: tuple(sorted(grouped[layer])) for layer in sorted(grouped)}

    def to_json(self) -> dict[str, Any]:
        return {
            "ranking": [[layer, head, score] for (layer, head), score in zip(self.heads, self.scores)],
            "samples_counted": self.samples_counted,
            "samples_total": self.samples_total,
            "copy_rate": self.copy_rate,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeadRanking:
        rows = data["ranking"]
        return cls(
            heads=tuple((int(layer), int(head)) for layer, head, _ in rows),
            scores=tuple(float(score) for _, _, score in rows),
            samples_counted=int(data["samples_counted"]),
            samples_total=int(data["samples_total"]),
            copy_rate=float(data["copy_rate"]),
            seconds=float(data.get("seconds", 0.0)),
        )


@dataclass(frozen=True)
class CopySample:
    """One synthetic prompt: the context with the needle at `needle_start`, then the cue and the copied needle."""

    input_ids: tuple[int, ...]
    needle_start: int
    needle_length: int


# -- samples ------------------------------------------------------------------------------------------


def model_vocab_size(model: Any) -> int:
    """Rows of the input embedding (may exceed the tokenizer's length by padding rows)."""
    return int(model.get_input_embeddings().num_embeddings)


def copy_token_pool(tokenizer: Any, vocab_size: int) -> list[int]:
    """Ids of word-start tokens: not special or added, a word marker then ≥ 2 ASCII letters; ascending."""
    memo = _POOLS.setdefault(tokenizer, {})
    limit = min(len(tokenizer), vocab_size)
    if limit in memo:
        return memo[limit]
    excluded = set(getattr(tokenizer, "all_special_ids", []) or [])
    excluded.update(getattr(tokenizer, "get_added_vocab", dict)().values())
    tokens = tokenizer.convert_ids_to_tokens(list(range(limit)))
    pool = []
    for token_id, token in enumerate(tokens):
        if token_id in excluded or not isinstance(token, str):
            continue
        word = token[1:]
        if token[:1] in WORD_MARKERS and len(word) >= 2 and word.isascii() and word.isalpha():
            pool.append(token_id)
    memo[limit] = pool
    return pool


def prefix_ids(tokenizer: Any) -> list[int]:
    """The special tokens the tokenizer puts before ordinary text (e.g. BOS), so samples start like real input."""
    return list(tokenizer("", add_special_tokens=True)["input_ids"])


def build_copy_samples(pool: list[int], prefix: list[int], settings: DiscoverySettings) -> list[CopySample]:
    """S samples [prefix; H[:p]; N; H[p:]; C; N] over the first `settings.vocabulary` words of `pool`,
    deterministic in `settings.seed` (Python's `random`)."""
    n, cue = settings.needle_length, settings.cue_length
    pool = pool[: settings.vocabulary]
    if len(pool) < 2 * n:
        raise ValueError(
            f"retrieval-head discovery: the tokenizer offers only {len(pool)} word-start tokens; a needle of "
            f"{n} needs at least {2 * n} (lower needle_length or raise vocabulary)"
        )
    rng = random.Random(settings.seed)
    haystack_length = settings.context_length - n
    samples = []
    for s in range(settings.num_samples):
        needle = rng.sample(pool, n)
        taken = set(needle)
        others = [t for t in pool if t not in taken]
        haystack = [rng.choice(others) for _ in range(haystack_length)]
        depth = (s + 0.5) / settings.num_samples
        insert = cue + round(depth * (haystack_length - cue))  # >= cue tokens precede the needle
        ids = prefix + haystack[:insert] + needle + haystack[insert:] + haystack[insert - cue : insert] + needle
        samples.append(CopySample(tuple(ids), len(prefix) + insert, n))
    return samples


# -- scoring ------------------------------------------------------------------------------------------


def retrieval_hits(
    top_positions: torch.Tensor,
    emitted: torch.Tensor,
    input_ids: torch.Tensor,
    needle_start: torch.Tensor,
    needle_length: int,
) -> torch.Tensor:
    """Per sample and head, how many copy steps the head's top attention points at the emitted token inside
    the needle.  top_positions [B, L, H, N], emitted [B, N], input_ids [B, T], needle_start [B] -> [B, L, H]"""
    start = needle_start.view(-1, 1, 1, 1)
    in_needle = (top_positions >= start) & (top_positions < start + needle_length)
    attended = input_ids.gather(1, top_positions.flatten(1)).view_as(top_positions)  # token at each top position
    return (in_needle & (attended == emitted[:, None, None, :])).sum(-1)


@contextmanager
def eager_attention(model: Any) -> Iterator[None]:
    """Run the model with eager attention (the only kind that returns probabilities), then restore it."""
    previous = model.config._attn_implementation
    if previous == "eager":
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def copy_probe(model: Any, input_ids: torch.Tensor, num_targets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One teacher-forced forward: argmax token and every head's top-attended position at the last
    `num_targets` query positions before the final token.  [B, T] -> emitted [B, N], top [B, L, H, N]"""
    width = input_ids.shape[1]
    out = model(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        use_cache=False,
        output_attentions=True,
        logits_to_keep=num_targets + 1,
    )
    if not out.attentions or any(a is None for a in out.attentions):
        raise RuntimeError(f"{type(model).__name__} returned no attention probabilities under eager attention")
    emitted = out.logits[:, :-1].argmax(-1)  # [B, N]
    rows = slice(width - num_targets - 1, width - 1)
    top = torch.stack([a[:, :, rows, :].argmax(-1) for a in out.attentions], dim=1)  # [B, L, H, N]
    return emitted, top


def discover_retrieval_heads(model: Any, tokenizer: Any, settings: DiscoverySettings | None = None) -> HeadRanking:
    """Rank every head of `model` by its retrieval score on synthetic copy samples (no cache)."""
    settings = settings or DiscoverySettings()
    num_layers = ModelAnatomy.of(model).num_layers
    num_heads = int(model.config.num_attention_heads)
    pool = copy_token_pool(tokenizer, model_vocab_size(model))
    samples = build_copy_samples(pool, prefix_ids(tokenizer), settings)
    width = len(samples[0].input_ids)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(max_positions, int) and width > max_positions:
        raise ValueError(
            f"retrieval-head discovery: samples are {width} tokens but the model takes {max_positions}; lower "
            "context_length"
        )
    n = settings.needle_length
    device = next(model.parameters()).device
    hits_total = torch.zeros(num_layers, num_heads, dtype=torch.long)
    counted, copied = 0, 0.0
    started = time.perf_counter()
    with torch.inference_mode(), eager_attention(model):
        for first in range(0, len(samples), settings.batch_size):
            batch = samples[first : first + settings.batch_size]
            ids = torch.tensor([s.input_ids for s in batch], device=device)
            starts = torch.tensor([s.needle_start for s in batch], device=device)
            emitted, top = copy_probe(model, ids, n)
            rate = (emitted == ids[:, -n:]).double().mean(-1)  # [B]
            keep = rate >= settings.min_copy_rate
            hits = retrieval_hits(top, emitted, ids, starts, n)  # [B, L, H]
            hits_total += hits[keep].sum(0).cpu()
            counted += int(keep.sum())
            copied += float(rate.sum())
    seconds = time.perf_counter() - started
    copy_rate = copied / len(samples)
    if counted == 0:
        raise ValueError(
            f"retrieval-head discovery: the model copied at least {settings.min_copy_rate:.0%} of the needle in none "
            f"of {len(samples)} samples (mean copy rate {copy_rate:.1%}), so no head can be scored; a model that "
            f"cannot copy has no retrieval heads to find. Lower min_copy_rate (0 keeps every sample) to rank anyway."
        )
    scores = hits_total.double() / (n * counted)
    order = sorted(
        ((layer, head) for layer in range(num_layers) for head in range(num_heads)),
        key=lambda lh: (-int(hits_total[lh]), lh),  # integer counts: exact ties, broken by (layer, head)
    )
    return HeadRanking(
        heads=tuple((layer + 1, head) for layer, head in order),
        scores=tuple(float(scores[lh]) for lh in order),
        samples_counted=counted,
        samples_total=len(samples),
        copy_rate=copy_rate,
        seconds=seconds,
    )


# -- cache --------------------------------------------------------------------------------------------


def _sha256(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def model_identity(model: Any) -> dict[str, str]:
    """name_or_path, config hash (runtime flags left out), weight fingerprint and dtype of a model."""
    config = {k: v for k, v in model.config.to_dict().items() if k not in _RUNTIME_CONFIG_KEYS}
    digest = hashlib.sha256()
    params = list(model.named_parameters())
    for name, param in params[:3] + params[-3:]:
        digest.update(f"{name}{tuple(param.shape)}".encode())
        digest.update(param.detach().reshape(-1)[:4096].to("cpu", torch.float32).numpy().tobytes())
    return {
        "name_or_path": str(getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "") or ""),
        "config_sha256": _sha256(config),
        "weights_sha256": digest.hexdigest(),
        "dtype": str(params[0][1].dtype) if params else "",
    }


def cache_file(model: Any, tokenizer: Any, settings: DiscoverySettings | None = None) -> Path:
    """Where the ranking of this model under these settings is cached ($FIDES_RAG_CACHE/retrieval_heads/)."""
    return _cache_location(model, tokenizer, settings or DiscoverySettings())[0]


def _cache_location(model: Any, tokenizer: Any, settings: DiscoverySettings) -> tuple[Path, str, dict[str, str]]:
    """(file, full key, model identity); the key covers everything the ranking depends on."""
    identity = model_identity(model)
    keyed = {k: v for k, v in settings.to_dict().items() if k != "batch_size"}
    pool = copy_token_pool(tokenizer, model_vocab_size(model))
    key = _sha256(
        {"schema": SCHEMA, "model": identity, "settings": keyed, "pool": _sha256(pool), "prefix": prefix_ids(tokenizer)}
    )
    stem = Path(identity["name_or_path"].rstrip("/\\")).name or str(model.config.model_type)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:80]
    return cache_root() / CACHE_SUBDIR / f"{stem}-{key[:20]}.json", key, identity


def _read_cache(path: Path, key: str, num_layers: int, num_heads: int) -> HeadRanking | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA or data.get("key") != key:
            raise ValueError("written for another model or settings")
        ranking = HeadRanking.from_json(data)
        if sorted(ranking.heads) != [(layer, h) for layer in range(1, num_layers + 1) for h in range(num_heads)]:
            raise ValueError("does not list every head of the model exactly once")
        return ranking
    except (ValueError, KeyError, TypeError) as err:
        logger.warning("ignoring retrieval-head cache %s (%s); discovering again", path, err)
        return None


def _write_cache(
    path: Path, key: str, identity: dict[str, str], settings: DiscoverySettings, ranking: HeadRanking
) -> None:
    payload = {"schema": SCHEMA, "key": key, "model": identity, "settings": settings.to_dict(), **ranking.to_json()}
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(payload, f, indent=1)
            f.write("\n")
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def retrieval_head_ranking(
    model: Any, tokenizer: Any, settings: DiscoverySettings | None = None, *, use_cache: bool = True
) -> HeadRanking:
    """The model's heads ranked by retrieval score: read from the cache, or discovered once and cached."""
    settings = settings or DiscoverySettings()
    num_layers = ModelAnatomy.of(model).num_layers
    num_heads = int(model.config.num_attention_heads)
    if not use_cache:
        return discover_retrieval_heads(model, tokenizer, settings)
    path, key, identity = _cache_location(model, tokenizer, settings)
    cached = _read_cache(path, key, num_layers, num_heads)
    if cached is not None:
        return cached
    logger.warning(
        "discovering the retrieval heads of %s once (%d copy samples of %d tokens); caching them in %s",
        identity["name_or_path"] or model.config.model_type,
        settings.num_samples,
        settings.context_length,
        path,
    )
    ranking = discover_retrieval_heads(model, tokenizer, settings)
    _write_cache(path, key, identity, settings, ranking)
    return ranking


def retrieval_heads(
    model: Any, tokenizer: Any, top_k: int, settings: DiscoverySettings | None = None, *, use_cache: bool = True
) -> dict[int, tuple[int, ...]]:
    """The `top_k` best retrieval heads as {layer (1-based): head indices}, discovered or cached."""
    total = ModelAnatomy.of(model).num_layers * int(model.config.num_attention_heads)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= total:
        raise ValueError(
            f"retrieval_heads: top_k must be an integer in [1, {total}] (the model's head count), got {top_k!r}"
        )
    return retrieval_head_ranking(model, tokenizer, settings, use_cache=use_cache).top(top_k)
