"""Synthetic blocks for depth and width studies (the paper's Table V).

``conv_block``: a stem Conv2d(3, C, 3x3) then ``depth`` x [Conv2d(C, C, 3x3, padding 1, bias)
-> BatchNorm2d(C) -> ReLU]. ``mha_block``: ``depth`` x [fused QKV Linear -> heads -> MatMul ->
Softmax -> MatMul -> output projection -> residual Add -> LayerNorm -> ReLU] on an input of
(batch, sequence length, E).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class ConvBNReLU(nn.Module):
    def __init__(self, width: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(width, width, kernel_size, padding=kernel_size // 2, bias=True)
        self.bn = nn.BatchNorm2d(width)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class ConvBlockStack(nn.Module):
    """A 3-channel stem to ``width`` channels, then ``depth`` Conv-BN-ReLU blocks."""

    def __init__(self, width: int = 64, depth: int = 1, kernel_size: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, kernel_size, padding=kernel_size // 2, bias=True)
        self.blocks = nn.Sequential(*(ConvBNReLU(width, kernel_size) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x))


class MHABlock(nn.Module):
    """Multi-head self-attention written out op by op, so every compiler sees the same
    MatMul / Softmax graph (``nn.MultiheadAttention`` would hide it behind a fused kernel)."""

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"width {embed_dim} is not divisible by heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        # No affine LayerNorm parameters: the paper's Table V counts exactly the QKV and output
        # projections per block (66,048 at E=128), which this matches.
        self.norm = nn.LayerNorm(embed_dim, elementwise_affine=False)
        self.act = nn.ReLU()
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, embed = x.shape
        qkv = self.qkv(x).reshape(batch, seq, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(batch, seq, embed)
        return self.act(self.norm(x + self.proj(out)))


class MHABlockStack(nn.Module):
    def __init__(self, width: int = 128, depth: int = 1, heads: int = 8) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(MHABlock(width, heads) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class HeadsBlock(nn.Module):
    """A shared body and three heads of different shapes: (batch, classes) logits,
    (batch, 4) boxes and a (batch, C, H, W) map. Checks that every compiler returns every
    output, in order (``mlflow_ngraph.models.blocks:heads_block``; ``make gpu-check``)."""

    def __init__(self, width: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.body = ConvBNReLU(3, 3)
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.classes = nn.Linear(width, classes)
        self.boxes = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor):
        feature = torch.relu(self.stem(self.body(x)))
        pooled = feature.mean(dim=(2, 3))
        return self.classes(pooled), torch.sigmoid(self.boxes(pooled)), feature


def heads_block(width: int = 8, classes: int = 5) -> nn.Module:
    """A model with three outputs of different shapes (:class:`HeadsBlock`), input 3x16x16
    by default (``input_shape=3x16x16``)."""
    return HeadsBlock(width, classes)
