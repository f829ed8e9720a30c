"""How faithful the drop-in LLMs are under the frameworks' own prompts, for each no-context design.

NQ-Swap conflict rows (the passage supports a substituted answer) go through
- LlamaIndex's default `text_qa` prompt: a query engine over the row's passage (`SummaryIndex`, `compact` mode);
- LangChain's RAG prompt (the hub's rlm/rag-prompt, LangChain's RAG tutorial) in `create_stuff_documents_chain`;
- LangChain v1's tutorial chat form (a system prompt holding the context, the question as the human turn) in
  `ChatFides`,
  the documents attached to the human message;
- fides-rag's own 2-shot template (`FidesDecoder.generate_batch` with `methods=`), as the reference.

Each framework form runs with both `no_context_path` designs: 'emptied' (the prompt with the context removed) and
'question' (the neutral "Answer the following question:" and the question, in the chat form). The prompt pairs come
from the real framework objects, which keep each call's two prompts; `standard`'s answers are those objects' own.
CAD, AdaCAD and FIDES then decode the captured pairs over one shared prefill (`generate_batch`, `methods=`), the same
decode the objects run one call at a time; the first `--verify` rows of every form and design are also decoded end
to end through the objects with FIDES, and the script stops if any answer differs.

    python benchmarks/framework_prompts_study.py --model smollm2-135m-instruct --out results/framework-prompts

Writes <out>/<model>.json (every answer, and FIDES's mean α per row) and <out>/<model>.md (the tables), and
prints the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_classic.chains.combine_documents import create_stuff_documents_chain
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document as LCDocument
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.prompts import PromptTemplate as LCPromptTemplate
from llama_index.core import Document as LIDocument
from llama_index.core import SummaryIndex
from llama_index.llms.fides import FidesLLM as LIFidesLLM

from fides_rag import FidesDecoder, GenerationResult, PromptPair
from fides_rag.eval.datasets import QAExample, load_examples
from fides_rag.eval.metrics import contains_answer
from fides_rag.eval.significance import paired_bootstrap
from fides_rag.eval.tables import markdown_table
from langchain_fides import ChatFides
from langchain_fides import FidesLLM as LCFidesLLM

METHODS = ("standard", "cad", "adacad", "fides")
CONTRASTIVE = ("cad", "adacad", "fides")
DESIGNS = ("emptied", "question")
FORMS = ("llamaindex-text_qa", "langchain-stuff", "langchain-v1-chat")
RAG_PROMPT = (  # the hub's rlm/rag-prompt, used by LangChain's RAG tutorial
    "You are an assistant for question-answering tasks. Use the following pieces of retrieved context to answer the "
    "question. If you don't know the answer, just say that you don't know. Use three sentences maximum and keep the "
    "answer concise.\nQuestion: {question} \nContext: {context} \nAnswer:"
)
V1_SYSTEM = "You are a helpful assistant. Use the following context in your response:\n\n{context}"
CHUNK = 8


class KeepMetadata(BaseCallbackHandler):
    """The FIDES metadata of the one LangChain model call it is attached to."""

    def __init__(self) -> None:
        self.info: dict[str, Any] | None = None

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        generation = response.generations[0][0]
        message = getattr(generation, "message", None)
        self.info = dict(message.response_metadata) if message is not None else dict(generation.generation_info or {})


async def _llamaindex(
    decoder: FidesDecoder, rows: Sequence[QAExample], design: str, method: str, max_new: int
) -> list[dict[str, Any]]:
    llm = LIFidesLLM(
        decoder,
        method=method,
        max_new_tokens=max_new,
        no_context_path=design,
        history_size=CHUNK,
        max_batch_size=CHUNK,
        batch_window_s=0.05,
    )
    out: list[dict[str, Any]] = []
    for start in range(0, len(rows), CHUNK):
        chunk = rows[start : start + CHUNK]
        engines = [
            SummaryIndex.from_documents([LIDocument(text=r.contexts[0])]).as_query_engine(
                llm=llm, response_mode="compact"
            )
            for r in chunk
        ]
        await asyncio.gather(*(engine.aquery(r.question) for engine, r in zip(engines, chunk)))
        infos = [h["info"] | {"text": h["result"].text} for h in llm.history]
        for r in chunk:  # concurrent calls finish in any order: find each row's call by its passage and question
            out.append(
                next(i for i in infos if r.contexts[0] in i["context_prompt"] and r.question in i["context_prompt"])
            )
    return out


async def _langchain(
    decoder: FidesDecoder, rows: Sequence[QAExample], design: str, method: str, max_new: int, chat: bool
) -> list[dict[str, Any]]:
    options = dict(
        decoder=decoder,
        method=method,
        max_new_tokens=max_new,
        no_context_path=design,
        max_batch_size=CHUNK,
        batch_window_s=0.05,
    )
    if chat:
        runnable: Any = ChatFides(**options)
        inputs: list[Any] = [
            [
                SystemMessage(V1_SYSTEM.format(context=r.contexts[0])),
                HumanMessage(r.question, additional_kwargs={"documents": [r.contexts[0]]}),
            ]
            for r in rows
        ]
    else:
        runnable = create_stuff_documents_chain(LCFidesLLM(**options), LCPromptTemplate.from_template(RAG_PROMPT))
        inputs = [{"context": [LCDocument(page_content=r.contexts[0])], "question": r.question} for r in rows]
    keepers = [KeepMetadata() for _ in rows]
    outputs = await runnable.abatch(inputs, config=[{"callbacks": [k], "max_concurrency": CHUNK} for k in keepers])
    return [k.info | {"text": o.content if chat else o} for k, o in zip(keepers, outputs)]  # type: ignore[operator]


def run_form(
    decoder: FidesDecoder, form: str, rows: Sequence[QAExample], design: str, method: str, max_new: int
) -> list[dict[str, Any]]:
    """Each row through the framework object of `form`: its two prompts (and its answer under `method`)."""
    if form == "llamaindex-text_qa":
        return asyncio.run(_llamaindex(decoder, rows, design, method, max_new))
    return asyncio.run(_langchain(decoder, rows, design, method, max_new, chat=form == "langchain-v1-chat"))


def mean_alpha(result: GenerationResult) -> float | None:
    """FIDES's per-token evidence weight α, averaged over one answer's tokens (None when no step recorded one)."""
    alphas = [a for a in result.alphas if a is not None]
    return sum(alphas) / len(alphas) if alphas else None


def decode_pairs(
    decoder: FidesDecoder, pairs: Sequence[tuple[str, str]], max_new: int
) -> tuple[dict[str, list[str]], list[float | None]]:
    """CAD, AdaCAD and FIDES on captured prompt pairs, CHUNK examples at a time over one shared prefill; the texts,
    and FIDES's mean α per row."""
    texts: dict[str, list[str]] = {m: [] for m in CONTRASTIVE}
    alphas: list[float | None] = []
    for start in range(0, len(pairs), CHUNK):
        prompts = [PromptPair(ctx, noctx) for ctx, noctx in pairs[start : start + CHUNK]]
        results = decoder.generate_batch(prompts, methods=CONTRASTIVE, max_new_tokens=max_new)
        for method in CONTRASTIVE:
            texts[method] += [r.text for r in results[method]]
        alphas += [mean_alpha(r) for r in results["fides"]]
    return texts, alphas


