"""Prefix reuse between `generate` calls (automatic, like vLLM's prefix caching), shared by the HF engines.

In a multi-turn rollout each turn's prompt is the previous prompt + the kept response + new environment
tokens. After every call an engine keeps each row's K/V (`PrefixCache`); the next call matches each prompt to
the cached row sharing its longest prefix and feeds only the rest, so every turn prefills its new tokens
instead of the whole history. Matching is by token ids alone, so rows may drop out or change order between
calls. The cached history and the new chunk are joined by the attention mask, and position ids are derived
from it (cumsum - 1), so they equal those of a fresh encoding whatever the holes in between.
"""

import torch

NO_TOKEN = -1  # fills the token-id matrix past the end of a cached row

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values)


class PrefixCache:
    """Row i holds the K/V of exactly its token ids `tokens[i]`: per layer (H, n_i, D) keys and values.

    The K/V carry RoPE of their positions in a fresh encoding (0..n_i - 1), so moving them is exact.
    """

    def __init__(self, tokens: list[torch.Tensor], layers: list[KV]):
        self.layers = layers  # per row, per layer (keys, values), each (H, n_i, D)
        self.tokens = torch.full((len(tokens), max(len(t) for t in tokens)), NO_TOKEN, dtype=torch.long)  # (B, W)
        for i, row in enumerate(tokens):
            self.tokens[i, : len(row)] = row

    @staticmethod
    def row(layers: KV, i: int, token_ids: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, KV]:
        """Row i of the (B, H, T, D) K/V `layers` at the positions where `real` (T,) is set, in order, with
        its token ids `token_ids` (T,) there.

        index_select copies whole (D,) vectors, ~10x faster on CPU than a gather over (B, H, T, D)."""
        keep = real.nonzero().squeeze(1)
        device_keep = keep.to(layers[0][0].device)
        return token_ids[keep], [(k[i].index_select(1, device_keep), v[i].index_select(1, device_keep))
                                 for k, v in layers]

    @staticmethod
    def position_bytes(layers: KV) -> int:
        """K and V of one row at one position, over all layers."""
        return sum(2 * k[0, :, 0].numel() * k.element_size() for k, _ in layers)

    def match(self, prompt_ids: list[list[int]]) -> tuple[list[int], list[int]]:
        """(rows, shared): for each prompt the cached row to continue from and how many of its tokens to reuse.

        The batch is `max(shared)` cached columns then C new ones, C set by the row with the most new tokens.
        A row that would reach past the longest prompt reuses less and feeds more (in what would be padding),
        so the batch is no wider than the longest prompt and decoding attends no more columns than without
        reuse. At least each prompt's last token is left to feed: its logits start the generation.
        """
        matches = [self._longest_prefix(ids) for ids in prompt_ids]
        new_columns = max(len(ids) - n for ids, (_, n) in zip(prompt_ids, matches))
        history_columns = max(map(len, prompt_ids)) - new_columns
        return [row for row, _ in matches], [min(n, history_columns) for _, n in matches]

    def _longest_prefix(self, prompt: list[int]) -> tuple[int, int]:
        n = min(len(prompt) - 1, self.tokens.shape[1])
        same = self.tokens[:, :n] == torch.tensor(prompt[:n])  # (B, n)
        shared = same.int().cumprod(dim=1).sum(dim=1)  # (B,) length of the common prefix per row
        row = int(shared.argmax())
        return row, int(shared[row])

    def select(self, rows: list[int], shared: list[int],
               extra_columns: int = 0) -> tuple[KV, torch.Tensor, torch.Tensor]:
        """The K/V of the given rows cut to their shared prefix, left-aligned in (B, H, W + extra_columns, D)
        zeros (W = max(shared)), their token ids (B, W) and the mask (B, W) of the positions each row attends."""
        width = max(shared)
        tokens = self.tokens[torch.tensor(rows), :width]  # (B, W)
        mask = (torch.arange(width)[None, :] < torch.tensor(shared)[:, None]).long()  # (B, W)
        out = []
        for layer, (k, v) in enumerate(self.layers[rows[0]]):
            shape = (len(rows), k.shape[0], width + extra_columns, k.shape[2])
            keys, values = k.new_zeros(shape), v.new_zeros(shape)
            for i, (row, n) in enumerate(zip(rows, shared)):
                keys[i, :, :n], values[i, :, :n] = self.layers[row][layer][0][:, :n], self.layers[row][layer][1][:, :n]
            out.append((keys, values))
        return out, tokens, mask


def take_history(cache: PrefixCache | None, prompt_ids: list[list[int]], decode_room: int | None = None
                 ) -> tuple[KV | None, torch.Tensor, torch.Tensor, list[int]]:
    """The cached K/V to continue each prompt from: (K/V or None, token ids (B, H), mask (B, H), shared).

    The K/V hold the H history columns; with `decode_room`, they also have room (zeros) for the new prompt
    columns and `decode_room` generated ones. A prompt without a cached prefix gets an all-zero mask; if no
    prompt has one (or there is no cache), the batch starts fresh (H = 0)."""
    rows, shared = cache.match(prompt_ids) if cache is not None else ([], [])
    if not any(shared):
        empty = torch.zeros((len(prompt_ids), 0), dtype=torch.long)
        return None, empty, empty, [0] * len(prompt_ids)
    new_columns = max(len(ids) - n for ids, n in zip(prompt_ids, shared))
    return *cache.select(rows, shared, 0 if decode_room is None else new_columns + decode_room), shared
