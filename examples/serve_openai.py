import os

from openai import OpenAI

# Start the server first: fides-rag serve --model smollm2-135m-instruct
client = OpenAI(base_url=os.environ.get("FIDES_RAG_URL", "http://127.0.0.1:8000/v1"), api_key="unused")
documents = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]
messages = [{"role": "user", "content": "In which city is the Eiffel Tower located?"}]

response = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, max_tokens=16,
                                          extra_body={"documents": documents})  # FIDES's context path
print(response.choices[0].message.content)  # follows the document: Rome
print(response.model_extra["fides"]["method"], response.model_extra["fides"]["alphas"][:3])  # fides [0.4..., ...]

for chunk in client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, max_tokens=16, stream=True,
                                            extra_body={"documents": documents, "method": "cad"}):  # any registered method
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
