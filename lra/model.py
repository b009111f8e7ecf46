"""The LRA classifier every paper uses (docs/facts.md §2), with any registered attention backend.

Token + learned position embeddings (N(0, 0.02)), dropout, ``num_layers`` pre-LayerNorm blocks
(x + Dropout(Attn(LN(x))), x + MLP(LN(x)) with GELU), final LayerNorm, mean pooling over the REAL
tokens (the public code divides by the padded length; ``pooling="padded_mean"`` reproduces that),
then an MLP head (dim -> hidden -> classes, ReLU). Two-document tasks (Retrieval) run one shared
encoder on both documents and classify ``[x1, x2, x1*x2, x1-x2]`` (``interaction="nli"``, the
PyTorch papers' head) or ``[x1, x2]`` (``"concat"``, the JAX LRA default).

The attention kernel always runs in fp32 with autocast off, as in the papers, even when the rest of
the model runs in mixed precision. :func:`build_model` makes the classifier a run spec describes, with
the papers' recomputed attention (:class:`CheckpointedAttention`) where the spec asks for it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import attention
from lra.config import ModelSpec


class MultiHeadAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, head_dim: int, max_len: int, attn_name: str, attn_options: dict):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim)
        self.out = nn.Linear(num_heads * head_dim, dim)
        self.attn = attention.build(attn_name, num_heads=num_heads, head_dim=head_dim, max_len=max_len, **attn_options)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        with torch.autocast(device_type=x.device.type, enabled=False):
            o = self.attn(q.float(), k.float(), v.float(), mask)
        o = o.to(x.dtype).transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)
        return self.out(o)


class Block(nn.Module):
    def __init__(self, dim, hidden, num_heads, head_dim, max_len, dropout, attn_name, attn_options):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.mha = MultiHeadAttention(dim, num_heads, head_dim, max_len, attn_name, attn_options)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim), nn.Dropout(dropout)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        x = x + self.drop(self.mha(self.ln1(x), mask))
        return x + self.mlp(self.ln2(x))


class Encoder(nn.Module):
    def __init__(
        self, vocab_size, seq_len, dim, hidden, num_layers, num_heads, head_dim, dropout, attn_name, attn_options
    ):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(seq_len, dim)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(dim, hidden, num_heads, head_dim, seq_len, dropout, attn_name, attn_options)
            for _ in range(num_layers)
        )
        self.ln = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[-1]
        if n > self.pos.num_embeddings:
            raise ValueError(f"sequence length {n} exceeds the model's seq_len {self.pos.num_embeddings}")
        x = self.drop(self.tok(tokens) + self.pos.weight[:n])
        for blk in self.blocks:
            x = blk(x, mask)
        return self.ln(x)


def pool(x: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(x.dtype)
    if how == "mean":
        return (x * m).sum(1) / m.sum(1).clamp(min=1.0)
    if how == "padded_mean":  # the public code: zero padded positions, divide by the padded length
        return (x * m).mean(1)
    raise ValueError(f"pooling must be 'mean' or 'padded_mean', got {how!r}")


class LRAClassifier(nn.Module):
    """Encoder + mean pooling + MLP head; ``dual=True`` for two-document tasks."""

    def __init__(
        self,
        *,
        vocab_size: int,
        seq_len: int,
        num_classes: int,
        attn_name: str,
        attn_options: dict | None = None,
        dim: int = 64,
        hidden: int = 128,
        num_layers: int = 2,
        num_heads: int = 2,
        head_dim: int = 32,
        dropout: float = 0.1,
        head_hidden: int = 128,
        pooling: str = "mean",
        dual: bool = False,
        interaction: str = "nli",
    ):
        super().__init__()
        if pooling not in ("mean", "padded_mean"):
            raise ValueError(f"model.pooling must be 'mean' or 'padded_mean', got {pooling!r}")
        if interaction not in ("nli", "concat"):
            raise ValueError(f"model.interaction must be 'nli' or 'concat', got {interaction!r}")
        self.pooling, self.dual, self.interaction = pooling, dual, interaction
        self.encoder = Encoder(
            vocab_size,
            seq_len,
            dim,
            hidden,
            num_layers,
            num_heads,
            head_dim,
            dropout,
            attn_name,
            dict(attn_options or {}),
        )
        feat = dim * (4 if interaction == "nli" else 2) if dual else dim
        self.head = nn.Sequential(nn.Linear(feat, head_hidden), nn.ReLU(), nn.Linear(head_hidden, num_classes))

    def embed(self, tokens, mask):
        return pool(self.encoder(tokens, mask), mask, self.pooling)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not self.dual:
            return self.head(self.embed(tokens, mask))
        b = tokens.shape[0]
        both = self.embed(tokens.flatten(0, 1), mask.flatten(0, 1)).view(b, 2, -1)  # one pass, shared weights
        x1, x2 = both[:, 0], both[:, 1]
        feats = [x1, x2, x1 * x2, x1 - x2] if self.interaction == "nli" else [x1, x2]
        return self.head(torch.cat(feats, dim=-1))


def loss_and_correct(logits: torch.Tensor, labels: torch.Tensor):
    loss = F.cross_entropy(logits.float(), labels)
    return loss, (logits.argmax(-1) == labels).sum()


class CheckpointedAttention(nn.Module):
    """Recomputes the wrapped attention in backward (``torch.utils.checkpoint``, RNG state preserved,
    so dropout draws the same mask twice and results equal the unwrapped module's): the papers'
    softmax baseline keeps no n x n matrix for backward."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, q, k, v, mask=None):
        if self.training and torch.is_grad_enabled():
            return checkpoint(self.inner, q, k, v, mask, use_reentrant=False)
        return self.inner(q, k, v, mask)


def checkpoint_attention(model: nn.Module) -> nn.Module:
    """Wrap every attention backend of an ``LRAClassifier`` in :class:`CheckpointedAttention`."""
    for m in model.modules():
        if isinstance(m, MultiHeadAttention) and not isinstance(m.attn, CheckpointedAttention):
            m.attn = CheckpointedAttention(m.attn)
    return model


def build_model(spec: ModelSpec) -> LRAClassifier:
    """The classifier ``spec`` describes (attention recomputed in backward where it says so)."""
    model = LRAClassifier(**spec.kwargs())
    return checkpoint_attention(model) if spec.attn.checkpointing else model
