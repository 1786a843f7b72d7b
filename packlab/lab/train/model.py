"""A small decoder-only transformer that trains on packed THD batches, in plain torch on CPU.

It does what a packed-sequence trainer does with a THD batch (Megatron-core with
``cu_seqlens``, TransformerEngine's THD attention): learned position embeddings indexed by the
batch's ``position_ids`` (which restart at 0 for every sub-sequence), attention causal *within*
each sub-sequence only (a block-diagonal causal mask built from the batch's ``cu_seqlens``),
and a loss averaged over the positions the ``loss_mask`` keeps. ``attention="causal"`` is the
ablation: one causal mask over the whole row, which is what a trainer that ignores
``cu_seqlens`` computes (sub-sequences see the ones packed before them).

Deterministic: the weights are a function of ``ModelConfig.seed`` (initialised under a forked
RNG, so the caller's RNG is untouched), there is no dropout, and :func:`deterministic` turns on
``torch.use_deterministic_algorithms`` with a fixed thread count for the duration of a run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from packlab.errors import PacklabError
from packlab.lab.train.batch import ThdView, attention_mask

ATTENTIONS = ("block_causal", "causal")


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape and seed; ``max_positions`` must cover the longest sub-sequence."""

    vocab_size: int
    max_positions: int
    width: int = 64
    layers: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    seed: int = 0
    attention: str = "block_causal"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTIONS:
            raise PacklabError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.width % self.heads:
            raise PacklabError(f"width {self.width} is not a multiple of heads {self.heads}")
        if self.vocab_size < 2 or self.max_positions < 1:
            raise PacklabError(f"vocab_size {self.vocab_size} and max_positions "
                               f"{self.max_positions} must be positive")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Block(nn.Module):
    """Pre-norm attention and MLP with residuals."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(nn.Linear(config.width, config.mlp_ratio * config.width),
                                 nn.GELU(),
                                 nn.Linear(config.mlp_ratio * config.width, config.width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and an LM head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab_size, config.width)
        self.positions = nn.Embedding(config.max_positions, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size, bias=False)

    def forward(self, view: ThdView) -> torch.Tensor:
        """Logits ``[batch, length, vocab]`` of a normalised THD batch."""
        if int(view.tokens.max()) >= self.config.vocab_size:
            raise PacklabError(f"a token id {int(view.tokens.max())} is outside the model's "
                               f"vocabulary of {self.config.vocab_size}")
        if int(view.position_ids.max()) >= self.config.max_positions:
            raise PacklabError(f"position id {int(view.position_ids.max())} is beyond the "
                               f"model's max_positions {self.config.max_positions}")
        mask = attention_mask(view.segment_ids,
                              block_diagonal=self.config.attention == "block_causal")
        x = self.tokens(view.tokens) + self.positions(view.position_ids)
        for block in self.blocks:
            x = block(x, mask[:, None])
        return self.head(self.norm(x))


def build_model(config: ModelConfig) -> TinyDecoder:
    """The model with weights fixed by ``config.seed`` (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return TinyDecoder(config)


def masked_loss(logits: torch.Tensor, view: ThdView) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the positions ``loss_mask`` keeps, and how many it keeps
    (Megatron's SFT loss: the sum over kept tokens divided by their count)."""
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), view.labels.reshape(-1),
                             reduction="none")
    mask = view.loss_mask.reshape(-1).to(losses.dtype)
    kept = int(view.loss_mask.sum())
    return (losses * mask).sum() / max(kept, 1), kept


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def deterministic(threads: int = 1) -> Iterator[None]:
    """Deterministic algorithms and a fixed intra-op thread count inside the block (the same
    count in every run: a reduction split over another number of threads may round
    differently); both restored on exit."""
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(was_threads)
