"""Rank 0's total bar counts the lines appended to every shard's predictions file, whole lines only."""

from __future__ import annotations

from fides_rag.eval.shard_progress import ShardProgress


def test_counts_appended_whole_lines_across_shards(tmp_path):
    files = [tmp_path / "shard-0" / "p.jsonl", tmp_path / "shard-1" / "p.jsonl"]
    files[0].parent.mkdir()
    files[0].write_bytes(b'{"id": "kept"}\n')  # decoded by an earlier run: counted in `initial`, not again
    progress = ShardProgress(files, [files[0].stat().st_size, 0], total=5, initial=1)
    progress.poll()
    assert progress.bar.n == 1  # shard 1 has no file yet
    with files[0].open("ab") as f:
        f.write(b'{"id": "a"}\n{"id": "b"}\n{"id": "c"')  # the last line is still being written
    progress.poll()
    assert progress.bar.n == 3
    files[1].parent.mkdir()
    files[1].write_bytes(b'{"id": "d"}\n')
    with files[0].open("ab") as f:
        f.write(b"}\n")
    progress.close()
    assert progress.bar.n == 5
