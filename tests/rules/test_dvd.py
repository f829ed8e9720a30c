"""DVD: combine against a float64 hand computation of DvD.py's `--mode dvd` step, then through the decoder."""

from __future__ import annotations

import math

import pytest
import torch

from fides_rag import FidesDecoder, PromptTemplate, get_method
from fides_rag.rules import StepInputs
from fides_rag.rules.dvd import DvdRule, nucleus_log_probs
from fides_rag.testing import (
    MULTI_DOCUMENT_QUESTIONS,
    MULTI_DOCUMENTS,
    build_tiny_model,
    build_tokenizer,
    reference_log_softmax,
)

INF = math.inf
QUESTIONS, DOCUMENTS = MULTI_DOCUMENT_QUESTIONS, MULTI_DOCUMENTS


# -- the reference, by hand ----------------------------------------------------------------------


def nucleus(row, top_p):
    """log-probs with -inf outside the top-p nucleus: ascending sort, drop while the cumulative mass <= 1 - p."""
    lp = reference_log_softmax(row)
    order = sorted(range(len(lp)), key=lambda i: lp[i])
    total, out = 0.0, list(lp)
    for rank, i in enumerate(order):
        total += math.exp(lp[i])
        if total <= 1 - top_p and rank < len(order) - 1:
            out[i] = -INF
    return out


def entropy_k(lp, k):
    top = sorted(lp, reverse=True)[:k]
    return -sum(math.exp(v) * min(0.0, max(-100.0, v)) for v in top)


def gap(lp):
    exps = [math.exp(v) for v in lp]
    top = sorted((e / sum(exps) for e in exps), reverse=True)
    return top[0] - top[1]


def reference_step(
    full, closed, docs, dynamic=True, beta=0.25, gamma=0.2, selection="entropy", k=10, p=0.95, ratio=10.0
):
    """One example, as DvD.py's loop computes it (plain Python floats); returns (final, alpha, score, branch)."""
    lf, lc = nucleus(full, p), nucleus(closed, p)
    ld = [nucleus(d, p) for d in docs]
    best, worst = ld[0], ld[-1]
    if selection == "entropy":
        maxent, minent = -0.01, 50.0
        for d in ld:
            h = entropy_k(d, k)
            if h > maxent:
                maxent, worst = h, d
            if h < minent:
                minent, best = h, d
    if dynamic:
        gamma = max(gap(best) - gap(worst), 0)
        beta = max(gap(lf) - gap(lc), 0)
    confident = entropy_k(lc, k) * ratio < entropy_k(lf, k)
    final = []
    for f, c, b, w in zip(lf, lc, best, worst):
        if confident:
            base = c if dynamic else f
            merged = base + gamma * b - gamma * w
            final.append(merged if w > -100 else f)
        else:
            merged = (1 + beta) * f - beta * c + gamma * b - gamma * w
            value = merged if c > -100 else f
            final.append(value if w > -100 else f)
    if any(math.isnan(v) for v in final) or all(v == -INF for v in final):
        return lf, 0.0, 0.0, "fallback"
    if confident:
        return final, 0.0, gamma, "confident"
    return final, beta, gamma, "contrast"


def make_step(counts=(2, 4, 3, 3, 2), vocab=17, seed=0):
    """Random rows; example 1's closed-book row is near one-hot (closed-book-confident branch), example 4 has a
    near-tied most-confident document (γ = 0 under dynamic weights: the NaN fallback)."""
    gen = torch.Generator().manual_seed(seed)
    batch, most = len(counts), max(counts)
    full = torch.randn(batch, vocab, generator=gen, dtype=torch.float64) * 1.5
    closed = torch.randn(batch, vocab, generator=gen, dtype=torch.float64) * 1.5
    docs = torch.randn(batch, most, vocab, generator=gen, dtype=torch.float64) * 2.0
    if batch > 1:
        closed[1, 3] += 40.0
        full[1] *= 0.1
    if batch > 4:
        docs[4, 0] = -10.0
        docs[4, 0, 5], docs[4, 0, 6] = 10.0, 10.01  # low top-k entropy, but a tiny top-two gap
        docs[4, 1] = torch.randn(vocab, generator=gen, dtype=torch.float64) * 0.3
        docs[4, 1, 2] += 2.0
    present = torch.tensor([[n > i for i in range(most)] for n in counts])
    docs = docs.masked_fill(~present[..., None], 0.0)
    return StepInputs.from_tensors(ctx_logits=full, no_ctx_logits=closed, document_logits=docs, document_mask=present)


