"""Incremental detokenisation gives, token by token, exactly the text of decoding the whole answer."""

from __future__ import annotations

import random

import pytest

from fides_rag import load_model
from fides_rag.generation.detokenize import IncrementalText


def check_incremental_equals_whole(tokenizer, sequences) -> None:
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)  # noqa: E731
    for ids in sequences:
        text = IncrementalText(decode)
        pushed = "".join(text.push(i) for i in ids)
        whole = decode(ids)
        assert text.text == pushed
        assert whole.startswith(text.text) and (whole == text.text or whole[len(text.text) :].endswith("\ufffd")), (
            ids,
            whole,
            text.text,
        )


def sequences(tokenizer, seed: int):
    rng = random.Random(seed)
    sentences = [
        "The Eiffel Tower is in Rome, Italy.",
        "Ünïcödé → ✓ 東京 🚀 naïve café",
        "  spaced   out\n\nlines\t tab",
        "Answer: Lyon<|im_end|> Document [2]:",
    ]
    texts = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in sentences]
    randoms = [[rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    return texts + randoms


def test_tiny_tokenizer(tokenizer):
    check_incremental_equals_whole(tokenizer, sequences(tokenizer, 0))


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["smollm2-135m-instruct", "gemma3-270m"])
def test_real_tokenizers(alias):
    _, tokenizer = load_model(alias)
    check_incremental_equals_whole(tokenizer, sequences(tokenizer, 1))
