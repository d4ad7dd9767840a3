"""model.py — Muse Glimmer (SPEC §1) in PyTorch, scaled down. Written from the SPEC, independent
of muser's C code, so it can judge it.

  h = rmsnorm(embed[t], ones, eps)                         weightless entry norm
  per layer: a = rmsnorm(h, attn_norm); q,k,v,g = Wq a, Wk a, Wv a, Wgate a
             per-head QK-norm; RoPE (NORM pairing, SWA layers only; FULL layers l%4==3 are NoPE)
             softmax(q.k / sqrt(D)) over pos-W < j <= pos (SWA) or j <= pos (FULL); GQA
             o = attn * sigmoid(g); h += rmsnorm(Wo o, post_attention_norm, 1e-8)
             f = rmsnorm(h, ffn_norm); h += rmsnorm(Wdown(silu(Wg f) * Wu f), post_ffw_norm, 1e-8)
  logits = cap * tanh(Wout rmsnorm(h, output_norm) * scale / cap)
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_layer: int = 8
    n_embd: int = 512
    n_ff: int = 1024
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 64
    n_vocab: int = 4096
    n_ctx: int = 512
    window: int = 64
    pattern: int = 4
    rope_theta: float = 500000.0
    eps: float = 1e-5
    post_eps: float = 1e-8
    logit_scale: float = 0.196116
    softcap: float = 20.0

    def is_swa(self, l):
        return l % self.pattern != self.pattern - 1


def rmsnorm(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope(x, pos, theta):
    """x [B, T, heads, D]; pairs (x[2i], x[2i+1]) rotated by pos * theta^(-2i/D)."""
    D = x.shape[-1]
    inv = theta ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float64) / D)
    ang = (pos.to(torch.float64)[:, None] * inv[None, :])  # [T, D/2]
    cos = torch.cos(ang).to(x.dtype)[None, :, None, :]
    sin = torch.sin(ang).to(x.dtype)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, c: Config, layer: int, dropout: float = 0.0):
        super().__init__()
        self.c, self.swa, self.dropout = c, c.is_swa(layer), dropout
        E, HD, KD = c.n_embd, c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        self.attn_norm = nn.Parameter(torch.ones(E))
        self.attn_q = nn.Linear(E, HD, bias=False)
        self.attn_k = nn.Linear(E, KD, bias=False)
        self.attn_v = nn.Linear(E, KD, bias=False)
        self.attn_gate = nn.Linear(E, HD, bias=False)
        self.attn_q_norm = nn.Parameter(torch.ones(c.head_dim))
        self.attn_k_norm = nn.Parameter(torch.ones(c.head_dim))
        self.attn_output = nn.Linear(HD, E, bias=False)
        self.post_attention_norm = nn.Parameter(torch.ones(E))
        self.ffn_norm = nn.Parameter(torch.ones(E))
        self.ffn_gate = nn.Linear(E, c.n_ff, bias=False)
        self.ffn_up = nn.Linear(E, c.n_ff, bias=False)
        self.ffn_down = nn.Linear(c.n_ff, E, bias=False)
        self.post_ffw_norm = nn.Parameter(torch.ones(E))

    def forward(self, h, pos, mask, kv_f16=False):
        c = self.c
        B, T, _ = h.shape
        a = rmsnorm(h, self.attn_norm, c.eps)
        q = self.attn_q(a).view(B, T, c.n_head, c.head_dim)
        k = self.attn_k(a).view(B, T, c.n_head_kv, c.head_dim)
        v = self.attn_v(a).view(B, T, c.n_head_kv, c.head_dim)
        g = self.attn_gate(a)
        q = rmsnorm(q, self.attn_q_norm, c.eps)
        k = rmsnorm(k, self.attn_k_norm, c.eps)
        if self.swa:
            q, k = rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta)
        if kv_f16:  # the KV cache stores f16 (SPEC §3)
            k, v = k.half().to(q.dtype), v.half().to(q.dtype)
        rep = c.n_head // c.n_head_kv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, scale=1.0 / math.sqrt(c.head_dim))
        o = o.transpose(1, 2).reshape(B, T, -1) * torch.sigmoid(g)
        # dropout is training-only regularisation; inference (eval) is exactly SPEC §1
        drop = lambda t: F.dropout(t, self.dropout, self.training)  # noqa: E731
        h = h + drop(rmsnorm(self.attn_output(o), self.post_attention_norm, c.post_eps))
        f = rmsnorm(h, self.ffn_norm, c.eps)
        y = self.ffn_down(F.silu(self.ffn_gate(f)) * self.ffn_up(f))
        return h + drop(rmsnorm(y, self.post_ffw_norm, c.post_eps))


class Muse(nn.Module):
    def __init__(self, c: Config, dropout: float = 0.0):
        super().__init__()
        self.c = c
        self.token_embd = nn.Embedding(c.n_vocab, c.n_embd)
        self.blocks = nn.ModuleList(Block(c, l, dropout) for l in range(c.n_layer))
        self.output_norm = nn.Parameter(torch.ones(c.n_embd))
        self.output = nn.Linear(c.n_embd, c.n_vocab, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=1.0 / math.sqrt(m.in_features))
        nn.init.normal_(self.token_embd.weight, std=1.0)

    def masks(self, T, device):
        i = torch.arange(T, device=device)
        causal = i[None, :] <= i[:, None]
        swa = causal & (i[:, None] - i[None, :] < self.c.window)
        return causal, swa

    def forward(self, tokens, kv_f16=False):
        c = self.c
        B, T = tokens.shape
        pos = torch.arange(T, device=tokens.device)
        full_mask, swa_mask = self.masks(T, tokens.device)
        h = rmsnorm(self.token_embd(tokens), None, c.eps)
        for blk in self.blocks:
            h = blk(h, pos, swa_mask if blk.swa else full_mask, kv_f16)
        z = rmsnorm(h, self.output_norm, c.eps)
        return c.softcap * torch.tanh(self.output(z) * c.logit_scale / c.softcap)

    def gguf_tensors(self):
        """(name, float32 numpy array in PyTorch order) with SPEC §1 GGUF names."""
        sd = {k: v.detach().float().cpu().numpy() for k, v in self.state_dict().items()}
        out = [("token_embd.weight", sd["token_embd.weight"])]
        for l in range(self.c.n_layer):
            for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_gate", "attn_q_norm",
                      "attn_k_norm", "attn_output", "post_attention_norm", "ffn_norm", "ffn_gate",
                      "ffn_up", "ffn_down", "post_ffw_norm"):
                key = f"blocks.{l}.{n}" + (".weight" if f"blocks.{l}.{n}.weight" in sd else "")
                out.append((f"blk.{l}.{n}.weight", sd[key]))
        out.append(("output_norm.weight", sd["output_norm"]))
        out.append(("output.weight", sd["output.weight"]))
        return out

    def load_gguf(self, reader):
        """Load weights from a gguf_io.Reader (dequantized), inverse of gguf_tensors."""
        sd = self.state_dict()
        with torch.no_grad():
            for name in reader.names():
                if name == "token_embd.weight" or name == "output.weight":
                    key = name
                elif name == "output_norm.weight":
                    key = "output_norm"
                else:
                    _, l, n, _ = name.split(".")
                    key = f"blocks.{l}.{n}" + (".weight" if f"blocks.{l}.{n}.weight" in sd else "")
                t = torch.from_numpy(reader.tensor(name).copy())
                assert sd[key].shape == t.shape, (name, sd[key].shape, t.shape)
                sd[key].copy_(t)