CONFIGS = [
    dict(),
    dict(selection="retrieval"),
    dict(dynamic_weight=False),
    dict(dynamic_weight=False, beta=0.5, gamma=0.0, selection="retrieval"),
    dict(top_k=3, top_p=0.8),
    dict(dynamic_weight=False, top_k=25, top_p=1.0, entropy_ratio=2.0),
]


def reference_rows(step, rule):
    kwargs = dict(
        dynamic=rule.dynamic_weight, selection=rule.selection, k=rule.top_k, p=rule.top_p, ratio=rule.entropy_ratio
    )
    if not rule.dynamic_weight:
        kwargs.update(beta=rule.beta, gamma=rule.gamma)
    rows = []
    for b, count in enumerate(step.document_mask.sum(-1).tolist()):
        docs = [step.document_logits[b, n].tolist() for n in range(count)]
        rows.append(reference_step(step.ctx_logits[b].tolist(), step.no_ctx_logits[b].tolist(), docs, **kwargs))
    return rows


@pytest.mark.parametrize("options", CONFIGS)
def test_dvd_matches_hand_reference(options):
    rule = DvdRule(**options)
    step = make_step()
    out = rule.combine(step)
    rows = reference_rows(step, rule)
    for b, (want, alpha, score, _) in enumerate(rows):
        got = out.logits[b].tolist()
        assert [v == -INF for v in got] == [v == -INF for v in want]
        assert [v for v in got if v != -INF] == pytest.approx([v for v in want if v != -INF], abs=1e-12)
        assert out.records.get("beta")[b].item() == pytest.approx(alpha, abs=1e-12)
        assert out.records.get("gamma")[b].item() == pytest.approx(score, abs=1e-12)
    assert not torch.isnan(out.logits).any()


def test_dvd_fixture_reaches_every_branch():
    """Under the defaults the fixture exercises the closed-book-confident branch, the CAD branch and the NaN
    fallback (example 4: γ = 0 with tokens outside d+'s nucleus), whose scores are the full path's."""
    step = make_step()
    branches = [branch for *_, branch in reference_rows(step, DvdRule())]
    assert branches[1] == "confident" and branches[4] == "fallback" and "contrast" in branches
    out = DvdRule().combine(step)
    assert torch.equal(out.logits[4], nucleus_log_probs(step.ctx_logits[4], 0.95))


def test_dvd_selection_ignores_padding_and_batch_equals_single():
    step = make_step()
    out = DvdRule().combine(step)
    for b, count in enumerate(step.document_mask.sum(-1).tolist()):
        single = StepInputs.from_tensors(
            ctx_logits=step.ctx_logits[b : b + 1],
            no_ctx_logits=step.no_ctx_logits[b : b + 1],
            document_logits=step.document_logits[b : b + 1, :count],
            document_mask=step.document_mask[b : b + 1, :count],
        )
        alone = DvdRule().combine(single)
        assert torch.equal(alone.logits[0], out.logits[b])
        assert torch.equal(alone.records.get("beta")[0], out.records.get("beta")[b]) and torch.equal(
            alone.records.get("gamma")[0], out.records.get("gamma")[b]
        )


