"""Rollout with a decode loop of our own over the model's Hugging Face layers: the default engine.

On a CPU, HF `generate` spends much of a decode step outside the model's arithmetic: its KV cache grows by
`torch.cat` (every step copies the whole cache of every layer), finished rows keep decoding until the last
one ends, SDPA's CPU kernel is slow for one query token, and `torch.multinomial` draws an exponential per
vocabulary entry. This engine runs the same layers with the same weights in a plain loop:
- the K/V of the whole call live in one buffer per layer, allocated once ((B, H, prompt + new tokens, D),
  `SlotCache`); a step writes one column and attends the whole buffer, unwritten columns masked;
- attention stacks the query heads that share a key/value head (`grouped_attention`): one token is two
  batched GEMMs, a prompt one SDPA call, and K/V are never copied per query head;
- rows that finished (EOS, stop string) leave the batch once a quarter of it has, so the remaining steps
  compute only the live rows; stop strings are matched per row on the decoded tail as tokens come;
- identical prompts (a group's first turn) are prefilled once and their rows copied;
- the LM head runs on the last position only, and the sampler (temperature, top-k, top-p as HF orders them,
  then inverse-CDF sampling) works on those (B, V) logits; each sampled token's log-prob is read from the
  same logits (`sampled_log_probs`: temperature only, no top-k / top-p).
Greedy decoding gives HF `generate`'s tokens (tested token for token in fp32), and the prefix reuse across
turns is the HF engine's (`prefix_cache.py`). Llama-family layers only (`SUPPORTED`); other models take
`actor_rollout_ref.rollout.name=hf`.

Pictures: a vision-language model whose language model is one of those and whose picture tokens take plain
positions (Idefics3/SmolVLM, as verl/utils/vlm.py makes) generates from prompts with pictures: the prefill
writes the vision side's features over the image tokens' embeddings, then the loop runs as for text. Such a
call neither uses nor keeps the prefix cache, and prefills every prompt (identical ones included). The Qwen2-VL
family's 3-D positions are not done here: it takes the hf engine.
"""

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from verl.utils.vlm import uses_mrope
from verl.workers.rollout.base import Generation, SamplingParams, sampled_log_probs
from verl.workers.rollout.hf_rollout import CACHE_FIELD, HFRollout, left_padded, stop_ends_in
from verl.workers.rollout.prefix_cache import PrefixCache, take_history

# decoder layers called as layer(hidden, attention_mask, position_embeddings, cache) that keep their K/V in
# the cache they are given and have no per-layer attention variants (sliding windows)
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


def grouped_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0, **kwargs):
    """Attention with the query heads that share a key/value head stacked as the rows of one query, so that
    K and V are read once per key/value head, never copied per query head (HF's `repeat_kv`).

    query (B, Hq, C, D); key, value (B, Hkv, L, D), `SlotCache`'s buffers; attention_mask (B, 1, C, L),
    additive: 0 where a row attends, -inf elsewhere (made once a forward, not in each layer), or None (HF
    generate on an unpadded batch: its causal path). With G = Hq / Hkv, the query becomes (B, Hkv, G * C, D).
    One new token (decode) is two batched GEMMs over B * Hkv, q @ K^T (G x L) then P @ V; a prompt (prefill)
    is SDPA over the stacked query. Measured on CPU against HF's SDPA path (bf16, B 32, Hq 9, Hkv 3, D 64):
    decode at L 700, one core, 1.7 ms against 3.2 ms a layer; prefill of C 100 at L 1100, two cores, 66 ms
    against 120 ms. Returns (B, C, Hq, D), as HF's attention functions do."""
    batch, query_heads, length, dim = query.shape
    if attention_mask is None and length > 1:
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    kv_heads, columns = key.shape[1], key.shape[2]
    groups = query_heads // kv_heads
    if length > 1:
        out = torch.nn.functional.scaled_dot_product_attention(
            query.reshape(batch, kv_heads, groups * length, dim), key, value, scale=scaling,
            attn_mask=attention_mask.repeat(1, 1, groups, 1))  # query row g * C + c is mask row c
        return out.reshape(batch, query_heads, length, dim).transpose(1, 2), None
    q = (query * scaling).reshape(batch * kv_heads, groups, dim)
    keys, values = key.reshape(batch * kv_heads, columns, dim), value.reshape(batch * kv_heads, columns, dim)
    scores = torch.bmm(q, keys.transpose(1, 2)).float()  # (BH, G, L)
    if attention_mask is not None:
        scores.view(batch, query_heads, columns).add_(attention_mask.view(batch, 1, columns))
    probs = scores.softmax(dim=-1).to(values.dtype)
    out = torch.bmm(probs, values)  # (BH, G, D)
    return out.reshape(batch, 1, query_heads, dim), None


