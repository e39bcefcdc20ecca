"""Template collapse (RAGEN-2, Wang et al. 2026): replies that still look diverse but no longer depend on the input.

Entropy cannot see it: a policy that writes varied but input-agnostic reasoning keeps its entropy. RAGEN-2
measures instead the mutual information I(X; Z) between the inputs X and the replies Z, with X uniform over the
batch's distinct inputs, by cross-scoring: every sampled reply z_j is scored teacher-forced under every input x_i,

    L[i, j] = log p(z_j | x_i)                                       (M inputs, N replies)
    I(X; Z) ~= mean_j [ L[a(j), j] - log mean_i exp L[i, j] ]        a(j): the input z_j was sampled for

which is at most log M: the reply names its input (no other input makes it likely), against 0: every input makes
it equally likely. Retrieval accuracy, how often argmax_i L[i, j] is a(j), falls to the chance 1 / M likewise.

Here an input is a group's first prompt (its trajectories share one start state): its tokens and, for a
vision-language policy, its pictures, with which every reply is scored under it (a picture-only state's tokens are
the same for every board). A reply is the first turn's generated tokens: later turns' prompts hold the replies
before them, which would leak the input. A batch with fewer than 2 distinct first prompts (e.g. one start state
for all) has nothing to tell apart: no metric.
"""

import math

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.vlm import PIXEL_KEYS, row_pictures, stack_pictures


def cross_scoring_pairs(batch: DataProto, inputs: int, replies: int) -> tuple[DataProto, np.ndarray] | None:
    """The rows to score: prompt_i + reply_j for every picked input i and reply j, row i * N + j, right-padded,
    `loss_mask` 1 on the reply's tokens; and a(j), the input index of each reply (N,).

    Picks, in batch order, up to `inputs` groups whose first prompts (the tokens before the first generated
    one, and their pictures) differ, and up to `replies` trajectories of each. None when fewer than 2 distinct
    prompts exist. With pictures each row gets its prompt's (`verl.utils.vlm.row_pictures`)."""
    prompts, pictures, first_replies, own_input = first_prompts_and_replies(batch, inputs, replies)
    if len(prompts) < 2:
        return None
    pairs = [(prompt, reply) for prompt in prompts for reply in first_replies]
    width = max(len(prompt) + len(reply) for prompt, reply in pairs)
    input_ids = torch.zeros((len(pairs), width), dtype=torch.long)  # (M * N, T); padding is masked out
    attention_mask, loss_mask = torch.zeros_like(input_ids), torch.zeros((len(pairs), width), dtype=torch.float32)
    for row, (prompt, reply) in enumerate(pairs):
        n = len(prompt) + len(reply)
        input_ids[row, :n] = torch.cat([prompt, reply])
        attention_mask[row, :n] = 1
        loss_mask[row, len(prompt):n] = 1
    position_ids = torch.arange(width) * attention_mask  # (M * N, T): 0, 1, ... on the tokens, 0 on padding
    tensors = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
               "loss_mask": loss_mask}
    if pictures[0]:
        tensors |= stack_pictures([shown for shown in pictures for _ in first_replies])
    return DataProto(batch=tensors), np.array(own_input)


def first_prompts_and_replies(batch: DataProto, inputs: int, replies: int) -> tuple[
        list[torch.Tensor], list[dict[str, torch.Tensor]], list[torch.Tensor], list[int]]:
    """Up to `inputs` distinct first prompts (M, each (P_i,)) with their pictures' pixel inputs (M, {} without
    pictures), up to `replies` first replies of each (N, each (R_j,)) and each reply's prompt index a(j) (N,).
    A trajectory without generated tokens is skipped."""
    input_ids, loss_mask, turn_ids = batch.batch["input_ids"], batch.batch["loss_mask"].bool(), batch.batch["turn_ids"]
    group_ids = batch.non_tensor_batch["group_ids"]
    pixels = {key: batch.batch[key] for key in PIXEL_KEYS if key in batch.batch}
    prompts, pictures, first_replies, own_input = [], [], [], []
    for group in dict.fromkeys(group_ids.tolist()):  # groups in batch order
        rows = [b for b in np.flatnonzero(group_ids == group) if loss_mask[b].any()]
        if not rows:
            continue
        first = rows[0]
        prompt = input_ids[first, :int(loss_mask[first].nonzero()[0])]  # the group's start state
        shown = row_pictures(pixels, first, int((batch.batch["picture_turns"][first] == 0).sum())) if pixels else {}
        if any(torch.equal(prompt, seen) and all(torch.equal(shown[k], other[k]) for k in shown)
               for seen, other in zip(prompts, pictures)):
            continue
        prompts.append(prompt)
        pictures.append(shown)
        for b in rows[:replies]:
            first_turn = turn_ids[b, loss_mask[b].nonzero()[0]]
            first_replies.append(input_ids[b][loss_mask[b] & (turn_ids[b] == first_turn)])
            own_input.append(len(prompts) - 1)
        if len(prompts) == inputs:
            break
    return prompts, pictures, first_replies, own_input


def repeat_to_multiple(data: DataProto, multiple: int) -> DataProto:
    """`data` with its last row repeated until the row count is a multiple of `multiple`: a data-parallel call
    gives every rank an equal share, so no rank runs a forward (an FSDP collective) the others do not."""
    index = np.arange(len(data))
    return data[np.concatenate([index, np.full(-len(data) % multiple, len(data) - 1)])]


def score_matrix(log_probs: torch.Tensor, loss_mask: torch.Tensor, num_replies: int) -> torch.Tensor:
    """L (M, N): each row's log-prob summed over its reply tokens (rows i * N + j, from `cross_scoring_pairs`)."""
    return (log_probs * loss_mask).sum(-1).view(-1, num_replies)


def collapse_metrics(scores: torch.Tensor, own_input: np.ndarray) -> dict[str, float]:
    """The mutual-information estimate and retrieval accuracy from L (M, N) and a(j) (N,). Exact ties in a
    column share the hit, so replies that every input scores alike retrieve at chance, not at the first input."""
    num_inputs, num_replies = scores.shape
    scores = scores.double()
    own = torch.as_tensor(own_input)
    own_scores = scores[own, torch.arange(num_replies)]  # (N,) L[a(j), j]
    marginal = torch.logsumexp(scores, dim=0) - math.log(num_inputs)  # (N,) log mean_i exp L[i, j]
    best = scores == scores.max(dim=0).values  # (M, N)
    hits = best[own, torch.arange(num_replies)] / best.sum(dim=0)  # (N,)
    return {"collapse/mi": (own_scores - marginal).mean().item(), "collapse/mi_ceiling": math.log(num_inputs),
            "collapse/retrieval_acc": hits.mean().item(), "collapse/retrieval_chance": 1 / num_inputs}
