import torch

from fides_rag import ContrastRule, FidesDecoder, load_model, register_method
from fides_rag.rules import StepInputs, StepOutput
from fides_rag.rules.base import CONTEXT, NO_CONTEXT
from fides_rag.method.signals import contrast_logits, opposition


@register_method("capped-adacad")
class CappedAdaCad(ContrastRule):
    """CAD with a_t = min(cap, 2·JSD(p_ctx, p_noctx)): stronger than AdaCAD, never above `cap`."""

    paths = (CONTEXT, NO_CONTEXT)  # the decoder runs exactly these paths, in one batched forward per step

    def __init__(self, cap: float = 1.0) -> None:
        self.cap = float(cap)

    def combine(self, step: StepInputs) -> StepOutput:  # on the device: no .item(), no host sync
        jsd = opposition(step.ctx_logits, step.no_ctx_logits)  # [B]
        alpha = torch.clamp(2 * jsd, max=self.cap)  # [B]
        return StepOutput(contrast_logits(step.ctx_logits, step.no_ctx_logits, alpha), records={"alpha": alpha, "jsd": jsd})

    def options(self) -> dict:
        return {"cap": self.cap}


model, tokenizer = load_model("smollm2-135m-instruct")
decoder = FidesDecoder(model, tokenizer, max_new_tokens=8)
result = decoder.generate("Where is the Eiffel Tower?", ["The Eiffel Tower is in Rome, Italy."], method="capped-adacad")
print(result.text, result.method_options, [round(s.values["jsd"], 3) for s in result.steps])
