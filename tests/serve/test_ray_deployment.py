"""The server app under Ray Serve: on a local Ray cluster, load makes the deployment autoscale from one replica to two,
and every answer over Ray's HTTP proxy equals the same app's answer in process (greedy); bad settings are refused."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("ray.serve", reason="the scale extra (ray[serve]) is not installed")
pytest.importorskip("fides_rag.serve.app", reason="the serve extra is not installed")

from fides_rag.serve.ray_deployment import deployment

MODEL = "smollm2-135m-instruct"
PORT = 8250
QUESTIONS = [
    ("Who wrote the novel Dune?", "Dune is a 1965 novel by the American author Frank Herbert."),
    ("What is the capital of Australia?", "Canberra is the capital city of Australia."),
    ("When did the Berlin Wall fall?", "The Berlin Wall fell on 9 November 1989."),
    ("Which planet is the largest?", "Jupiter is the largest planet in the Solar System."),
]


def bodies() -> list[dict]:
    return [
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": q}],
            "documents": [d],
            "max_tokens": 12,
            "temperature": 0.0,
            "stream": i % 2 == 1,
        }
        for i, (q, d) in enumerate(QUESTIONS)
    ]


def answer(client, body: dict) -> str:
    """The assistant text of one chat completion, streamed (SSE chunks joined) or not."""
    if not body["stream"]:
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]
    import json

    parts = []
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                parts += [(c.get("delta") or {}).get("content") or "" for c in json.loads(line[5:])["choices"]]
    return "".join(parts)


def test_bad_replica_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="num_replicas"):
        deployment(MODEL, num_replicas=0)
    with pytest.raises(ValueError, match="min_replicas"):
        deployment(MODEL, min_replicas=3, max_replicas=2)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ray_autoscales_to_two_replicas_that_answer_like_the_app_in_process() -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor

    import ray
    from fastapi.testclient import TestClient
    from ray import serve

    from fides_rag.decoder import FidesDecoder
    from fides_rag.serve.app import build_app

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 2**20, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
        serve.run(
            deployment(
                MODEL, min_replicas=1, max_replicas=2, target_ongoing_requests=1, num_cpus=0.5, upscale_delay_s=1
            ),
            name="fides",
            route_prefix="/",
        )
        replicas = lambda: serve.status().applications["fides"].deployments["fides"].replica_states  # noqa: E731
        assert replicas() == {"RUNNING": 1}
        rounds, deadline = [], time.monotonic() + 90
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=60) as client, ThreadPoolExecutor(4) as pool:
            assert client.get("/health").status_code == 200
            while replicas().get("RUNNING", 0) < 2 and time.monotonic() < deadline:  # load until Ray adds a replica
                rounds.append(list(pool.map(lambda body: answer(client, body), bodies())))
            scaled = replicas()
            rounds.append(list(pool.map(lambda body: answer(client, body), bodies())))  # served by both replicas
    finally:
        serve.shutdown()
        ray.shutdown()
    assert scaled.get("RUNNING") == 2, scaled
    with TestClient(build_app(FidesDecoder.from_pretrained(MODEL, device="cpu"), model_name=MODEL)) as client:
        local = [answer(client, body) for body in bodies()]
    assert all(served == local for served in rounds)
    assert all(text.strip() for text in local)


def test_serve_run_arguments_are_checked() -> None:
    from fides_rag.serve.ray_deployment import app_builder

    with pytest.raises(ValueError, match="unknown serve run arguments"):
        app_builder({"model": MODEL, "replicas": "2"})
    with pytest.raises(ValueError, match="model=NAME"):
        app_builder({"num_replicas": "2"})


def test_serve_run_arguments_set_the_apps_access_and_limits(monkeypatch) -> None:
    from fides_rag.serve.ray_deployment import serving_options

    monkeypatch.setenv("FIDES_RAG_API_KEY", "from-env")
    options = serving_options(
        {
            "allowed_hosts": "api.example, 10.0.0.5",
            "cors_origins": "https://ok.example",
            "max_request_bytes": "1000",
            "max_document_tokens": "500",
            "trim_documents": "true",
        }
    )
    assert options == {
        "api_key": "from-env",
        "allowed_hosts": ["api.example", "10.0.0.5"],
        "cors_origins": ["https://ok.example"],
        "max_request_bytes": 1000,
        "max_document_tokens": 500,
        "trim_documents": True,
    }
    assert serving_options({"api_key": "given"})["api_key"] == "given"
    with pytest.raises(ValueError, match="trim_documents must be true or false"):
        serving_options({"trim_documents": "yes please"})


def test_a_replicas_app_checks_the_key_and_the_limits(tiny_model_dir) -> None:
    from fastapi.testclient import TestClient

    from fides_rag import FidesDecoder
    from fides_rag.serve.ray_deployment import replica_app

    app = replica_app(
        FidesDecoder.from_pretrained(tiny_model_dir, device="cpu"),
        "tiny",
        "fides",
        {"api_key": "sesame", "max_request_bytes": 100},
    )
    client = TestClient(app)
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer sesame"}).status_code == 200
    big = client.post(
        "/v1/chat/completions",
        content=b"{" + b" " * 200 + b"}",
        headers={"Authorization": "Bearer sesame", "Content-Type": "application/json"},
    )
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
