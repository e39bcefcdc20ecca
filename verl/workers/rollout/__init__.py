from verl.workers.rollout.base import Generation, RolloutEngine, SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.torch_rollout import TorchRollout
from verl.workers.rollout.vllm_rollout import VLLMRollout  # imports vllm only when an engine is built

# actor_rollout_ref.rollout.name -> engine class
ROLLOUT_ENGINES: dict[str, type] = {"hf": HFRollout, "torch": TorchRollout, "vllm": VLLMRollout}

__all__ = ["ROLLOUT_ENGINES", "Generation", "HFRollout", "RolloutEngine", "SamplingParams", "TorchRollout",
           "VLLMRollout"]
