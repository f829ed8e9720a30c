"""Rank 0's progress bar over every shard of a data-parallel eval: it counts the lines the ranks append to their
shard's predictions file (one line per decoded example), so no process waits on another to report progress."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


class ShardProgress:
    """A tqdm bar over all shards; `poll()` reads only the bytes appended since the last poll."""

    def __init__(
        self, files: Sequence[Path], offsets: Sequence[int], *, total: int, initial: int, position: int = 0
    ) -> None:
        from tqdm.auto import tqdm

        self.files = list(files)
        self.offsets = list(offsets)  # bytes of each file already counted (its size before this run decoded)
        self.bar: Any = tqdm(
            total=total, initial=initial, unit="ex", dynamic_ncols=True, position=position, desc="eval total"
        )

    def poll(self) -> None:
        """Count the lines appended to every shard file since the last call."""
        for k, path in enumerate(self.files):
            if not path.is_file():
                continue
            with path.open("rb") as handle:
                handle.seek(self.offsets[k])
                appended = handle.read()
            done = appended.rfind(b"\n") + 1  # a line still being written is counted when it ends
            if done:
                self.bar.update(appended[:done].count(b"\n"))
                self.offsets[k] += done

    def close(self) -> None:
        self.poll()
        self.bar.close()
