"""Gemma3: the same protocol with fewer samples (5 measured prompts, 1 warm-up, 32 tokens)."""
import json, sys, time
from fides_rag import FidesDecoder, load_model
from fides_rag.eval.bench import Bench, machine
from fides_rag.eval.datasets import load_nq_swap

label, model_name, out = sys.argv[1], sys.argv[2], sys.argv[3]
model, tok = load_model(model_name, device="cpu")
bench = Bench(FidesDecoder(model, tok), load_nq_swap(None))
report = {"code": label, "model": model_name, "machine": machine(), "protocol": {"samples": 5, "warmup": 1, "new_tokens": 32}}
start = time.time()
report["latency"] = bench.latency(samples=5, warmup=1, new_tokens=32)
def raw(e, n):
    q = f"Question: {e.question}\nAnswer:"
    return f"{' '.join(e.contexts)}\n{q}", q
bench.prompts, bench.templated = raw, False
report["raw"] = bench.latency(("standard", "cad", "fides"), samples=5, warmup=1, new_tokens=32)
report["seconds"] = time.time() - start
json.dump(report, open(out, "w"), indent=1)
print(label, model_name, "done in", round(report["seconds"]), "s")
