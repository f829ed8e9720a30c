"""The device time of each decode step's backbone forward (a captured step's graph replay, or the eager forward),
apart from the whole step's: CUDA events recorded on the current stream around the forward and read once, at the end
(no host sync per step); on other devices the host's clock around it (their work is synchronous, so it is the
forward's own time). `FidesDecoder.around_forwards(timer)` installs one."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch


class ForwardTimer:
    """Called as a context manager factory around every decode forward; `times_ms` gives each forward's milliseconds."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._host: list[float] = []

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
        else:
            began = time.perf_counter()
            yield
            self._host.append((time.perf_counter() - began) * 1000)

    def __len__(self) -> int:
        return len(self._events) + len(self._host)

    def times_ms(self) -> list[float]:
        """Each forward's milliseconds, in order (on CUDA, after waiting for the last one)."""
        if not self.cuda:
            return list(self._host)
        if self._events:
            self._events[-1][1].synchronize()
        return [start.elapsed_time(end) for start, end in self._events]