def test_dvd_options_validated():
    rule = get_method("dvd")
    assert rule.needs_no_context and rule.needs_document_paths
    assert rule.options() == {
        "dynamic_weight": True,
        "beta": None,
        "gamma": None,
        "selection": "entropy",
        "top_k": 10,
        "top_p": 0.95,
        "entropy_ratio": 10.0,
    }
    static = get_method("dvd", dynamic_weight=False)
    assert (static.beta, static.gamma) == (0.25, 0.2)
    with pytest.raises(ValueError, match="dvd: beta and gamma are the fixed weights"):
        get_method("dvd", beta=0.3)
    with pytest.raises(ValueError, match="dvd: selection"):
        get_method("dvd", selection="random")
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="dvd: top_k"):
            get_method("dvd", top_k=bad)
    for bad in (0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="dvd: top_p"):
            get_method("dvd", top_p=bad)
    with pytest.raises(ValueError, match="dvd: gamma"):
        get_method("dvd", dynamic_weight=False, gamma=-1)
    with pytest.raises(ValueError, match="dvd: entropy_ratio"):
        get_method("dvd", entropy_ratio=float("inf"))
    # Fewer than 2 documents is refused by the decoder before decoding (combine never syncs with the host to
    # check): see test_decoder_paths.py::test_too_few_documents_are_refused_before_decoding.


# -- through the decoder ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def decoder(tokenizer):
    return FidesDecoder(build_tiny_model("llama", len(tokenizer)), tokenizer, prompt_template=PromptTemplate(stop=()))


RULES = [DvdRule(), DvdRule(dynamic_weight=False, selection="retrieval")]


@pytest.mark.parametrize("rule", RULES, ids=["dynamic", "static-retrieval"])
def test_dvd_batch_equals_single(decoder, rule):
    batch = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=rule, max_new_tokens=6)
    for question, docs, batched in zip(QUESTIONS, DOCUMENTS, batch):
        single = decoder.generate(question, docs, method=rule, max_new_tokens=6)
        assert batched.method == "dvd" and batched.no_context_prompt is not None
        assert batched.token_ids == single.token_ids
        assert batched.alphas == pytest.approx(single.alphas, abs=1e-5)
        assert [s.values.get("gamma") for s in batched.steps] == pytest.approx(
            [s.values.get("gamma") for s in single.steps], abs=1e-5
        )


def naive_dvd(model, decoder, rule, question, documents, steps):
    """Recompute every path's full sequence at every step, one path at a time, no cache."""
    example = decoder.prepare(question, documents, steps, document_paths=True)
    sequences = [list(example.context_ids), list(example.no_context_ids)] + [list(d) for d in example.document_ids]
    tokens = []
    for _ in range(steps):
        with torch.no_grad():
            last = [model(torch.tensor([s])).logits[0, -1].float() for s in sequences]
        step = StepInputs.from_tensors(
            ctx_logits=last[0][None],
            no_ctx_logits=last[1][None],
            document_logits=torch.stack(last[2:])[None],
            document_mask=torch.ones(1, len(last) - 2, dtype=torch.bool),
        )
        token = int(rule.combine(step).logits[0].argmax())
        tokens.append(token)
        if token in decoder.eos_token_ids:
            break
        sequences = [s + [token] for s in sequences]
    return tokens


@pytest.mark.parametrize("rule", RULES, ids=["dynamic", "static-retrieval"])
def test_dvd_cached_batched_equals_naive_loop(decoder, rule):
    results = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=rule, max_new_tokens=6)
    for question, docs, result in zip(QUESTIONS, DOCUMENTS, results):
        assert result.token_ids == naive_dvd(decoder.model, decoder, rule, question, docs, 6)


def test_dvd_alongside_other_methods_equals_alone(decoder):
    methods = {"dvd": "dvd", "cad": "cad", "standard": "standard", "dvd-static": DvdRule(dynamic_weight=False)}
    together = decoder.generate_batch(QUESTIONS, DOCUMENTS, methods=methods, max_new_tokens=6)
    for label, method in methods.items():
        alone = decoder.generate_batch(QUESTIONS, DOCUMENTS, method=method, max_new_tokens=6)
        for a, b in zip(together[label], alone):
            assert a.token_ids == b.token_ids
            assert a.alphas == pytest.approx(b.alphas, abs=1e-5)
