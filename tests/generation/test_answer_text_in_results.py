"""The decoder's own results and streams are cut of what is not the answer (a copied document label, a <tool_call>
wrapper, the next turn's role line), with a note; the generated tokens stay as they were."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from fides_rag import FidesDecoder, PromptPair

DOC = "The Eiffel Tower is in Rome."


class Writes(LogitsProcessor):
    """Makes the model write `text`, then end its turn (one per request)."""

    def __init__(self, tokenizer, text: str) -> None:
        self.ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        self.start = None

    def __call__(self, input_ids, scores):
        self.start = input_ids.shape[-1] if self.start is None else self.start
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.ids[min(input_ids.shape[-1] - self.start, len(self.ids) - 1)]] = 0
        return forced


@pytest.fixture(scope="module")
def decoder(tiny_llama, tokenizer):
    return FidesDecoder(tiny_llama, tokenizer, max_new_tokens=24)


def _writes(decoder, text):
    return LogitsProcessorList([Writes(decoder.tokenizer, text)])


def test_a_copied_label_is_cut_from_the_result_and_the_stream(decoder):
    result = decoder.generate("Where is it?", [DOC], logits_processor=_writes(decoder, "Document [1]: Rome"))
    assert result.text == "Rome"
    assert decoder.decode_text(result.token_ids).startswith("Document [1]: Rome")  # the tokens as generated
    assert "removed the template leftover 'Document [1]:' from the start of the answer" in result.notes
    stream = decoder.stream("Where is it?", [DOC], logits_processor=_writes(decoder, "Document [1]: Rome"))
    assert "".join(stream) == stream.result.text == "Rome"


@pytest.mark.parametrize("written, answer", [("Rome.\nUser", "Rome."), ("<tool_call>Rome</tool_call>", "Rome")])
def test_markup_and_role_lines_are_cut_from_prompt_pair_answers(decoder, written, answer):
    pair = PromptPair(context=f"{DOC}\nWhere is it?\n", no_context="Where is it?\n")
    result = decoder.generate(pair, method="cad", logits_processor=_writes(decoder, written))
    assert result.text == answer and result.notes
    stream = decoder.stream(pair, method="cad", logits_processor=_writes(decoder, written))
    assert "".join(stream) == stream.result.text == answer


def test_a_structured_answer_is_never_cut(decoder):
    result = decoder.generate("Where is it?", [DOC], regex=r"<tool_call>[a-z]{2}", max_new_tokens=16)
    assert result.text.startswith("<tool_call>")
