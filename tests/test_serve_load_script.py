"""benchmarks/serve_load.py runs end to end against a real `fides-rag serve` process (tiny model, six NQ-Swap rows):
it starts the server, sends the sequential pass and two concurrency levels, finds every answer equal to its
sequential answer, and writes the JSON results and the markdown table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fides_rag.eval.datasets import data_dir
from fides_rag.testing import build_tiny_model, build_tokenizer

pytest.importorskip("fides_rag.serve.app", reason="the serve extra is not installed")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not (data_dir() / "nq_swap").is_dir(), reason="needs the NQ-Swap data of ../shared/data")
@pytest.mark.timeout(300)
def test_the_load_script_runs_against_a_real_server(tmp_path):
    tokenizer = build_tokenizer(chat=True)
    build_tiny_model("llama", len(tokenizer)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = tmp_path / "load" / "results.json"
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/serve_load.py",
            "--model",
            str(tmp_path / "model"),
            "--port",
            "8212",
            "--requests",
            "6",
            "--levels",
            "3,6",
            "--timeout",
            "120",
            "--server-arg=--device",
            "--server-arg=cpu",
            "--server-log",
            str(tmp_path / "server.log"),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + (tmp_path / "server.log").read_text()[-3000:]
    result = json.loads(out.read_text())
    assert [r["concurrency"] for r in result["rows"]] == [1, 3, 6]
    for row in result["rows"]:
        assert row["errors"] == 0 and row["lost"] == 0 and row["duplicate_response_ids"] == 0
    for row in result["rows"][1:]:
        assert row["equal_to_sequential"] == 6 and row["mismatched_indices"] == []
    assert row["ttft_p50_s"] is not None and row["latency_p95_s"] >= row["latency_p50_s"]
    assert "| 6 | 6 | 0 |" in out.with_suffix(".md").read_text()


class _SlowServer(BaseHTTPRequestHandler):
    """Answers the model list at once and every chat request after 3 s; keeps the chat bodies it was sent."""

    bodies: list[dict] = []

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._json({"object": "list", "data": [{"id": "slow", "object": "model"}]})

    def do_POST(self):
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        time.sleep(3)
        self._json({})

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_server():
    _SlowServer.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def _run_against(server: ThreadingHTTPServer, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "benchmarks/serve_load.py",
            "--url",
            f"http://127.0.0.1:{server.server_port}",
            "--requests",
            "2",
            "--levels",
            "2",
            "--timeout",
            "1",
            "--out",
            str(tmp_path / "r.json"),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )


@pytest.mark.skipif(not (data_dir() / "nq_swap").is_dir(), reason="needs the NQ-Swap data of ../shared/data")
@pytest.mark.timeout(120)
def test_a_level_past_its_timeout_ends_with_a_clear_message_and_keeps_the_levels_before_it(tmp_path, slow_server):
    run = _run_against(slow_server, tmp_path)
    assert run.returncode == 1
    assert "sequential pass did not finish within --timeout 1 s" in run.stderr and "Traceback" not in run.stderr
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == []


@pytest.mark.skipif(not (data_dir() / "nq_swap").is_dir(), reason="needs the NQ-Swap data of ../shared/data")
@pytest.mark.timeout(120)
def test_max_tokens_sets_every_requests_budget_for_a_prefill_only_run(tmp_path, slow_server):
    _run_against(slow_server, tmp_path, "--max-tokens", "1")
    assert [b["max_tokens"] for b in _SlowServer.bodies] == [1]  # the sequential pass timed out after its first request


def test_a_max_tokens_below_one_is_refused_before_anything_is_sent(tmp_path, slow_server):
    run = _run_against(slow_server, tmp_path, "--max-tokens", "0")
    assert run.returncode != 0 and "--max-tokens must be at least 1, got 0" in run.stderr
    assert _SlowServer.bodies == []
