"""Adaptive softmax (Grave et al. 2017, "Efficient softmax approximation for GPUs") as an output layer.

The vocabulary, sorted by frequency, is cut into a head of the most frequent words and tail clusters.
The head scores its words and one entry per cluster; cluster i then scores its own words from a
narrower projection of the hidden state (inner width `dims[i]`, shrinking with rarity):

    log p(w) = head_lsm[w]                                   for w < cutoff[0]
    log p(w) = head_lsm[cutoff[0] + i] + tail_i_lsm[w - cutoff[i]]   for cutoff[i] <= w < cutoff[i+1]

`log_probs` computes the whole distribution (what sampling and logprobs need). `greedy` finds its
argmax exactly while scoring only the clusters that could hold it: no word of cluster i can beat
the best word found so far if the cluster's own log-probability is already lower, so most rows
never evaluate the big tails. The engine asks for it for rows of plain greedy requests
(StepBatch.argmax_only, fconv.py's `_scores`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TailCluster(nn.Module):
    def __init__(self, input_dim: int, inner_dim: int, num_words: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, inner_dim, bias=False)
        self.out = nn.Linear(inner_dim, num_words, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.out(self.proj(h)).float(), dim=-1)


class AdaptiveSoftmax(nn.Module):
    def __init__(self, input_dim: int, cutoff: list[int], dims: list[int]):
        """`cutoff`: the first word id of each tail cluster, then the vocabulary size; `dims`: each
        cluster's inner width."""
        super().__init__()
        if len(cutoff) < 2 or any(a >= b for a, b in zip(cutoff, cutoff[1:])) or cutoff[0] < 1:
            raise ValueError(f"adaptive softmax cutoffs must increase from at least 1, not {cutoff}")
        if len(dims) != len(cutoff) - 1:
            raise ValueError(f"{len(cutoff) - 1} tail clusters need as many inner widths, not {dims}")
        self.cutoff = list(cutoff)
        self.head = nn.Linear(input_dim, cutoff[0] + len(dims), bias=False)
        self.tail = nn.ModuleList(TailCluster(input_dim, d, b - a) for d, a, b in zip(dims, cutoff, cutoff[1:]))

    @property
    def vocab_size(self) -> int:
        return self.cutoff[-1]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.log_probs(h)

    def log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states -> (N, V) float32 log-probabilities of every word."""
        head = F.log_softmax(self.head(h).float(), dim=-1)  # (N, cutoff[0] + clusters)
        words = self.cutoff[0]
        tails = (tail(h) for tail in self.tail)
        priors = [head[:, words + i, None] for i in range(len(self.tail))]
        if torch.is_grad_enabled():  # out= is not differentiable
            return torch.cat([head[:, :words], *(t + p for t, p in zip(tails, priors))], dim=-1)
        # Serving writes each part into its columns of one output: at 267k words and 64 rows that is
        # 68 MB, which a concatenation would copy once more (~10% less time on a 2-core CPU).
        out = head.new_empty(h.shape[0], self.vocab_size)
        out[:, :words] = head[:, :words]
        for i, (t, p) in enumerate(zip(tails, priors)):
            torch.add(t, p, out=out[:, self.cutoff[i]:self.cutoff[i + 1]])
        return out

    def greedy(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, D) -> the argmax of `log_probs` per row (N,) and its log-probability (N,), exactly.

        Clusters are visited in id order and replace the best only when strictly better, so ties
        go to the lowest id, as `argmax` over the full distribution does.
        """
        head = F.log_softmax(self.head(h).float(), dim=-1)
        words = self.cutoff[0]
        best, best_id = head[:, :words].max(dim=-1)
        for i, tail in enumerate(self.tail):
            prior = head[:, words + i]
            rows = (prior > best).nonzero().squeeze(1)  # a cluster's words score at most its prior
            if rows.numel() == 0:
                continue
            value, index = (tail(h[rows]) + prior[rows, None]).max(dim=-1)
            better = value > best[rows]
            rows, value, index = rows[better], value[better], index[better]
            best[rows] = value
            best_id[rows] = index + self.cutoff[i]
        return best_id, best
