"""Label-free calibration of FIDES for a backbone: measure the raw signals on unlabelled prompts, then
propose `shift_scale`, `noise_scale` and the fusion weights (the source's 1/σ rule).

The source's constants (shift_scale 10, noise_scale 5) were set for 7-8B models; on small backbones the
scaled Noise saturates at 1. Calibration reads only (question, documents) pairs, never answers:

1. Decode every pair with FIDES as configured (greedy, the source's constants by default), recording per
   generated token the raw signals: Opposition = JSD(p_ctx || p_noctx) in [0, ln 2], raw Shift =
   (1/L) Σ_l ||ĥ_ctx[l] − ĥ_noctx[l]||₂ in [0, 2], raw Noise = KL(p̃_mid || p̃_L) >= 0 (no scale, no clip).
2. Scales: scale_i = P95(raw_i) / P95(Opposition) for i in (Shift, Noise), so that the 95th percentile of
   the scaled signal raw_i / scale_i equals Opposition's: all three enter the fusion on the same range, and
   since P95(Opposition) <= ln 2 < 1 at most 5% of tokens (in practice far fewer) are clipped at 1.
3. Weights: w_i ∝ 1/σ_i, σ_i the sample standard deviation (ddof=1) of signal i as it enters the fusion
   (Opposition as is, Shift and Noise scaled with the proposed scales and clipped to [0, 1]), normalised
   to sum 1. This is the source's rule; it measured (0.533, 0.278, 0.189) and rounded to (0.5, 0.3, 0.2).

Percentiles are numpy's default (linear interpolation between order statistics), all in float64. The
result is an opt-in FidesConfig; FidesConfig() keeps the source's rounded defaults.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from fides_rag.method.config import SIGNAL_NAMES, FidesConfig
from fides_rag.method.signals import kl_divergence, layer_mean_unit_distance
from fides_rag.prompts.template import document_texts
from fides_rag.rules.base import CONTEXT, NO_CONTEXT, ContrastRule, StepInputs, StepOutput
from fides_rag.rules.fides import FidesRule, noise_layer

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder
    from fides_rag.result import GenerationResult

SOURCE_MEASURED_WEIGHTS: tuple[float, float, float] = (0.533, 0.278, 0.189)
"""The weights the source measured with the 1/σ rule (FidesConfig's default is their rounding)."""
MATCH_PERCENTILE = 95.0
"""Shift and Noise are scaled so that this percentile of each equals Opposition's."""
DEFAULT_MAX_NEW_TOKENS = 16
STATISTICS = ("n", "min", "p5", "p25", "median", "mean", "p75", "p95", "max", "std", "clipped")
"""The per-signal statistics; `clipped` is the share of tokens at the ceiling (scaled value >= 1)."""
SIGNAL_LABELS = {
    "opposition": "Opposition: JSD(p_ctx‖p_noctx)",
    "shift": "Shift: mean_l ‖ĥ_ctx − ĥ_noctx‖",
    "noise": "Noise: KL(p_mid‖p_final)",
}

Pair = tuple[str, Sequence[Any]]
"""One unlabelled prompt: (question, documents)."""


class RawSignalsRule(FidesRule):
    """Decodes exactly like FIDES with `config` (alpha, score and tokens unchanged) but reports the RAW
    signals in the step records: opposition, the unscaled mean unit-state distance, the unscaled lens KL.

    Not registered: pass the object itself as `method=`.
    """

    name = "fides-raw-signals"

    @property
    def layer_state_paths(self) -> tuple[str, ...]:
        return (CONTEXT, NO_CONTEXT)

    def lens_layers(self, num_layers: int) -> tuple[int, ...]:
        return (noise_layer(num_layers, self.config.noise_layer_ratio),)

    def combine(self, step: StepInputs) -> StepOutput:
        decided = super().combine(step)
        mid = noise_layer(step.num_layers, self.config.noise_layer_ratio)
        raw = {
            "shift": layer_mean_unit_distance(step.ctx_layer_states, step.no_ctx_layer_states),  # type: ignore[arg-type]  # declared paths
            "noise": kl_divergence(step.lens_logits[mid], step.ctx_logits),
        }
        return replace(decided, records={**decided.records, **raw})


# -- pure statistics -------------------------------------------------------------------------------


def _as_values(values: Any, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a flat list of per-token values, got shape {array.shape}")
    if array.size < 2:
        raise ValueError(
            f"{name}: statistics need at least 2 token values, got {array.size}; use more or longer prompts"
        )
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: {int((~np.isfinite(array)).sum())} values are NaN or infinite")
    return array


def signal_statistics(values: Any, scale: float | None = None, name: str = "signal") -> dict[str, float]:
    """n, min, p5, p25, median, mean, p75, p95, max, std (ddof=1) of per-token values, and `clipped`:
    the share of tokens with value / scale >= 1 (0 without a scale, as for Opposition)."""
    x = _as_values(values, name)
    p5, p25, median, p75, p95 = np.percentile(x, [5.0, 25.0, 50.0, 75.0, 95.0])
    clipped = 0.0 if scale is None else float(np.mean(x / scale >= 1.0))
    return {
        "n": int(x.size),
        "min": float(x.min()),
        "p5": float(p5),
        "p25": float(p25),
        "median": float(median),
        "mean": float(x.mean()),
        "p75": float(p75),
        "p95": float(p95),
        "max": float(x.max()),
        "std": float(x.std(ddof=1)),
        "clipped": clipped,
    }


@dataclass(frozen=True)
class Proposal:
    """Calibrated scales and weights, and the statistics of the signals as they would enter the fusion."""

    shift_scale: float
    noise_scale: float
    weights: tuple[float, float, float]
    sigmas: tuple[float, float, float]
    """Sample std of (Opposition, clip(Shift/shift_scale), clip(Noise/noise_scale)) over the tokens."""
    fused_statistics: dict[str, dict[str, float]]
    """signal -> statistics of the signal as fused (scaled with the proposed scales, clipped)."""
    percentile: float
    target: float
    """Opposition's `percentile`-th percentile, which the scaled Shift and Noise are matched to."""


def propose(raw: Mapping[str, Any], percentile: float = MATCH_PERCENTILE) -> Proposal:
    """The proposed scales (P-th percentile of each scaled signal = Opposition's) and 1/σ weights.

    raw: "opposition", "shift", "noise" -> per-token raw values (same tokens). A signal with zero variance,
    or a zero percentile that cannot be matched, is an error naming the signal.
    """
    if not 0 < percentile < 100:
        raise ValueError(f"percentile must lie strictly between 0 and 100, got {percentile!r}")
    missing = [name for name in SIGNAL_NAMES if name not in raw]
    if missing:
        raise ValueError(f"raw signals are missing {missing}; expected {SIGNAL_NAMES}")
    values = {name: _as_values(raw[name], name) for name in SIGNAL_NAMES}
    sizes = {name: v.size for name, v in values.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"the signals must hold one value per token each, got sizes {sizes}")
    for name, v in values.items():
        if v.std() == 0:
            raise ValueError(
                f"the {name} signal has zero variance over {v.size} tokens (every value is {v[0]:.6g}): "
                "1/sigma weighting is undefined; calibrate on a larger or more varied pool"
            )
    target = float(np.percentile(values["opposition"], percentile))
    if target <= 0:
        raise ValueError(
            f"the opposition signal's {percentile:g}th percentile is 0 (the documents barely change the next-token "
            "distribution on this pool), so there is no range to match; calibrate on prompts whose documents matter"
        )
    scales = {}
    for name in ("shift", "noise"):
        level = float(np.percentile(values[name], percentile))
        if level <= 0:
            raise ValueError(
                f"the {name} signal's {percentile:g}th percentile is 0, so no scale can match it to Opposition's"
            )
        scales[name] = level / target
    fused = {
        "opposition": values["opposition"],
        "shift": np.clip(values["shift"] / scales["shift"], 0.0, 1.0),
        "noise": np.clip(values["noise"] / scales["noise"], 0.0, 1.0),
    }
    sigmas = tuple(float(fused[name].std(ddof=1)) for name in SIGNAL_NAMES)
    for name, sigma in zip(SIGNAL_NAMES, sigmas):
        if sigma == 0:
            raise ValueError(
                f"the {name} signal has zero variance after scaling and clipping; 1/sigma weighting is undefined"
            )
    inverse = [1.0 / s for s in sigmas]
    weights = tuple(w / sum(inverse) for w in inverse)
    fused_statistics = {
        name: signal_statistics(fused[name], None if name == "opposition" else 1.0, name) for name in SIGNAL_NAMES
    }
    return Proposal(scales["shift"], scales["noise"], weights, sigmas, fused_statistics, percentile, target)  # type: ignore[arg-type]


# -- decoding the pool -----------------------------------------------------------------------------


def check_pairs(pairs: Sequence[Pair]) -> list[tuple[str, list[str]]]:
    """(question, document texts) for every pair; at least 2 pairs, each with a question and a document."""
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
        raise TypeError(f"pairs must be a list of (question, documents), got {type(pairs).__name__}")
    if not pairs:
        raise ValueError("the calibration pool is empty: give at least 2 (question, documents) pairs")
    if len(pairs) < 2:
        raise ValueError(f"calibration needs at least 2 prompts (the statistics need a spread), got {len(pairs)}")
    checked = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"pair {i}: expected (question, documents), got {pair!r:.80}")
        question, documents = pair
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"pair {i}: the question must be a non-empty string, got {question!r:.80}")
        texts = document_texts(documents)
        if not texts:
            raise ValueError(
                f"pair {i}: no documents; calibration measures the context path, so every prompt needs one"
            )
        checked.append((question, texts))
    return checked