def framework_answers(
    decoder: FidesDecoder, form: str, rows: Sequence[QAExample], max_new: int, verify: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """design -> {"prompts": [(ctx, noctx)], "answers": method -> texts, "fides_alphas": [mean α]} for one form."""
    started = time.perf_counter()
    base = run_form(decoder, form, rows, "emptied", "standard", max_new)  # standard's answers, through the objects
    log(f"{form} / standard: {len(rows)} rows in {time.perf_counter() - started:.0f} s")
    by_design: dict[str, Any] = {}
    for design in DESIGNS:
        started = time.perf_counter()
        captured = run_form(decoder, form, rows, design, "cad", 1)  # one token: the two prompts are what is kept
        if [c["context_prompt"] for c in captured] != [b["context_prompt"] for b in base]:
            raise AssertionError(f"{form}: the context prompts differ between the standard and the {design} calls")
        pairs = [(c["context_prompt"], c["no_context_prompt"]) for c in captured]
        contrastive, alphas = decode_pairs(decoder, pairs, max_new)
        answers = {"standard": [b["text"] for b in base], **contrastive}
        if verify:
            through_objects = run_form(decoder, form, rows[:verify], design, "fides", max_new)
            if [t["text"] for t in through_objects] != answers["fides"][:verify]:
                raise AssertionError(
                    f"{form}/{design}: FIDES through the framework object differs from the batched decode"
                )
        by_design[design] = {"prompts": pairs, "answers": answers, "fides_alphas": alphas}
        log(f"{form} / {design}: {len(rows)} rows in {time.perf_counter() - started:.0f} s")
    return by_design


def template_answers(
    decoder: FidesDecoder, rows: Sequence[QAExample], max_new: int
) -> tuple[dict[str, list[str]], list[float | None]]:
    texts: dict[str, list[str]] = {m: [] for m in METHODS}
    alphas: list[float | None] = []
    for start in range(0, len(rows), CHUNK):
        chunk = rows[start : start + CHUNK]
        results = decoder.generate_batch(
            [r.question for r in chunk], [list(r.contexts) for r in chunk], methods=METHODS, max_new_tokens=max_new
        )
        for method in METHODS:
            texts[method] += [r.text for r in results[method]]
        alphas += [mean_alpha(r) for r in results["fides"]]
    return texts, alphas


def summarize(
    rows: Sequence[QAExample], answers: dict[str, list[str]], bootstrap: int, alphas: Sequence[float | None] = ()
) -> dict[str, Any]:
    """Per method the context-answer and memory-answer contained rates (%), FIDES against standard and CAD, and
    FIDES's mean α over the rows (when recorded)."""
    context = {m: [100 * contains_answer(t, r.context_answers) for t, r in zip(answers[m], rows)] for m in METHODS}
    memory = {m: [100 * contains_answer(t, r.memory_answers) for t, r in zip(answers[m], rows)] for m in METHODS}
    summary: dict[str, Any] = {
        m: {"context": sum(context[m]) / len(rows), "memory": sum(memory[m]) / len(rows)} for m in METHODS
    }
    for other in ("standard", "cad"):
        summary[f"fides_vs_{other}"] = {
            "context": paired_bootstrap(context["fides"], context[other], samples=bootstrap, seed=0),
            "memory": paired_bootstrap(memory["fides"], memory[other], samples=bootstrap, seed=0),
        }
    recorded = [a for a in alphas if a is not None]
    summary["fides_mean_alpha"] = sum(recorded) / len(recorded) if recorded else None
    return summary


def design_comparisons(
    rows: Sequence[QAExample], answers: dict[str, dict[str, list[str]]], bootstrap: int
) -> dict[str, Any]:
    """Per form and contrastive method: 'emptied' against 'question' on the context-answer contained rate, paired."""
    found: dict[str, Any] = {}
    for form in FORMS:
        if f"{form} / emptied" not in answers or f"{form} / question" not in answers:
            continue
        for method in CONTRASTIVE:
            a, b = (
                [100 * contains_answer(t, r.context_answers) for t, r in zip(answers[f"{form} / {d}"][method], rows)]
                for d in DESIGNS
            )
            found[f"{form} / {method}"] = paired_bootstrap(a, b, samples=bootstrap, seed=0)
    return found


def tables(model: str, n: int, summaries: dict[str, dict[str, Any]], designs: dict[str, Any] | None = None) -> str:
    rows, tests = [], []
    for label, s in summaries.items():
        alpha = s.get("fides_mean_alpha")
        rows.append(
            [
                label,
                *(f"{s[m]['context']:.1f} / {s[m]['memory']:.1f}" for m in METHODS),
                "-" if alpha is None else f"{alpha:.3f}",
            ]
        )
        for other in ("standard", "cad"):
            c = s[f"fides_vs_{other}"]["context"]
            tests.append(
                [
                    label,
                    f"fides − {other}",
                    f"{c['diff']:+.1f}",
                    f"[{c['ci_low']:+.1f}, {c['ci_high']:+.1f}]",
                    f"{c['p_value']:.3f}",
                ]
            )
    return (
        f"`{model}`, {n} NQ-Swap conflict rows. Cells: context answer contained / memory answer contained, in %; "
        "FIDES α: its per-token evidence weight, averaged per answer, then over the rows ('-': not recorded by "
        "this run).\n\n"
        + markdown_table(["prompt / no-context path", *METHODS, "FIDES α"], rows)
        + "\n\nPaired bootstrap on the context-answer contained rate (B = 1000, two-sided 95% CI; p from a paired "
        "permutation test):\n\n"
        + markdown_table(["prompt / no-context path", "comparison", "diff", "95% CI", "p"], tests)
        + "\n"
        + (
            ""
            if not designs
            else "\nNo-context designs compared, same rows and method: context-answer contained rate, emptied − "
            "question:\n\n"
            + markdown_table(
                ["prompt / method", "diff", "95% CI", "p"],
                [
                    [k, f"{c['diff']:+.1f}", f"[{c['ci_low']:+.1f}, {c['ci_high']:+.1f}]", f"{c['p_value']:.3f}"]
                    for k, c in designs.items()
                ],
            )
            + "\n"
        )
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--limit", type=int, default=200, help="first N NQ-Swap conflict rows")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument(
        "--verify", type=int, default=2, help="rows per form and design also decoded end to end with FIDES"
    )
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="results/framework-prompts")
    parser.add_argument(
        "--tables-only", action="store_true", help="rewrite the tables from <out>/<model>.json, decoding nothing"
    )
    parser.add_argument(
        "--check-against", type=Path, help="a longer run's JSON: every answer must equal its answer to the same row"
    )
    args = parser.parse_args(argv)
    log = lambda message: print(message, flush=True)  # noqa: E731
    rows = load_examples("nq-swap", limit=args.limit)
    decoder = None if args.tables_only else FidesDecoder.from_pretrained(args.model, device=args.device)
    out, name = Path(args.out), Path(args.model).name  # a bundled alias, or a folder's name
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    answers: dict[str, dict[str, list[str]]] = {}
    alphas: dict[str, list[float | None]] = {}
    prompts: dict[str, list[tuple[str, str]]] = {}

    def write() -> str:  # after every form, so a long run keeps what it has
        summaries = {label: summarize(rows, a, args.bootstrap, alphas.get(label, ())) for label, a in answers.items()}
        designs = design_comparisons(rows, answers, args.bootstrap)
        report = tables(args.model, len(rows), summaries, designs)
        (out / f"{name}.md").write_text(report)
        record = {
            "model": args.model,
            "rows": [r.id for r in rows],
            "max_new_tokens": args.max_new_tokens,
            "summaries": summaries,
            "design_comparisons": designs,
            "answers": answers,
            "fides_alphas": alphas,
            "first_prompt_pairs": {k: v[:2] for k, v in prompts.items()},
            "seconds": round(time.perf_counter() - started, 1),
        }
        (out / f"{name}.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        return report

    if args.tables_only:  # recompute the tables from a finished run's answers (no model is loaded)
        record = json.loads((out / f"{name}.json").read_text())
        if record["rows"] != [r.id for r in rows]:
            raise SystemExit(
                f"{out / (name + '.json')} holds other rows than --limit {args.limit}; pass the run's --limit"
            )
        answers, prompts, alphas = record["answers"], record["first_prompt_pairs"], record.get("fides_alphas", {})
        args.max_new_tokens, started = record["max_new_tokens"], started - record["seconds"]
        print(write())
        return

    for form in FORMS:
        for design, found in framework_answers(decoder, form, rows, args.max_new_tokens, args.verify, log).items():
            answers[f"{form} / {design}"] = found["answers"]
            alphas[f"{form} / {design}"] = found["fides_alphas"]
            prompts[f"{form} / {design}"] = found["prompts"]
        write()
    form_started = time.perf_counter()
    template, alphas["fides-rag template"] = template_answers(decoder, rows, args.max_new_tokens)
    answers = {"fides-rag template": template, **answers}
    log(f"fides-rag template: {time.perf_counter() - form_started:.0f} s")
    print(write())
    if args.check_against:
        check_against(answers, args.check_against, log)


def check_against(answers: dict[str, dict[str, list[str]]], path: Path, log: Callable[[str], None]) -> None:
    """Stop unless every answer equals the other run's answer to the same row (the other run may have more rows)."""
    other = json.loads(path.read_text())["answers"]
    compared = differ = 0
    for label, by_method in answers.items():
        for method, texts in by_method.items():
            for mine, theirs in zip(texts, other[label][method]):
                compared, differ = compared + 1, differ + (mine != theirs)
    log(f"{compared} answers compared with {path}: {differ} differ")
    if differ:
        raise SystemExit(f"{differ} of {compared} answers differ from {path}")


if __name__ == "__main__":
    main()
