"""DynamicDotGAT: socio-temporal graph attention over agents who each see a few columns of X.

Two implementations of one function over one set of parameters:

- :class:`NaiveDotGAT`: the model as it reads, ``[B, T, A, H]`` layout,
  per-agent weights applied by einsum, separate Q, K and V products,
  attention written out (scores, mask, softmax, weighted sum);
- :class:`OptimizedDotGAT`: agent-major ``[A, B*T, H]`` layout, so every
  per-agent product is one batched matmul (``bmm``/``baddbmm``) on
  contiguous memory, Q, K and V from one fused product,
  ``scaled_dot_product_attention`` for the causal attention over time, and
  the social attention over 20 agents written out for the compiler to fuse.

Both hold the same parameters (:class:`DotGATParameters`): the fused
``[A, H, 3H]`` QKV weight is stored once and the naive model slices it,
so a state dict moves between them unchanged and the equivalence test
compares outputs and gradients directly.

The model: agent ``a`` sees the columns ``mask[a]`` of ``X[B, T, M]``
(a random fraction rho, at least one), embeds them with its own
``W_embed[a]`` and an RMSNorm, then runs ``message_steps`` pre-norm
residual blocks of (1) causal attention over time, per agent, (2) social
attention across agents at each time step, restricted to a fixed ring or
small-world graph with self-loops, plus a learnable bias per edge and head
(-inf off the graph), (3) a per-agent MLP H -> H -> H with SiLU; a final
RMSNorm and a per-agent head give ``y[B, T, A, y_dim]``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from core.validation import check_choice
from plugins.ml.dotgat.config import DotGATConfig, column_masks, social_graph

__all__ = ["DotGATConfig", "DotGATParameters", "NaiveDotGAT", "OptimizedDotGAT", "build"]

class DotGATParameters(nn.Module):
    """The parameters both implementations share (per agent, leading axis A), and the fixed structure."""

    def __init__(self, config: DotGATConfig):
        super().__init__()
        self.config = config
        A, M, H, S, heads = config.A, config.M, config.H, config.message_steps, config.heads
        self.register_buffer("mask", torch.from_numpy(column_masks(config)))
        self.register_buffer("adjacency", torch.from_numpy(social_graph(config)))
        self.W_embed = nn.Parameter(torch.empty(A, M, H))
        self.g_embed = nn.Parameter(torch.ones(A, H))
        self.g_time = nn.Parameter(torch.ones(S, A, H))
        self.W_qkv_time = nn.Parameter(torch.empty(S, A, H, 3 * H))
        self.W_out_time = nn.Parameter(torch.empty(S, A, H, H))
        self.g_social = nn.Parameter(torch.ones(S, A, H))
        self.W_qkv_social = nn.Parameter(torch.empty(S, A, H, 3 * H))
        self.W_out_social = nn.Parameter(torch.empty(S, A, H, H))
        self.edge_bias = nn.Parameter(torch.zeros(S, heads, A, A))
        self.g_mlp = nn.Parameter(torch.ones(S, A, H))
        self.W_mlp1 = nn.Parameter(torch.empty(S, A, H, H))
        self.b_mlp1 = nn.Parameter(torch.zeros(S, A, H))
        self.W_mlp2 = nn.Parameter(torch.empty(S, A, H, H))
        self.b_mlp2 = nn.Parameter(torch.zeros(S, A, H))
        self.g_head = nn.Parameter(torch.ones(A, H))
        self.W_head = nn.Parameter(torch.empty(A, H, config.y_dim))
        self.b_head = nn.Parameter(torch.zeros(A, config.y_dim))
        self.eps = 1e-6
        self.reset_parameters(config.structure_seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = 0) -> None:
        """Seeded initialisation, in place (a compiled model keeps its graphs): fan-in scaled normals.

        Residual branch outputs are scaled by 1/sqrt(2 * message_steps), so
        the residual stream's variance stays put through the blocks.
        """
        generator = torch.Generator().manual_seed(0 if seed is None else int(seed))
        branch = 1.0 / math.sqrt(2 * self.config.message_steps)
        seen = max(1.0, float(self.mask.sum(1).mean()))
        scales = {"W_embed": 1 / math.sqrt(seen), "W_qkv_time": 1.0, "W_qkv_social": 1.0, "W_mlp1": 1.0,
                  "W_out_time": branch, "W_out_social": branch, "W_mlp2": branch, "W_head": 0.1}
        for name, parameter in self.named_parameters():
            if name in scales:
                fan_in = parameter.shape[-2] if name != "W_embed" else 1.0
                std = scales[name] / math.sqrt(fan_in)
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
            elif name.startswith("g_"):
                parameter.fill_(1.0)
            else:
                parameter.zero_()

    def social_bias(self, step: int) -> torch.Tensor:
        """``[heads, A, A]``: the learnable edge bias on the graph, -inf off it (self-loops keep every row finite)."""
        return self.edge_bias[step].masked_fill(~self.adjacency, float("-inf"))

    def rms(self, h: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * gain


class NaiveDotGAT(DotGATParameters):
    """The straightforward implementation: ``[B, T, A, H]``, einsum per agent, separate Q, K, V, explicit softmax."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        B, T = x.shape[0], x.shape[1]
        H, heads, d = c.H, c.heads, c.head_dim
        seen = x[:, :, None, :] * self.mask  # [B, T, A, M]: what each agent sees
        h = self.rms(torch.einsum("btam,amh->btah", seen, self.W_embed), self.g_embed)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        for s in range(c.message_steps):
            # (1) causal memory attention over time, per agent
            z = self.rms(h, self.g_time[s])
            q, k, v = (torch.einsum("btah,ahd->btad", z, self.W_qkv_time[s][..., i * H:(i + 1) * H])
                       .reshape(B, T, c.A, heads, d).permute(0, 2, 3, 1, 4) for i in range(3))  # [B, A, heads, T, d]
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
            attention = scores.masked_fill(causal, float("-inf")).softmax(-1)
            o = (attention @ v).permute(0, 3, 1, 2, 4).reshape(B, T, c.A, H)
            h = h + torch.einsum("btah,ahd->btad", o, self.W_out_time[s])
            # (2) social attention across agents at each time step, on the graph
            z = self.rms(h, self.g_social[s])
            q, k, v = (torch.einsum("btah,ahd->btad", z, self.W_qkv_social[s][..., i * H:(i + 1) * H])
                       .reshape(B, T, c.A, heads, d).permute(0, 1, 3, 2, 4) for i in range(3))  # [B, T, heads, A, d]
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d) + self.social_bias(s)
            o = (scores.softmax(-1) @ v).permute(0, 1, 3, 2, 4).reshape(B, T, c.A, H)
            h = h + torch.einsum("btah,ahd->btad", o, self.W_out_social[s])
            # (3) per-agent MLP
            z = self.rms(h, self.g_mlp[s])
            hidden = F.silu(torch.einsum("btah,ahd->btad", z, self.W_mlp1[s]) + self.b_mlp1[s])
            h = h + torch.einsum("btah,ahd->btad", hidden, self.W_mlp2[s]) + self.b_mlp2[s]
        return torch.einsum("btah,ahy->btay", self.rms(h, self.g_head), self.W_head) + self.b_head


