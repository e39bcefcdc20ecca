from verl.workers.rollout.base import RolloutEngine, SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

# actor_rollout_ref.rollout.name -> engine class
ROLLOUT_ENGINES: dict[str, type] = {"hf": HFRollout}

__all__ = ["ROLLOUT_ENGINES", "HFRollout", "RolloutEngine", "SamplingParams"]