@dataclass
class RawSignals:
    """Per-token raw signals over a decoded pool."""

    values: dict[str, np.ndarray]
    """"opposition", "shift", "noise" -> float64 [tokens]."""
    examples: int
    documents_trimmed: int = 0

    @property
    def tokens(self) -> int:
        return int(self.values["opposition"].size)


def collect_raw_signals(
    decoder: FidesDecoder,
    pairs: Sequence[Pair],
    *,
    config: FidesConfig | None = None,
    batch_size: int = 8,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    progress: bool = True,
) -> RawSignals:
    """Decode every pair greedily with FIDES (`config`, default the source's), batched, and record the raw
    signals of every generated token."""
    checked = check_pairs(pairs)
    _check_positive(batch_size, "batch_size")
    _check_positive(max_new_tokens, "max_new_tokens")
    rule = RawSignalsRule(config or FidesConfig())
    # Batches of similar length limit padding; the statistics do not depend on the order.
    order = sorted(range(len(checked)), key=lambda i: len(checked[i][0]) + sum(len(t) for t in checked[i][1]))
    collected: dict[str, list[float]] = {name: [] for name in SIGNAL_NAMES}
    trimmed = 0
    for result in decode_pool(decoder, [checked[i] for i in order], rule, batch_size, max_new_tokens, progress):
        trimmed += int(result.documents_trimmed)
        for step in result.steps:
            for name in SIGNAL_NAMES:
                collected[name].append(float(getattr(step, name)))
    return RawSignals({name: np.asarray(v, dtype=np.float64) for name, v in collected.items()}, len(checked), trimmed)