AttentionInterface.register("ragen_grouped", grouped_attention)


class SlotCache:
    """The K/V buffers of one call, (B, H, T, D) per layer, T = history + prompt + new tokens: `update` writes
    the new columns at `start` and returns the whole buffers, columns not yet written masked out (a view of
    the written columns would be strided, and every batched GEMM over it would copy it first). The layers call
    it as they would an HF cache."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]):
        self.layers = layers
        self.start = 0  # the column of the first token the next forward feeds

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        end = self.start + keys.shape[2]
        cached_keys, cached_values = self.layers[layer_idx]
        cached_keys[:, :, self.start:end] = keys
        cached_values[:, :, self.start:end] = values
        return cached_keys, cached_values

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.layers = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.layers]


class TorchRollout(HFRollout):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.model.config.get_text_config()  # a vision-language model's language model
        if config.model_type not in SUPPORTED or "sliding_attention" in (getattr(config, "layer_types", None) or []):
            raise ValueError(f"the torch rollout engine runs {', '.join(SUPPORTED)} models without sliding-window "
                             f"layers; this one is {config.model_type!r}: set actor_rollout_ref.rollout.name=hf")
        if uses_mrope(self.model.config):
            raise ValueError("the torch rollout engine does not place pictures on a grid of positions (M-RoPE, the "
                             "Qwen2-VL family): set actor_rollout_ref.rollout.name=hf")
        self.decoder = self.model.get_decoder()
        self.decoder.set_attn_implementation("ragen_grouped")  # the language model only: a vision tower keeps sdpa
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams,
                 images: list[list] | None = None) -> Generation:
        """`images`: each prompt's pictures ((H, W, 3) uint8 arrays), in the order of its image tokens."""
        generator = None if sampling.seed is None else torch.Generator(self.device).manual_seed(sampling.seed)
        max_new = sampling.max_new_tokens
        pictures = images if images is not None and any(images) else None
        if pictures is not None:  # every prompt prefilled with its own pictures, nothing cached
            self._cache, copy_of = None, None
            slots, token_ids, mask, end, logits, fed = self._prefill([list(p) for p in prompt_ids], max_new, pictures)
        else:  # identical prompts (a group's first turn) are prefilled once, then their rows are copied
            unique = {p: i for i, p in enumerate(dict.fromkeys(map(tuple, prompt_ids)))}  # prompt -> its prefill row
            copy_of = torch.tensor([unique[p] for p in map(tuple, prompt_ids)]) \
                if len(unique) < len(prompt_ids) else None
            slots, token_ids, mask, end, logits, fed = self._prefill([list(p) for p in unique], max_new)
        self.last_prompt_tokens = sum(map(len, prompt_ids))
        self.last_reused_tokens = self.last_prompt_tokens - fed  # from the cache or from an identical prompt
        if copy_of is not None:
            slots.keep_rows(copy_of.to(self.device))
            token_ids, mask, logits = token_ids[copy_of], mask[copy_of], logits[copy_of.to(self.device)]

        batch = len(prompt_ids)
        live = torch.arange(batch)  # the batch row of each buffer row
        responses, log_probs, texts = [[] for _ in range(batch)], [[] for _ in range(batch)], [""] * batch
        done = [False] * batch
        lengths = mask[:, :end].sum(1)  # real tokens per row: the next token's position
        prompt_lengths = lengths.clone()
        kept = []  # (tokens, K/V) of finished rows, for the next call's prefix reuse
        for step in range(max_new):
            tokens = self._sample(logits, sampling, generator)  # (live,)
            token_log_probs = sampled_log_probs(logits, tokens, sampling.temperature)  # (live,)
            for row, token, log_prob in zip(live.tolist(), tokens.tolist(), token_log_probs.tolist()):
                if not done[row]:
                    responses[row].append(token)
                    log_probs[row].append(log_prob)
                    done[row] = self._ends(row, token, sampling, texts)
            if all(done) or step == max_new - 1:
                break
            finished = torch.tensor([done[row] for row in live.tolist()])
            if int(finished.sum()) * 4 >= len(live):  # a quarter of the batch is done: drop those rows
                kept += self._keep_rows(slots, finished.nonzero().squeeze(1), live, token_ids, mask,
                                        responses, lengths - prompt_lengths, end)
                rest = (~finished).nonzero().squeeze(1)
                slots.keep_rows(rest.to(self.device))
                live, tokens = live[rest], tokens[rest]
            column = end + step
            token_ids[live, column], mask[live, column] = tokens, True
            logits = self._forward(tokens[:, None], lengths[live, None], self._additive(mask[live][:, None, None]),
                                   slots, column)
            lengths[live] += 1
        kept += self._keep_rows(slots, torch.arange(len(live)), live, token_ids, mask, responses,
                                lengths - prompt_lengths, end)
        if pictures is None and kept and sum(len(tokens) for tokens, _ in kept) * \
                PrefixCache.position_bytes(slots.layers) <= self.prefix_cache_max_bytes:
            self._cache = PrefixCache(*zip(*kept))
        return Generation(responses, log_probs)

    def _prefill(self, prompt_ids: list[list[int]], max_new: int, images: list[list] | None = None):
        """Feed the prompts past their cached prefixes (with `images`: whole, the cache is empty then). Returns
        the K/V buffers (room for `max_new` more columns), the token ids (B, T) and attention mask (B, T) of the
        buffer columns, the first column after the prompts, the last prompt position's logits (B, V) and the
        number of prompt tokens fed."""
        cache, self._cache = self._cache, None  # freed as soon as the rows are selected
        history, history_ids, history_mask, shared = take_history(cache, prompt_ids, decode_room=max_new)
        chunks = [ids[n:] for ids, n in zip(prompt_ids, shared)]  # what the cache does not hold yet
        chunk_ids, chunk_mask = left_padded(chunks, self.tokenizer.pad_token_id)  # (B, C) each
        batch, start, width = len(prompt_ids), history_mask.shape[1], chunk_ids.shape[1]
        total = start + width + max_new
        slots = SlotCache(history or self._empty_buffers(batch, total))
        token_ids = torch.full((batch, total), self.tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
        mask = torch.zeros((batch, total), dtype=torch.bool)  # the positions each row attends
        token_ids[:, :start], mask[:, :start] = history_ids, history_mask.bool()
        token_ids[:, start:start + width], mask[:, start:start + width] = chunk_ids, chunk_mask.bool()
        # the new columns attend the real history and, causally, the real new columns
        end = start + width
        positions = (mask[:, :end].long().cumsum(1) - 1).clamp(min=0)  # (B, T) as in a fresh encoding
        causal = torch.ones((width, total), dtype=torch.bool).tril(diagonal=start)
        attend = mask[:, None, None, :] & causal  # (B, 1, C, T)
        attend[..., torch.arange(width), start + torch.arange(width)] = True  # padding attends itself: no empty rows
        embeddings = self._picture_embeddings(chunk_ids, images) if images is not None else None
        logits = self._forward(token_ids[:, start:end], positions[:, start:], self._additive(attend), slots, start,
                               embeddings)
        return slots, token_ids, mask, end, logits, sum(map(len, chunks))

    def _picture_embeddings(self, input_ids: torch.Tensor, images: list[list]) -> torch.Tensor:
        """(B, C, H) input embeddings of left-padded prompts, each image token's replaced by the vision side's
        feature for it: the model's own vision features and merge (Idefics3's `inputs_merger`, which checks that
        tokens and features match)."""
        input_ids, vlm = input_ids.to(self.device), self.model.model
        features = vlm.get_image_features(**self._pixel_inputs(images, input_ids), return_dict=True).pooler_output
        return vlm.inputs_merger(input_ids, self.decoder.embed_tokens(input_ids), torch.cat(features))  # one a row

    def _forward(self, input_ids, position_ids, attention_mask, slots: SlotCache, start: int,
                 embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """The last position's logits (B, V) for `input_ids` (B, C) fed at columns start..start + C - 1
        (`embeddings`: their input embeddings, when pictures replaced some)."""
        slots.start = start
        hidden = self.decoder.embed_tokens(input_ids.to(self.device)) if embeddings is None else embeddings
        position_ids = position_ids.to(self.device)
        rope = self.decoder.rotary_emb(hidden, position_ids=position_ids)
        attention_mask = attention_mask.to(self.device)
        for layer in self.decoder.layers:
            hidden = layer(hidden, attention_mask=attention_mask, position_ids=position_ids,
                           position_embeddings=rope, **{CACHE_FIELD: slots})
        return self.model.lm_head(self.decoder.norm(hidden[:, -1]))

    def _additive(self, mask: torch.Tensor) -> torch.Tensor:
        """0 where `mask` is set, -inf elsewhere, in the model's dtype (what SDPA takes beside bool masks)."""
        return torch.zeros(mask.shape, dtype=self.dtype).masked_fill_(~mask, float("-inf")).to(self.device)

    def _empty_buffers(self, batch: int, total: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # zeros, not empty: a masked position's weight is exactly 0, and 0 * NaN would still be NaN
        shape = (batch, self.kv_heads, total, self.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in self.decoder.layers]

    def _sample(self, logits: torch.Tensor, sampling: SamplingParams, generator) -> torch.Tensor:
        """One token per row from the (B, V) logits: HF's order, temperature, then top-k, then top-p."""
        scores = logits.float()  # out-of-place below: for fp32 logits this is the caller's tensor
        if sampling.ignore_eos:
            scores = scores.index_fill(1, torch.tensor(self.eos_ids, device=scores.device), float("-inf"))
        if sampling.temperature == 0:
            return scores.argmax(-1).cpu()
        scores = scores / sampling.temperature
        if sampling.top_k > 0:
            kth = scores.topk(min(sampling.top_k, scores.shape[-1])).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if sampling.top_p < 1.0:
            ordered, order = scores.sort(dim=-1)  # ascending
            cumulative = ordered.softmax(-1).cumsum(-1)
            drop = cumulative <= 1 - sampling.top_p
            drop[:, -1] = False  # the most likely token always stays
            scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        # inverse-CDF sampling: a cumsum and a search, where torch.multinomial draws an exponential per
        # vocabulary entry (15 ms a step for 16 rows x 49k on one core); right=True never picks a zero-probability token
        cdf = scores.softmax(-1).cumsum(-1)
        draw = torch.rand((len(cdf), 1), generator=generator, device=cdf.device) * cdf[:, -1:]
        return torch.searchsorted(cdf, draw, right=True).clamp(max=cdf.shape[1] - 1).squeeze(1).cpu()

    def _ends(self, row: int, token: int, sampling: SamplingParams, texts: list[str]) -> bool:
        """Whether `token`, just generated for `row`, ends its response: an EOS, or the end of a stop string."""
        if token in self.eos_ids and not sampling.ignore_eos:
            return True
        if not sampling.stop:
            return False
        piece = self.tokenizer.decode([token])
        texts[row] += piece
        return stop_ends_in(texts[row], piece, sampling.stop)

    def _keep_rows(self, slots: SlotCache, buffer_rows: torch.Tensor, live: torch.Tensor, token_ids: torch.Tensor,
                   mask: torch.Tensor, responses: list[list[int]], fed: torch.Tensor, end: int) -> list:
        """(tokens, K/V) of the given buffer rows for the next call: the prompt and the response tokens that
        were fed (`fed` per batch row; a response's last token is fed only if its row decoded on)."""
        if not self.prefix_cache:
            return []
        kept = []
        for buffer_row in buffer_rows.tolist():
            row = int(live[buffer_row])
            real = mask[row].clone()
            real[end:] = False
            real[end: end + min(int(fed[row]), len(responses[row]))] = True
            kept.append(PrefixCache.row(slots.layers, buffer_row, token_ids[row], real))
        return kept
