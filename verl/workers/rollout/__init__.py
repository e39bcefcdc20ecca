import torch

from verl.utils.model import resolve_dtype
from verl.workers.rollout.base import Generation, RolloutEngine, SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.torch_rollout import TorchRollout
from verl.workers.rollout.vllm_rollout import VLLMRollout  # imports vllm only when an engine is built

# actor_rollout_ref.rollout.name -> engine class
ROLLOUT_ENGINES: dict[str, type] = {"hf": HFRollout, "torch": TorchRollout, "vllm": VLLMRollout}


def load_engine(model_path: str, rollout, tokenizer) -> RolloutEngine:
    """A model that plays in this process, no worker around it: the engine `rollout.name` (a RolloutConfig) in
    `rollout.dtype`, on the GPU if there is one."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return ROLLOUT_ENGINES[rollout.name](model_path, tokenizer, resolve_dtype(rollout.dtype), device)


__all__ = ["ROLLOUT_ENGINES", "Generation", "HFRollout", "RolloutEngine", "SamplingParams", "TorchRollout",
           "VLLMRollout", "load_engine"]
