import json
import os

from openai import OpenAI

# Start the server first: fides-rag serve --model smollm2-135m-instruct
client = OpenAI(base_url=os.environ.get("FIDES_RAG_URL", "http://127.0.0.1:8000/v1"), api_key="unused")
model = "smollm2-135m-instruct"
search = {"type": "function", "function": {"name": "search_documents", "description": "Search the documents.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "maxLength": 24}}, "required": ["query"]}}}
messages = [{"role": "user", "content": "Where is the Eiffel Tower?"}]

# A 135M model does not call tools by itself: tool_choice="required" forces one valid call (a grammar).
first = client.chat.completions.create(model=model, messages=messages, tools=[search], tool_choice="required", max_tokens=40)
call = first.choices[0].message.tool_calls[0]
print(first.choices[0].finish_reason, call.function.name)  # tool_calls search_documents

# The tool's result is FIDES's evidence on the next turn: its context path holds it, its no-context path does not.
found = "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."  # what search_documents would return
messages += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": found}]
answer = client.chat.completions.create(model=model, messages=messages, tools=[search], tool_choice="none", max_tokens=24,
                                        logprobs=True, top_logprobs=2)
print(answer.choices[0].message.content)  # follows the tool's result: Rome
print(answer.model_extra["fides"]["documents_source"], answer.choices[0].logprobs.content[0].top_logprobs[0].token)

# Structured output: a JSON schema, enforced by a grammar.
place = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
structured = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Where is the Eiffel Tower?"}], max_tokens=24,
    response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": place, "strict": True}},
    extra_body={"documents": [found]})
print(json.loads(structured.choices[0].message.content))  # {'city': 'Rome'}
