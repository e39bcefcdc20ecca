"""Rollout with Hugging Face `generate`: batched, left-padded, KV-cached, available everywhere.

The engine keeps its own copy of the policy in the rollout dtype (bf16 on CPU and GPU), so sampling
runs at bf16 speed while training keeps fp32 master weights; `sync_weights` refreshes the copy after
every update, the same contract a vLLM engine has.
"""

import torch

from verl.utils.model import DTYPES, eos_token_ids, load_causal_lm
from verl.workers.rollout.base import SamplingParams


class HFRollout:
    def __init__(self, model_path: str, tokenizer, dtype: str, device: torch.device):
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = DTYPES[dtype]
        self.model = load_causal_lm(model_path, dtype).to(device).eval()
        self.eos_ids = eos_token_ids(model_path, tokenizer)

    @torch.no_grad()
    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict, strict=True)  # copy_ casts fp32 -> rollout dtype

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[list[int]]:
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        pad_id = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)  # (B, P) left-padded
        attention_mask = torch.zeros_like(input_ids)
        for i, ids in enumerate(prompt_ids):
            input_ids[i, width - len(ids):] = torch.tensor(ids)
            attention_mask[i, width - len(ids):] = 1
        output = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k or None,
            max_new_tokens=sampling.max_new_tokens,
            min_new_tokens=sampling.max_new_tokens if sampling.ignore_eos else None,
            eos_token_id=self.eos_ids,
            pad_token_id=pad_id,
            stop_strings=sampling.stop or None,
            tokenizer=self.tokenizer if sampling.stop else None,
        )
        generated = output[:, width:].tolist()  # (B, <= max_new_tokens), finished rows padded
        return [self._cut(row, sampling.stop) for row in generated]

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

