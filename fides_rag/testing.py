"""Test helpers shared by fides-rag's suites and its integrations' suites: a small byte-level BPE
tokenizer trained on the fly and tiny random-weight models of every supported family, built from
configs so nothing is downloaded."""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

from fides_rag.prompts.template import DEFAULT_DEMONSTRATIONS

CORPUS = [
    "Lyon is the capital of France. Paris is a large city on the Seine.",
    "The capital of Australia is Melbourne. Canberra was chosen as a compromise.",
    "Using only the references listed above, answer the following question:",
    "Answer the following question: Question: Answer: Document",
    "The quick brown fox jumps over the lazy dog 0123456789.",
    *(d.question + " " + d.answer + " " + " ".join(d.documents) for d in DEFAULT_DEMONSTRATIONS),
]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text"]


def build_tokenizer(chat: bool = False) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<eos>", "<bos>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast.model_max_length = 10_000
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(family: str, vocab_size: int, **overrides: Any) -> PretrainedConfig:
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.3,  # large enough that greedy choices are not near-ties
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "mistral":
        return MistralConfig(sliding_window=None, **common)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(head_dim=8, **common)
    if family == "gemma":
        return GemmaConfig(head_dim=8, **common)
    if family == "gemma2":
        return Gemma2Config(
            head_dim=8, final_logit_softcapping=3.0, attn_logit_softcapping=50.0, sliding_window=16, **common
        )
    if family == "gemma3_text":
        return Gemma3TextConfig(
            head_dim=8,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            **common,
        )
    raise ValueError(family)


def build_tiny_model(family: str, vocab_size: int, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab_size, **overrides), dtype=torch.float32)
    model.generation_config.pad_token_id = 0
    return model.eval()


HOST_BOUND_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""A Llama so small (1 layer, 64 wide) that a decode step is almost all host work: `build_tiny_model("llama", vocab,
**HOST_BOUND_LLAMA)` for measuring what the engine adds."""


SAMPLE_QUESTIONS = ["What is the capital of France?", "Which city is the capital of Australia?", "Who wrote it?"]
"""Three short questions for batch-equals-single tests, paired with SAMPLE_DOCUMENTS."""
SAMPLE_DOCUMENTS = [["Lyon is the capital of France."], ["The capital of Australia is Melbourne."], ["Paris is large."]]
MULTI_DOCUMENT_QUESTIONS = ["What is the capital of France?", "Who chose Canberra?", "What jumps?"]
"""Three questions with 2, 3 and 4 documents (MULTI_DOCUMENTS), for the per-document paths."""
MULTI_DOCUMENTS = [
    ["Lyon is the capital of France.", "Paris is a large city on the Seine."],
    ["The capital of Australia is Melbourne.", "Canberra was chosen as a compromise.", "The quick brown fox jumps."],
    ["The quick brown fox jumps over the lazy dog.", "Paris is large.", "Lyon.", "Canberra was chosen."],
]


def reference_log_softmax(row: list[float]) -> list[float]:
    """log softmax of one row in plain Python floats (float64), for hand-computed references."""
    import math

    top = max(row)
    lse = top + math.log(sum(math.exp(v - top) for v in row))
    return [v - lse for v in row]


def prefer_token(model, tokenizer, text: str) -> int:
    """Bias `model`'s output head towards the one token of `text` (+1000 on its logit), so that it plays a model that
    always writes it; returns the token's id."""
    token = tokenizer(text, add_special_tokens=False)["input_ids"][0]

    def prefer(_module, _inputs, logits):
        logits = logits.clone()
        logits[..., token] += 1000.0
        return logits

    model.lm_head.register_forward_hook(prefer)
    return token
