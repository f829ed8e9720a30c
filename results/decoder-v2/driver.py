"""Same protocol on the old (d3638e8) and new decoder: latency (template), raw-prompt latency, context growth."""
import json, sys, time
import torch
from fides_rag import FidesDecoder, load_model
from fides_rag.eval.bench import Bench, machine
from fides_rag.eval.datasets import load_nq_swap

label, model_name, out = sys.argv[1], sys.argv[2], sys.argv[3]
sections = sys.argv[4].split(",")
model, tok = load_model(model_name, device="cpu")
examples = load_nq_swap(None)
bench = Bench(FidesDecoder(model, tok), examples)
report = {"code": label, "model": model_name, "machine": machine(), "protocol": {"samples": 8, "warmup": 2, "new_tokens": 32}}
start = time.time()
if "latency" in sections:
    report["latency"] = bench.latency(samples=8, warmup=2, new_tokens=32)
if "raw" in sections:
    def raw(e, n):
        q = f"Question: {e.question}\nAnswer:"
        return f"{' '.join(e.contexts)}\n{q}", q
    bench.prompts, bench.templated = raw, False
    report["raw"] = bench.latency(("standard", "cad", "fides"), samples=8, warmup=2, new_tokens=32)
if "context" in sections:
    bench.templated = FidesDecoder(model, tok).use_chat_template
    bench.prompts = Bench.prompts.__get__(bench)
    report["context"] = bench.context_growth(lengths=(256, 1024, 2048), new_tokens=16, repeats=2)
report["seconds"] = time.time() - start
json.dump(report, open(out, "w"), indent=1)
print(label, model_name, "done in", round(report["seconds"]), "s")
