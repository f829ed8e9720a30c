"""Raw prompts from a framework: chat rendering without a doubled BOS (system turns merged where refused), and
documents trimmed to the window with the note the integrations attach."""

from __future__ import annotations

import pytest

from fides_rag.prompts.raw import fit_documents, leading_bos, merge_system_turns, render_chat, strip_leading_bos


class BosTokenizer:
    """Adds '<s>' when encoding; its chat template writes '<s>' too, and may refuse a system role."""

    bos_token, bos_token_id = "<s>", 1

    def __init__(self, refuse_system: bool = False) -> None:
        self.refuse_system = refuse_system

    def __call__(self, text, add_special_tokens=True):
        ids = [ord(c) for c in text]
        return {"input_ids": [1, *ids] if add_special_tokens else ids}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, turns, tokenize=False, add_generation_prompt=True):
        if self.refuse_system and any(t["role"] == "system" for t in turns):
            raise ValueError("System role not supported")
        return (
            "<s>"
            + "".join(f"[{t['role']}]{t['content']}" for t in turns)
            + ("[assistant]" if add_generation_prompt else "")
        )


def test_bos_written_by_the_template_is_stripped_once():
    tok = BosTokenizer()
    assert leading_bos(tok) == "<s>"
    assert strip_leading_bos(tok, "<s><s>x") == "<s>x" and strip_leading_bos(tok, "x") == "x"
    assert render_chat(tok, [{"role": "user", "content": "Q"}]) == "[user]Q[assistant]"


def test_a_template_refusing_system_gets_it_merged_into_the_next_user_turn():
    turns = [{"role": "system", "content": "Context: Lyon. "}, {"role": "user", "content": "Q?"}]
    assert merge_system_turns(turns) == [{"role": "user", "content": "Context: Lyon.\n\nQ?"}]
    assert render_chat(BosTokenizer(refuse_system=True), turns) == "[user]Context: Lyon.\n\nQ?[assistant]"
    assert merge_system_turns([{"role": "system", "content": "only"}]) == [{"role": "user", "content": "only"}]


def test_documents_that_fit_are_kept_whole():
    fitted = fit_documents({"d": "abc"}, lambda t: f"Q {t['d']}", BosTokenizer(), context_window=20, max_new_tokens=5)
    assert (fitted.rendered, fitted.trimmed, fitted.document_tokens, fitted.notes) == ("Q abc", False, None, [])


def test_documents_over_the_window_are_cut_at_the_tail_with_a_note():
    fitted = fit_documents(
        {"d": "abcdefghij"}, lambda t: f"Q {t['d']}", BosTokenizer(), context_window=12, max_new_tokens=4
    )
    # budget 8 tokens = BOS + "Q " + 5 document characters
    assert fitted.rendered == "Q abcde" and fitted.texts == {"d": "abcde"}
    assert fitted.trimmed and fitted.document_tokens == (10, 5)
    assert fitted.notes == [
        "documents trimmed from 10 to 5 tokens so that the prompt plus max_new_tokens=4 fits the context window of 12"
    ]


def test_a_prompt_that_cannot_fit_without_its_documents_is_an_error():
    with pytest.raises(ValueError, match="does not fit even without its documents"):
        fit_documents({"d": "abc"}, lambda t: "Q" * 20 + t["d"], BosTokenizer(), context_window=10, max_new_tokens=2)
