"""A FidesConfig file (e.g. from `fides-rag calibrate`) reaches the FIDES rule through `fides_config`."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler

from fides_rag import FidesConfig
from langchain_fides import ChatFides, FidesLLM


class Infos(BaseCallbackHandler):
    def __init__(self) -> None:
        self.infos: list[dict[str, Any]] = []

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        self.infos.append(response.generations[0][0].generation_info)


def test_config_file_as_field_and_per_call(decoder, tmp_path):
    path = FidesConfig(fixed_alpha=0.7, shift_scale=2.5, source={"model": "tiny"}).to_file(tmp_path / "calibrated.json")
    cap = Infos()
    llm = FidesLLM(decoder=decoder, fides_config=FidesConfig.from_file(path), max_new_tokens=4)
    llm.invoke("Q?", documents=["Lyon is the capital of France."], config={"callbacks": [cap]})
    plain = FidesLLM(decoder=decoder, max_new_tokens=4)
    plain.invoke(
        "Q?",
        documents=["Lyon is the capital of France."],
        fides_config=FidesConfig.from_file(path),
        config={"callbacks": [cap]},
    )
    chat = ChatFides(decoder=decoder, fides_config=FidesConfig.from_file(path), max_new_tokens=4)
    chat.invoke("Q?", documents=["Lyon is the capital of France."], config={"callbacks": [cap]})
    assert len(cap.infos) == 3
    for info in cap.infos:
        assert info["method"] == "fides" and info["alphas"]
        assert info["alphas"] == pytest.approx([0.7] * len(info["alphas"]))
