"""Data-parallel eval: 2 processes under torchrun or accelerate launch (gloo, CPU, one thread each) give the results
of one process, and a run whose rank is killed mid-way finishes on rerun without losing or repeating an example."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fides_rag.eval.parallel import shard
from fides_rag.testing import build_tiny_model, build_tokenizer

N = 24


def test_shards_are_disjoint_and_cover_every_item():
    items = list(range(11))
    parts = [shard(items, r, 3) for r in range(3)]
    assert sorted(sum(parts, [])) == items and all(set(a).isdisjoint(b) for a in parts for b in parts if a is not b)


@pytest.fixture(scope="module")
def tiny_run_inputs(tmp_path_factory):
    """A tiny random-weight llama saved as a folder, and an N-example conflict jsonl."""
    root = tmp_path_factory.mktemp("parallel")
    tokenizer = build_tokenizer()
    build_tiny_model("llama", len(tokenizer)).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows = [
        {
            "id": f"ex{i}",
            "question": f"What is the capital of country {i}?",
            "contexts": [f"City {i} is the capital of country {i}."],
            "context_answers": [f"City {i}"],
            "memory_answers": ["Paris"],
        }
        for i in range(N)
    ]
    (root / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def _eval_args(root: Path, out: Path, batch_size: int = 4, new_tokens: int = 4, progress: bool = False) -> list[str]:
    return [
        "-m",
        "fides_rag.cli.main",
        "eval",
        "--model",
        str(root / "model"),
        "--dataset",
        "jsonl",
        "--data",
        str(root / "data.jsonl"),
        "--methods",
        "standard,fides",
        "--batch-size",
        str(batch_size),
        "--max-new-tokens",
        str(new_tokens),
        "--device",
        "cpu",
        "--bootstrap",
        "200",
        "--out",
        str(out),
        *([] if progress else ["--no-progress"]),
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _torchrun(
    root: Path, out: Path, batch_size: int = 4, new_tokens: int = 4, progress: bool = False
) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            *_eval_args(root, out, batch_size, new_tokens, progress),
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _one_process(root: Path, out: Path, batch_size: int = 4, new_tokens: int = 4) -> None:
    one = subprocess.run(
        [sys.executable, *_eval_args(root, out, batch_size, new_tokens)], env=_env(), capture_output=True, text=True
    )
    assert one.returncode == 0, one.stderr[-3000:]


def _assert_same_as_one_process(two: Path, one: Path) -> None:
    first = json.loads((one / "results.json").read_text())
    second = json.loads((two / "results.json").read_text())
    assert _comparable(second) == _comparable(first) and second["run"]["processes"] == 2
    single = {
        json.loads(line)["id"]: json.loads(line)["outputs"]
        for line in (one / "predictions.jsonl").read_text().splitlines()
    }
    _assert_equal_to_1e5({i: r["outputs"] for i, r in _records(two).items()}, single)


def _assert_equal_to_1e5(got, want, where: str = "") -> None:
    """Texts, tokens and ids equal; recorded values (written to 5 decimals) within one unit of the last decimal,
    since a batch of another size may move a value across a rounding boundary."""
    if isinstance(want, float) and isinstance(got, (int, float)):
        assert got == pytest.approx(want, abs=1.001e-5), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _assert_equal_to_1e5(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for index, (g, w) in enumerate(zip(got, want)):
            _assert_equal_to_1e5(g, w, f"{where}[{index}]")
    else:
        assert got == want, where


def _comparable(results: dict) -> dict:
    return {
        "metrics": results["metrics"],
        "significance": results["significance"],
        "examples": results["run"]["examples"],
    }


def _records(out: Path) -> dict[str, dict]:
    rows = [
        json.loads(line)
        for p in sorted(out.glob("shard-*/predictions.jsonl"))
        for line in p.read_text().splitlines()
        if line
    ]
    return {r["id"]: r for r in rows}


@pytest.mark.slow
def test_two_processes_equal_one(tiny_run_inputs, tmp_path):
    _one_process(tiny_run_inputs, tmp_path / "one")
    two = _torchrun(tiny_run_inputs, tmp_path / "two")
    _, err = two.communicate(timeout=900)
    assert two.returncode == 0, err[-3000:]
    shards = sorted(p.parent.name for p in (tmp_path / "two").glob("shard-*/predictions.jsonl"))
    assert shards == ["shard-0-of-2", "shard-1-of-2"]
    _assert_same_as_one_process(tmp_path / "two", tmp_path / "one")


@pytest.mark.slow
def test_accelerate_launch_equals_one_process(tiny_run_inputs, tmp_path):
    # --multi_gpu selects accelerate's torch.distributed launcher; on a CPU host the ranks use gloo (with --cpu,
    # accelerate would start one process unless MPI is installed).
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    run = subprocess.run(
        [*launch, *_eval_args(tiny_run_inputs, tmp_path / "two")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    _one_process(tiny_run_inputs, tmp_path / "one")
    _assert_same_as_one_process(tmp_path / "two", tmp_path / "one")


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the worker of `launcher` (torchrun) whose environment says RANK=`rank`."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PPid:\t{launcher}\n" in status and f"RANK={rank}".encode() in environ:
            return int(proc.name)
    return None


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="finds the rank's process through /proc")
def test_a_rank_killed_mid_run_resumes_without_loss_or_duplicates(tiny_run_inputs, tmp_path):
    out, batch, tokens = (
        tmp_path / "two",
        1,
        48,
    )  # one example per append, long answers: slow enough to be caught mid-run
    victim = out / "shard-1-of-2" / "predictions.jsonl"
    run = _torchrun(tiny_run_inputs, out, batch, tokens)
    deadline = time.monotonic() + 600
    while _lines(victim) < 2 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = _rank_pid(run.pid, 1)
    assert pid is not None and run.poll() is None, "rank 1 finished before it could be killed"
    os.kill(pid, signal.SIGKILL)
    run.communicate(timeout=600)
    assert run.returncode != 0
    assert 2 <= _lines(victim) < N // 2  # rank 1 died with part of its shard decoded

    rerun = _torchrun(tiny_run_inputs, out, batch, tokens, progress=True)
    _, err = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, err[-3000:]
    assert "eval total: 100%" in err and f"{N}/{N}" in err  # rank 0's bar over both shards
    for shard_file in out.glob("shard-*/predictions.jsonl"):
        ids = [json.loads(line)["id"] for line in shard_file.read_text().splitlines()]
        assert len(ids) == len(set(ids)) == N // 2, shard_file  # nothing decoded twice, nothing missing, no broken line
    _one_process(tiny_run_inputs, tmp_path / "one", batch, tokens)
    _assert_same_as_one_process(out, tmp_path / "one")
