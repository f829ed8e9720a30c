"""Compare xgrammar, llguidance and outlines-core for grammar-constrained decoding on this machine's CPU.

For each real tokenizer and each JSON schema it measures: tokenizer preparation, grammar compile time (cold and
again), the per-token cost (fill the bitmask, accept the token), a batch of 8 rows per step, and exactness:
  * completeness: random valid documents, serialised three ways and tokenized by the tokenizer, are admitted token
    by token, EOS is refused before the document ends and admitted at its end;
  * soundness: random walks that pick any token the mask admits end in text that parses and validates;
  * an always-true regex admits every non-special token.

    .venv/bin/pip install xgrammar outlines-core   # llguidance comes with fides-rag[grammar]
    .venv/bin/python benchmarks/grammar_libraries.py --out results/grammar-libraries/cpu-2core.json
"""

from __future__ import annotations

import argparse
import codecs
import datetime
import gc
import importlib.metadata as metadata
import json
import os
import platform
import random
import re
import statistics
import time
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import torch

ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
TOOL_CALL = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["search_documents", "get_weather", "calculator"]},
        "arguments": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "top_k": {"type": "integer"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "source": {"type": "string", "enum": ["wiki", "news", "web"]},
                        "recent": {"type": "boolean"},
                    },
                    "required": ["source", "recent"],
                    "additionalProperties": False,
                },
            },
            "required": ["query", "filters"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
SCHEMAS = {"answer": ANSWER, "tool_call": TOOL_CALL}
ANY_TEXT_REGEX = r"[\s\S]*"
STYLES = {"compact": dict(separators=(",", ":")), "default": {}, "indent": dict(indent=2)}
ALPHABET = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.;:!?-'()/") + [
    '"',
    "\\",
    "\n",
    "\t",
    "\x01",
    "é",
    "ß",
    "ü",
    "中",
    "文",
    "—",
    "€",
    "😀",
    "\u200b",
    "Ω",
]


# ---------------------------------------------------------------- random valid documents of a schema


def random_instance(schema: dict, rng: random.Random) -> Any:
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema["type"]
    if kind == "object":
        return {
            k: random_instance(sub, rng)
            for k, sub in schema["properties"].items()
            if k in schema.get("required", ()) or rng.random() < 0.5
        }
    if kind == "string":
        return "".join(rng.choice(ALPHABET) for _ in range(rng.choice([0, 1, 3, 8, 20, 40])))
    if kind == "integer":
        return rng.choice([0, 1, -7, 42, rng.randint(-(10**6), 10**9)])
    if kind == "boolean":
        return rng.random() < 0.5
    raise ValueError(kind)


def valid_documents(schema: dict, n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        style = list(STYLES)[i % len(STYLES)]
        docs.append((style, json.dumps(random_instance(schema, rng), ensure_ascii=rng.random() < 0.3, **STYLES[style])))
    return docs


# ------------------------------------------------------------- token bytes (for outlines-core and for decoding walks)


def _byte_decoder() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, extra = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tokenizer) -> dict[int, bytes]:
    """id -> the bytes the token stands for, special tokens left out (byte-level BPE and sentencepiece vocabularies)."""
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    vocab = tokenizer.get_vocab()
    byte_level = tokenizer.convert_ids_to_tokens(tokenizer.encode(" a b", add_special_tokens=False))[0].startswith("Ġ")
    decoder = _byte_decoder()
    out = {}
    for piece, i in vocab.items():
        if i in special:
            continue
        if byte_level and all(c in decoder for c in piece):
            out[i] = bytes(decoder[c] for c in piece)
        elif (m := re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)) and not byte_level:
            out[i] = bytes([int(m.group(1), 16)])
        else:
            out[i] = (piece if byte_level else piece.replace("▁", " ")).encode()
    return out