def decode_pool(
    decoder: FidesDecoder,
    checked: Sequence[tuple[str, list[str]]],
    rule: ContrastRule,
    batch_size: int,
    max_new_tokens: int,
    progress: bool,
) -> Iterator[GenerationResult]:
    """Each (question, documents) pair decoded greedily with `rule`, `batch_size` at a time, under a progress bar;
    a decode that fell back to another method is an error (the statistics would not be the rule's)."""
    with tqdm(total=len(checked), unit="ex", desc="calibrate", disable=not progress, dynamic_ncols=True) as bar:
        for start in range(0, len(checked), batch_size):
            batch = checked[start : start + batch_size]
            results = decoder.generate_batch(
                [q for q, _ in batch],
                [d for _, d in batch],
                method=rule,
                max_new_tokens=max_new_tokens,
                do_sample=False,
            )
            for result in results:
                if result.method != rule.name:
                    raise RuntimeError(
                        f"expected a {rule.name!r} decode, got {result.method!r} ({'; '.join(result.notes)})"
                    )
                yield result
            bar.update(len(batch))


def _check_positive(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


# -- the calibration -------------------------------------------------------------------------------


@dataclass
class CalibrationReport:
    """The calibrated config, and the statistics it came from."""

    config: FidesConfig
    base: FidesConfig
    """The config the pool was decoded with (its scales define the `clipped` share of the raw statistics)."""
    statistics: dict[str, dict[str, float]]
    """signal -> statistics of the raw signal."""
    proposal: Proposal
    examples: int
    tokens: int

    def markdown(self) -> str:
        """The statistics and the proposal as markdown tables."""
        return calibration_markdown(self)


def calibrate(
    decoder: FidesDecoder,
    pairs: Sequence[Pair],
    *,
    base: FidesConfig | None = None,
    batch_size: int = 8,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    percentile: float = MATCH_PERCENTILE,
    progress: bool = True,
    source: Mapping[str, Any] | None = None,
) -> CalibrationReport:
    """Calibrate FIDES's scales and weights for `decoder`'s backbone on unlabelled (question, documents) pairs.

    The pool is decoded with `base` (default: the source's FidesConfig); the returned config is `base` with
    the proposed shift_scale, noise_scale and weights, and `source` (plus the run's statistics) as provenance.
    """
    base = base or FidesConfig()
    check_pairs(pairs)
    raw = collect_raw_signals(
        decoder, pairs, config=base, batch_size=batch_size, max_new_tokens=max_new_tokens, progress=progress
    )
    return report_from_raw(
        raw,
        base=base,
        percentile=percentile,
        source={**dict(source or {}), "batch_size": batch_size, "max_new_tokens": max_new_tokens},
    )


def report_from_raw(
    raw: RawSignals,
    *,
    base: FidesConfig | None = None,
    percentile: float = MATCH_PERCENTILE,
    source: Mapping[str, Any] | None = None,
) -> CalibrationReport:
    """Statistics, proposal and calibrated config from already collected raw signals."""
    from fides_rag import __version__

    base = base or FidesConfig()
    scales = {"opposition": None, "shift": base.shift_scale, "noise": base.noise_scale}
    statistics = {name: signal_statistics(raw.values[name], scales[name], name) for name in SIGNAL_NAMES}
    proposal = propose(raw.values, percentile)
    provenance = {
        **dict(source or {}),
        "examples": raw.examples,
        "tokens": raw.tokens,
        "documents_trimmed": raw.documents_trimmed,
        "decoding": f"greedy, FIDES with the base config below, {RawSignalsRule.__name__} recording the raw signals",
        "base_config": {k: v for k, v in base.to_dict().items() if k != "source"},
        "rule": (
            f"scale_i = P{percentile:g}(raw_i) / P{percentile:g}(opposition) for shift and noise; "
            "w_i = (1/sigma_i) / sum_j (1/sigma_j), sigma_i the std (ddof=1) of signal i as fused (scaled, clipped)"
        ),
        "opposition_percentile": proposal.target,
        "sigmas_as_fused": dict(zip(SIGNAL_NAMES, proposal.sigmas)),
        "source_measured_weights": list(SOURCE_MEASURED_WEIGHTS),
        "raw_statistics": statistics,
        "fused_statistics": proposal.fused_statistics,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "fides_rag_version": __version__,
    }
    config = replace(
        base,
        weights=proposal.weights,
        shift_scale=proposal.shift_scale,
        noise_scale=proposal.noise_scale,
        source=provenance,
    )
    return CalibrationReport(config, base, statistics, proposal, raw.examples, raw.tokens)


# -- output ----------------------------------------------------------------------------------------


def markdown_path(config_path: str | Path) -> Path:
    """Where the statistics table goes: beside the config, `calibrated.json` -> `calibrated.md`."""
    path = Path(config_path)
    md = path.with_suffix(".md")
    return md if md != path else path.with_name(path.name + ".stats.md")


def check_writable(config_path: str | Path) -> tuple[Path, Path]:
    """Make sure the config and its markdown can be written (before any work); returns both paths.

    Creates missing parent folders; writes nothing else.
    """
    path = Path(config_path)
    targets = (path, markdown_path(path))
    for target in targets:
        if target.is_dir():
            raise ValueError(
                f"cannot write {target}: it is a directory; give a file name such as {target / 'calibrated.json'}"
            )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
        for target in targets:
            if target.exists():
                with target.open("a"):
                    pass
    except OSError as err:
        raise ValueError(f"cannot write the calibrated config to {path}: {err.strerror or err}") from None
    if not os.access(path.parent, os.W_OK):
        raise ValueError(f"cannot write the calibrated config to {path}: {path.parent} is not writable")
    return targets


def write_report(report: CalibrationReport, config_path: str | Path) -> tuple[Path, Path]:
    """Write the calibrated config (FidesConfig JSON) and the markdown statistics beside it."""
    path, md = check_writable(config_path)
    report.config.to_file(path)
    md.write_text(report.markdown())
    return path, md


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def calibration_markdown(report: CalibrationReport) -> str:
    """Raw statistics, then default vs calibrated scales and weights, as markdown."""
    source = report.config.source
    base, cfg, prop = report.base, report.config, report.proposal
    lines = [f"# FIDES calibration of `{source.get('model', 'the backbone')}`", ""]
    where = ", ".join(f"{k} {source[k]}" for k in ("dataset", "data", "offset") if source.get(k) is not None)
    lines += [
        f"{report.examples} unlabelled prompts{f' ({where})' if where else ''}, {report.tokens} generated tokens "
        f"(greedy FIDES, max_new_tokens {source.get('max_new_tokens', '?')}).",
        "",
        "## Raw signals (no scale, no clip)",
        "",
        "| signal | " + " | ".join(STATISTICS[:-1]) + " | clipped at default scale |",
        "|---|" + "---|" * len(STATISTICS),
    ]
    default_scales = {"opposition": "–", "shift": _fmt(base.shift_scale), "noise": _fmt(base.noise_scale)}
    for name in SIGNAL_NAMES:
        stats = report.statistics[name]
        cells = [str(stats["n"])] + [_fmt(stats[k]) for k in STATISTICS[1:-1]]
        clipped = (
            "never (≤ ln 2)" if name == "opposition" else f"{_pct(stats['clipped'])} (scale {default_scales[name]})"
        )
        lines.append(f"| {SIGNAL_LABELS[name]} | " + " | ".join(cells) + f" | {clipped} |")
    lines += [
        "",
        "## Proposal",
        "",
        f"Scales: P{prop.percentile:g} of the scaled Shift and Noise = P{prop.percentile:g} of Opposition "
        f"({_fmt(prop.target)}), so clipping at 1 is rare. "
        "Weights: w_i ∝ 1/σ_i of the signals as fused (scaled, clipped), normalised to sum 1.",
        "",
        "| signal | default scale | calibrated scale | clipped (default) | clipped (calibrated) | σ as fused | "
        "source measured w | default w | calibrated w |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    calibrated_scales = {"opposition": "–", "shift": _fmt(cfg.shift_scale), "noise": _fmt(cfg.noise_scale)}
    for i, name in enumerate(SIGNAL_NAMES):
        default_clipped = report.statistics[name]["clipped"]
        cells = [
            name,
            default_scales[name],
            calibrated_scales[name],
            "–" if name == "opposition" else _pct(default_clipped),
            "–" if name == "opposition" else _pct(prop.fused_statistics[name]["clipped"]),
            _fmt(prop.sigmas[i]),
            f"{SOURCE_MEASURED_WEIGHTS[i]:.3f}",
            f"{base.weights[i]:.3f}",
            f"{cfg.weights[i]:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Source weights (measured): "
        + ", ".join(f"{w:.3f}" for w in SOURCE_MEASURED_WEIGHTS)
        + "; default (rounded): "
        + ", ".join(f"{w:.3f}" for w in base.weights)
        + "; calibrated: "
        + ", ".join(f"{w:.3f}" for w in cfg.weights)
        + ".",
        "",
    ]
    return "\n".join(lines)