class OptimizedDotGAT(DotGATParameters):
    """Agent-major ``[A, B*T, H]``: one bmm per per-agent product, fused QKV, SDPA over time, fused social softmax."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.config
        B, T = x.shape[0], x.shape[1]
        A, H, heads, d = c.A, c.H, c.heads, c.head_dim
        N = B * T
        # masking the weights instead of the input: [N, M] @ [A, M, H] without an [A, N, M] copy of X
        h = self.rms(torch.matmul(x.reshape(1, N, c.M), self.mask[:, :, None] * self.W_embed),
                     self.g_embed[:, None])  # [A, N, H]
        for s in range(c.message_steps):
            z = self.rms(h, self.g_time[s][:, None])
            qkv = torch.bmm(z, self.W_qkv_time[s]).view(A, B, T, 3, heads, d).permute(3, 0, 1, 4, 2, 5)
            q, k, v = (t.reshape(A * B, heads, T, d) for t in qkv)
            o = self.temporal(q, k, v)  # [A*B, heads, T, d]
            o = o.view(A, B, heads, T, d).permute(0, 1, 3, 2, 4).reshape(A, N, H)
            h = torch.baddbmm(h, o, self.W_out_time[s])
            z = self.rms(h, self.g_social[s][:, None])
            qkv = torch.bmm(z, self.W_qkv_social[s]).view(A, N, 3, heads, d).permute(2, 1, 3, 0, 4)
            o = self.social(qkv, s)  # [N, heads, A, d]
            h = torch.baddbmm(h, o.permute(2, 0, 1, 3).reshape(A, N, H), self.W_out_social[s])
            z = self.rms(h, self.g_mlp[s][:, None])
            hidden = F.silu(torch.baddbmm(self.b_mlp1[s][:, None], z, self.W_mlp1[s]))
            h = torch.baddbmm(h + self.b_mlp2[s][:, None], hidden, self.W_mlp2[s])
        y = torch.baddbmm(self.b_head[:, None], self.rms(h, self.g_head[:, None]), self.W_head)  # [A, N, y_dim]
        return y.view(A, B, T, c.y_dim).permute(1, 2, 0, 3)

    def temporal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over time, ``[A*B, heads, T, d]``: SDPA's flash kernels."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def social(self, qkv: torch.Tensor, step: int) -> torch.Tensor:
        """Attention across agents on the graph, ``qkv`` ``[3, N, heads, A, d]`` -> ``[N, heads, A, d]``.

        Written out, not SDPA: with a learnable additive mask SDPA runs the
        memory-efficient kernel, whose 64-wide tiles over 20 agents took a
        third of the compiled bf16 step on an H100 (docs/ml.md); written out,
        Inductor fuses scale, bias and softmax around two small batched matmuls.
        """
        scores = (qkv[0] @ qkv[1].transpose(-1, -2)) * (1.0 / math.sqrt(qkv.shape[-1])) + self.social_bias(step)
        return scores.softmax(-1) @ qkv[2]


MODELS = {"naive": NaiveDotGAT, "optimized": OptimizedDotGAT}


def build(config: DotGATConfig, implementation: str = "optimized") -> DotGATParameters:
    """A fresh model of either implementation (``naive`` or ``optimized``)."""
    return MODELS[check_choice("implementation", implementation, tuple(MODELS))](config)
