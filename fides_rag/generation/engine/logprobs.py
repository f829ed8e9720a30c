"""Log-probabilities of the tokens chosen, from the distribution each was chosen from: the rule's final scores
after the grammar mask and the request's processors and sampling warpers (the contrasted distribution, not the
model's). Computed on the device only for the units that ask; their values ride in the step's one host transfer.

Packed per unit after the chosen id: its log-probability, then `k` ids and `k` log-probabilities of the most
likely tokens (`k`: the most any unit of the lane asked for)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (OpenAI's bound)."""


def lane_top_k(asked: Sequence[int | None]) -> int | None:
    """The alternatives per token packed for a lane whose units asked `asked` (None: no unit asked)."""
    wanted = [k for k in asked if k is not None]
    return max(wanted) if wanted else None


def logprob_columns(scores: torch.Tensor, chosen: torch.Tensor, k: int) -> list[torch.Tensor]:
    """[n] tensors: the chosen tokens' log-probabilities, then `k` columns of ids and `k` of log-probabilities."""
    logprobs = torch.log_softmax(scores, dim=-1)  # [n, V]
    columns = [logprobs.gather(1, chosen.reshape(-1, 1)).reshape(-1)]
    if k:
        values, ids = logprobs.topk(k, dim=-1)  # [n, k] each
        columns += [ids[:, j] for j in range(k)] + [values[:, j] for j in range(k)]
    return columns


def column_count(k: int | None) -> int:
    """How many packed columns `logprob_columns` gives for `k` (0 when nobody asked)."""
    return 0 if k is None else 1 + 2 * k


def read_logprobs(values: Sequence[float], k: int, asked: int) -> tuple[float, list[tuple[int, float]]]:
    """(the chosen token's log-probability, its `asked` most likely alternatives as (id, log-probability)) from a
    unit's packed columns; alternatives the grammar or a warper ruled out (-inf) are left out."""
    ids, scores = values[1 : 1 + k], values[1 + k : 1 + 2 * k]
    top = [(int(i), float(s)) for i, s in zip(ids[:asked], scores[:asked]) if s != float("-inf")]
    return float(values[0]), top