def utf8_start(piece: bytes) -> bool:
    """Whether valid UTF-8 text can begin with `piece` (a first token that cannot is rightly refused)."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(piece, final=False)
        return True
    except UnicodeDecodeError:
        return False


def allowed(bitmask_row: torch.Tensor, vocab: int) -> np.ndarray:
    bits = np.unpackbits(bitmask_row.numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab])


def bit(bitmask_row: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask_row[token // 32]) >> (token % 32)) & 1)


# ---------------------------------------------------------------- the three libraries behind one interface


class XGrammar:
    name, dist = "xgrammar", "xgrammar"

    def prepare(self, tokenizer, eos: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2)
        self.batch = xgr.BatchGrammarMatcher(max_threads=2)

    def compile(self, schema: dict, fresh: bool = True):
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=2) if fresh else self.compiler
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=True)

    def compile_regex(self, regex: str):
        return self.compiler.compile_regex(regex)

    def start(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, state, bitmask: torch.Tensor, row: int) -> None:
        state.fill_next_token_bitmask(bitmask, row)

    def accept(self, state, token: int) -> bool:
        return state.accept_token(token)

    def fill_batch(self, states: list, bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(states, bitmask)


class LLGuidance:
    name, dist = "llguidance", "llguidance"
    # without the second option, \uXXXX escapes other than control characters are refused
    options = {"whitespace_flexible": True, "json_allow_general_unicode_escapes": True}

    def prepare(self, tokenizer, eos: int) -> None:
        import llguidance
        import llguidance.hf

        self.llg = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, eos_token=eos)
        self.executor = llguidance.LLExecutor(num_threads=2)

    def _matcher(self, grammar: str):
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def compile(self, schema: dict, fresh: bool = True):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults=self.options)
        return self._matcher(grammar)

    def compile_regex(self, regex: str):
        return self._matcher(self.llg.LLMatcher.grammar_from_regex(regex))

    def start(self, compiled):
        return compiled.deep_copy()

    def fill(self, state, bitmask: torch.Tensor, row: int) -> None:
        state.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), bitmask.shape[1] * 4)

    def accept(self, state, token: int) -> bool:
        return state.consume_token(token)

    def fill_batch(self, states: list, bitmask: torch.Tensor) -> None:
        self.executor.unsafe_compute_mask_ptr(
            [(s, i) for i, s in enumerate(states)], bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0]
        )


class OutlinesCore:
    name, dist = "outlines-core", "outlines_core"
    whitespace = r"[\n\t\r ]*"

    def prepare(self, tokenizer, eos: int) -> None:
        import outlines_core

        self.oc = outlines_core
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in token_bytes(tokenizer).items():
            if i != eos:
                by_bytes.setdefault(b, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, by_bytes)

    def compile(self, schema: dict, fresh: bool = True):
        from outlines_core.json_schema import build_regex_from_schema

        return self.oc.Index(build_regex_from_schema(json.dumps(schema), self.whitespace), self.vocabulary)

    def compile_regex(self, regex: str):
        return self.oc.Index(regex, self.vocabulary)

    def start(self, compiled):
        return self.oc.Guide(compiled)

    def fill(self, state, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].zero_()
        state.write_mask_into(bitmask[row].data_ptr(), bitmask.shape[1], 4)

    def accept(self, state, token: int) -> bool:
        if token == self.vocabulary.get_eos_token_id():  # the Guide has no transition on EOS: it ends where it is final
            return state.is_finished()
        try:
            state.advance(token, return_tokens=False)
            return True
        except ValueError:
            return False

    def fill_batch(self, states: list, bitmask: torch.Tensor) -> None:
        for i, s in enumerate(states):
            self.fill(s, bitmask, i)


LIBRARIES = {lib.name: lib for lib in (XGrammar, LLGuidance, OutlinesCore)}


# ---------------------------------------------------------------- measurements


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def first_mask_seconds(lib, compiled, width: int) -> float:
    bitmask = torch.full((1, width), -1, dtype=torch.int32)
    state = lib.start(compiled)
    return timed(lib.fill, state, bitmask, 0)[1]


def walk_valid(lib, compiled, tokenizer, docs, eos: int, width: int, passes: int) -> dict:
    """Exactness from the first pass; each token's fill and accept times are the minimum over `passes` passes
    (the machine is shared, so single timings carry other processes' noise)."""
    bitmask = torch.full((1, width), -1, dtype=torch.int32)
    fills, accepts = [], []
    for p in range(passes):
        fill_s, accept_s, failures, early_eos, eos_refused, not_roundtrip, tokens = [], [], [], 0, 0, 0, 0
        for style, text in docs:
            ids = tokenizer.encode(text, add_special_tokens=False)
            if tokenizer.decode(ids) != text:
                not_roundtrip += 1
                continue
            state = lib.start(compiled)
            ok = True
            for pos, token in enumerate(ids):
                _, t_fill = timed(lib.fill, state, bitmask, 0)
                fill_s.append(t_fill)
                if pos > 0 and bit(bitmask[0], eos):
                    early_eos += 1
                if not bit(bitmask[0], token):
                    failures.append({"style": style, "text": text, "position": pos, "token": tokenizer.decode([token])})
                    ok = False
                    break
                accepted, t_acc = timed(lib.accept, state, token)
                accept_s.append(t_acc)
                tokens += 1
                if not accepted:
                    failures.append({"style": style, "text": text, "position": pos, "rejected_by_accept": True})
                    ok = False
                    break
            if ok:
                lib.fill(state, bitmask, 0)
                if not bit(bitmask[0], eos) or not lib.accept(state, eos):
                    eos_refused += 1
        fills.append(fill_s)
        accepts.append(accept_s)
        if p == 0:
            exactness = {
                "documents": len(docs),
                "not_round_tripping": not_roundtrip,
                "tokens": tokens,
                "refused_documents": len(failures),
                "eos_admitted_early": early_eos,
                "eos_refused_at_end": eos_refused,
                "first_failures": failures[:3],
            }
    fill, accept = np.min(fills, axis=0), np.min(accepts, axis=0)
    return exactness | {
        "fill_us_mean": 1e6 * float(fill.mean()),
        "fill_us_p50": 1e6 * float(np.median(fill)),
        "fill_us_p95": 1e6 * float(np.percentile(fill, 95)),
        "fill_us_max": 1e6 * float(fill.max()),
        "accept_us_mean": 1e6 * float(accept.mean()),
    }


CLOSERS = [b'"', b"}", b"]", b",", b'":', b'"}', b"}}"]


def random_walks(
    lib,
    compiled,
    tokenizer,
    pieces: dict[int, bytes],
    schema: dict,
    eos: int,
    vocab: int,
    width: int,
    n: int,
    seed: int,
    budget: int = 40,
    cap: int = 160,
) -> dict:
    """Walks that take uniformly random admitted tokens for `budget` steps, then head for an exit; the text must
    validate. A special token the mask let through is read as its literal text (and counted)."""
    rng = np.random.default_rng(seed)
    closer_ids = {b: i for i, b in pieces.items() if b in CLOSERS}
    length = np.zeros(vocab, dtype=np.int64)  # 0 for special tokens
    for i, b in pieces.items():
        length[i] = len(b)
    bitmask = torch.full((1, width), -1, dtype=torch.int32)
    counts = {
        "walks": n,
        "finished": 0,
        "utf8": 0,
        "parsed": 0,
        "valid": 0,
        "special_admitted": 0,
        "special_emitted": 0,
        "dead_ends": 0,
    }
    bad = []
    for _ in range(n):
        state, out, finished = lib.start(compiled), [], False
        for step in range(cap):
            lib.fill(state, bitmask, 0)
            ids = allowed(bitmask[0], vocab)
            if len(ids) == 0:
                counts["dead_ends"] += 1
                break
            if bit(bitmask[0], eos) and (step >= budget or rng.random() < 0.3):
                finished = True
                break
            counts["special_admitted"] += int(np.any((length[ids] == 0) & (ids != eos)))
            if step < budget:
                token = int(rng.choice(ids))
            else:
                exits = [closer_ids[b] for b in CLOSERS if b in closer_ids and bit(bitmask[0], closer_ids[b])]
                short = ids[length[ids] == 1]
                token = exits[0] if exits and rng.random() < 0.7 else int(rng.choice(short if len(short) else ids))
            if token == eos:
                finished = True
                break
            out.append(token)
            if not lib.accept(state, token):
                bad.append(
                    {
                        "reason": "mask admitted a token that accept refused",
                        "text": repr(b"".join(pieces.get(t, b"?") for t in out)),
                    }
                )
                break
        if not finished:
            continue
        counts["finished"] += 1
        counts["special_emitted"] += sum(1 for t in out if t not in pieces)
        raw = b"".join(pieces[t] if t in pieces else tokenizer.convert_ids_to_tokens(t).encode() for t in out)
        try:
            text = raw.decode("utf-8")
            counts["utf8"] += 1
            doc = json.loads(text)
            counts["parsed"] += 1
            jsonschema.validate(doc, schema)
            counts["valid"] += 1
        except (UnicodeDecodeError, ValueError, jsonschema.ValidationError) as err:
            bad.append({"reason": type(err).__name__, "text": repr(raw)[:300]})
    counts["failures"] = bad[:3]
    return counts


def batch_step_cost(
    lib, compiled_by_schema: dict, tokenizer, eos: int, width: int, rows: int, seed: int, passes: int
) -> dict:
    """`rows` requests (alternating schemas) stepped together: one batch fill + one accept per row per step;
    each step's time is the minimum over `passes` passes."""
    names = list(compiled_by_schema)
    streams = []
    for r in range(rows):
        _, text = valid_documents(SCHEMAS[names[r % len(names)]], 1, seed + r)[0]
        streams.append(tokenizer.encode(text, add_special_tokens=False) + [eos])
    steps = min(len(s) for s in streams)
    bitmask = torch.full((rows, width), -1, dtype=torch.int32)
    fills, accepts = np.full(steps, np.inf), np.full(steps, np.inf)
    for _ in range(passes):
        states = [lib.start(compiled_by_schema[names[r % len(names)]]) for r in range(rows)]
        for step in range(steps):
            _, t = timed(lib.fill_batch, states, bitmask)
            fills[step] = min(fills[step], t)
            start = time.perf_counter()
            for state, stream in zip(states, streams):
                lib.accept(state, stream[step])
            accepts[step] = min(accepts[step], time.perf_counter() - start)
    return {
        "rows": rows,
        "steps": steps,
        "fill_ms_mean": 1e3 * float(fills.mean()),
        "fill_ms_p95": 1e3 * float(np.percentile(fills, 95)),
        "accept_ms_mean": 1e3 * float(accepts.mean()),
    }


def any_text(lib, pieces: dict[int, bytes], eos: int, vocab: int, width: int) -> dict:
    compiled, seconds = timed(lib.compile_regex, ANY_TEXT_REGEX)
    bitmask = torch.full((1, width), -1, dtype=torch.int32)
    lib.fill(lib.start(compiled), bitmask, 0)
    admitted = set(allowed(bitmask[0], vocab).tolist())
    refused = [i for i in pieces if i not in admitted]
    return {
        "compile_s": seconds,
        "ordinary_tokens_refused": len(refused),
        "text_starts_refused": sum(1 for i in refused if utf8_start(pieces[i])),
        "text_starts_refused_examples": [repr(pieces[i]) for i in refused if utf8_start(pieces[i])][:8],
        "special_tokens_admitted": sum(1 for i in admitted if i not in pieces and i != eos),
    }


def footprint(dist: str) -> dict:
    meta = metadata.distribution(dist)
    requires = [r for r in (meta.requires or []) if "extra ==" not in r]
    return {
        "version": meta.version,
        "license": meta.metadata.get("License-Expression") or meta.metadata.get("License"),
        "installed_mb": round(sum((f.size or 0) for f in meta.files) / 1e6, 1),
        "requires": requires,
    }


def measure(lib_name: str, model: str, args) -> dict:
    from transformers import AutoTokenizer

    from fides_rag.models.loading import resolve_model_source

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(model))
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    width = (vocab + 31) // 32
    pieces = token_bytes(tokenizer)
    lib = LIBRARIES[lib_name]()
    _, prepare_s = timed(lib.prepare, tokenizer, eos)
    row: dict[str, Any] = {
        "library": lib_name,
        "model": model,
        "vocab": vocab,
        "tokenizer_prepare_s": prepare_s,
        "schemas": {},
    }
    compiled_by_schema = {}
    for name, schema in SCHEMAS.items():
        colds = []
        for _ in range(args.repeats):
            gc.collect()
            compiled, t = timed(lib.compile, schema)
            colds.append(t + first_mask_seconds(lib, compiled, width))
        lib.compile(schema, fresh=False)
        _, again = timed(lib.compile, schema, False)
        _, new_state = timed(lib.start, compiled)
        compiled_by_schema[name] = compiled
        docs = valid_documents(schema, args.documents, args.seed)
        row["schemas"][name] = {
            "compile_cold_s": statistics.median(colds),
            "compile_cold_min_s": min(colds),
            "compile_cold_first_s": colds[0],
            "compile_again_s": again,
            "new_state_ms": 1e3 * new_state,
            "valid_documents": walk_valid(lib, compiled, tokenizer, docs, eos, width, args.passes),
            "random_walks": random_walks(
                lib, compiled, tokenizer, pieces, schema, eos, vocab, width, args.walks, args.seed
            ),
        }
        print(
            f"  {lib_name:14s} {model:22s} {name:10s} cold {statistics.median(colds):.3f}s  "
            f"fill {row['schemas'][name]['valid_documents']['fill_us_mean']:.0f}us",
            flush=True,
        )
    row["batch_of_8"] = batch_step_cost(lib, compiled_by_schema, tokenizer, eos, width, 8, args.seed, args.passes)
    row["any_text"] = any_text(lib, pieces, eos, vocab, width)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    parser.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=list(LIBRARIES))
    parser.add_argument(
        "--documents", type=int, default=60, help="random valid documents per schema (3 serialisations)"
    )
    parser.add_argument("--walks", type=int, default=30, help="random mask-following walks per schema")
    parser.add_argument("--repeats", type=int, default=3, help="cold compiles per schema (the median is reported)")
    parser.add_argument("--passes", type=int, default=3, help="timing passes (each token's minimum is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows: list[dict] = []
    for model in args.models:
        for lib in args.libraries:
            rows.append(measure(lib, model, args))
            write(rows, args)
    summary(rows)


def write(rows: list[dict], args) -> None:
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_average_at_end": os.getloadavg(),
        },
        "libraries": {name: footprint(cls.dist) for name, cls in LIBRARIES.items() if name in args.libraries},
        "schemas": SCHEMAS,
        "any_text_regex": ANY_TEXT_REGEX,
        "settings": vars(args) | {"out": str(args.out)},
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")


def summary(rows: list[dict]) -> None:
    for r in rows:
        s = r["schemas"]
        print(
            f"{r['library']:14s} {r['model']:22s} prep {r['tokenizer_prepare_s']:5.2f}s "
            + " ".join(
                f"{n}: cold {v['compile_cold_s']:.3f}s fill {v['valid_documents']['fill_us_mean']:.0f}us "
                f"acc {v['valid_documents']['accept_us_mean']:.0f}us refused "
                f"{v['valid_documents']['refused_documents']} "
                f"valid {v['random_walks']['valid']}/{v['random_walks']['finished']}"
                for n, v in s.items()
            )
            + f" batch8 {r['batch_of_8']['fill_ms_mean'] + r['batch_of_8']['accept_ms_mean']:.2f}ms"
        )


if __name__ == "__main__":
    main()
