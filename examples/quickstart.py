"""A retrieval-memory conflict under standard RAG, CAD, AdaCAD and FIDES on a bundled backbone.

    python examples/quickstart.py [--model gemma3-270m]
"""

import argparse

from fides_rag import FidesDecoder, load_model
from fides_rag.report import step_table

CONFLICTS = [
    ("In which city is the Eiffel Tower located?", ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]),
    ("Who wrote Hamlet?", ["Hamlet is a tragedy written by Charles Dickens around 1600."]),
]

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="gemma3-270m", help="gemma3-270m, smollm2-135m-instruct, a hub id or a path")
args = parser.parse_args()

model, tokenizer = load_model(args.model)
decoder = FidesDecoder(model, tokenizer, method="fides")

for question, documents in CONFLICTS:
    print(f"\nQ: {question}\nDocument: {documents[0]}")
    for method in ("standard", "cad", "adacad", "fides"):
        result = decoder.generate(question, documents, method=method, max_new_tokens=24)
        print(f"  {method:>8}: {result.text}")
    print("\nFIDES per token (alpha = max(0.1, 1.5 * (0.5 opp + 0.3 shift + 0.2 noise))):")
    print(step_table(decoder.generate(question, documents, method="fides", max_new_tokens=24)))
