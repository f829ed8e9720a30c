"""A real `fides-rag serve` process on a tiny random-weight model (saved to a folder), bound to 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fides_rag.testing import build_tiny_model, build_tokenizer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A running server process: its base URL, its log, and a SIGTERM stop that returns the exit code."""

    def __init__(self, model: str, *args: str, startup_s: float = 120.0, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"fides-serve-{self.port}.log"
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            **(env or {}),
        }
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fides_rag.cli.main",
                    "serve",
                    "--model",
                    model,
                    "--port",
                    str(self.port),
                    "--device",
                    "cpu",
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not start in {startup_s} s:\n{self.log.read_text()[-3000:]}")

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny chat model with a long position range (long answers for the disconnect and shutdown tests)."""
    folder = tmp_path_factory.mktemp("serve-model") / "model"
    tokenizer = build_tokenizer(chat=True)
    build_tiny_model("llama", len(tokenizer), max_position_embeddings=8192).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def server(tiny_model_dir) -> Iterator[Server]:
    running = Server(tiny_model_dir, "--max-new-tokens", "12")
    yield running
    assert running.stop() == 0, running.log.read_text()[-3000:]


class _Starter:
    """Starts server processes and stops them all at the end."""

    def __init__(self) -> None:
        self.started: list[Server] = []

    def __call__(self, model: str, *args: str, env: dict[str, str] | None = None) -> Server:
        self.started.append(Server(model, *args, env=env))
        return self.started[-1]

    def stop_all(self) -> list[int]:
        return [running.stop() for running in self.started]


@pytest.fixture
def start_server() -> Iterator[_Starter]:
    """Start another server process (stopped at the end of the test if the test did not stop it)."""
    starter = _Starter()
    yield starter
    starter.stop_all()


@pytest.fixture(scope="module")
def start_server_module() -> Iterator[_Starter]:
    """`start_server` for a module's shared server; each must exit with code 0."""
    starter = _Starter()
    yield starter
    assert starter.stop_all() == [0] * len(starter.started)
