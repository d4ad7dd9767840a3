"""dflash_model.py — the DFlash block drafter (docs/dflash.md) in PyTorch, written from that page,
independent of muser's C (src/cpu/dflash.c, src/dflash_ref.c), so it can judge it.

  context, per position j:  u_j = rmsnorm(fc [h_l1(j); ...; h_lm(j)], hidden_norm)   (target residuals)
  a block anchored at p:    rows p..p+B-1; row 0 = target.token_embd[t0], rows 1.. = mask_embd
  per layer:                a = rmsnorm(x, attn_norm); q = Wq a; keys/values: Wk u_j, Wv u_j (j < p)
                            then Wk a, Wv a of the block; per-head q/k rmsnorm; RoPE (NORM pairs) at
                            each row's position; softmax(q.k / sqrt(D)) over those keys, no causal
                            mask inside the block; x += Wo o; x += Wdown(silu(Wg f) * Wu f), f = rmsnorm(x, ffn_norm)
  logits of rows 1..B-1:    target head: cap * tanh(target.output(rmsnorm(x, output_norm)) * scale / cap)

The target (model.Muse) is frozen and shared: its embedding and LM head are used, not copied.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import rmsnorm


@dataclass
class DConfig:
    n_layer: int = 1
    n_embd: int = 512
    n_ff: int = 1024
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 64
    block: int = 16
    taps: list = field(default_factory=lambda: [1, 4, 7])
    eps: float = 1e-5
    rope_theta: float = 500000.0


def rope_at(x, pos, theta):
    """x [B, L, heads, D]; pos [B, L]: pairs (x[2i], x[2i+1]) rotated by pos * theta^(-2i/D)."""
    D = x.shape[-1]
    inv = theta ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float64) / D)
    ang = pos.to(torch.float64)[..., None] * inv  # [B, L, D/2]
    cos = torch.cos(ang).to(x.dtype)[:, :, None, :]
    sin = torch.sin(ang).to(x.dtype)[:, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class DLayer(nn.Module):
    def __init__(self, c: DConfig):
        super().__init__()
        self.c = c
        E, HD, KD = c.n_embd, c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        self.attn_norm = nn.Parameter(torch.ones(E))
        self.attn_q = nn.Linear(E, HD, bias=False)
        self.attn_k = nn.Linear(E, KD, bias=False)
        self.attn_v = nn.Linear(E, KD, bias=False)
        self.attn_q_norm = nn.Parameter(torch.ones(c.head_dim))
        self.attn_k_norm = nn.Parameter(torch.ones(c.head_dim))
        self.attn_output = nn.Linear(HD, E, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(E))
        self.ffn_gate = nn.Linear(E, c.n_ff, bias=False)
        self.ffn_up = nn.Linear(E, c.n_ff, bias=False)
        self.ffn_down = nn.Linear(c.n_ff, E, bias=False)

    def forward(self, x, u, qpos, cpos, mask):
        """x [B, Q, E] block rows; u [B, T, E] context; qpos [B, Q], cpos [B, T] positions;
        mask [B, 1, Q, T + Q] True where a row may attend."""
        c = self.c
        B, Q, _ = x.shape
        T = u.shape[1]
        a = rmsnorm(x, self.attn_norm, c.eps)
        q = self.attn_q(a).view(B, Q, c.n_head, c.head_dim)
        kb = self.attn_k(a).view(B, Q, c.n_head_kv, c.head_dim)
        vb = self.attn_v(a).view(B, Q, c.n_head_kv, c.head_dim)
        kc = self.attn_k(u).view(B, T, c.n_head_kv, c.head_dim)
        vc = self.attn_v(u).view(B, T, c.n_head_kv, c.head_dim)
        q = rope_at(rmsnorm(q, self.attn_q_norm, c.eps), qpos, c.rope_theta)
        kb = rope_at(rmsnorm(kb, self.attn_k_norm, c.eps), qpos, c.rope_theta)
        kc = rope_at(rmsnorm(kc, self.attn_k_norm, c.eps), cpos, c.rope_theta)
        k = torch.cat([kc, kb], 1)
        v = torch.cat([vc, vb], 1)
        rep = c.n_head // c.n_head_kv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, scale=1.0 / math.sqrt(c.head_dim))
        x = x + self.attn_output(o.transpose(1, 2).reshape(B, Q, -1))
        f = rmsnorm(x, self.ffn_norm, c.eps)
        return x + self.ffn_down(F.silu(self.ffn_gate(f)) * self.ffn_up(f))


class DFlash(nn.Module):
    def __init__(self, c: DConfig, target):
        super().__init__()
        self.c = c
        E = c.n_embd
        assert E == target.c.n_embd, "a drafter has its target's width"
        self.fc = nn.Linear(len(c.taps) * E, E, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(E))
        self.mask_embd = nn.Parameter(torch.randn(E))
        self.layers = nn.ModuleList(DLayer(c) for _ in range(c.n_layer))
        self.output_norm = nn.Parameter(torch.ones(E))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=1.0 / math.sqrt(m.in_features))
        self._target = [target]  # shared and frozen: not a submodule, not in state_dict

    @property
    def target(self):
        return self._target[0]

    def forward(self, feats, t0, anchors):
        """feats [B, T, m*E]: the target's residuals at the tapped layers for positions 0..T-1;
        t0 [B, A]: the token at each anchor; anchors [B, A]: block positions p (context: j < p).
        Returns the target-head logits of rows 1..B-1 of every block, [B, A, block-1, V]."""
        c, tg = self.c, self.target
        Bt, T, _ = feats.shape
        A, Bn, E = anchors.shape[1], c.block, c.n_embd
        u = rmsnorm(self.fc(feats), self.hidden_norm, c.eps)
        offs = torch.arange(Bn, device=feats.device)
        qpos = (anchors[:, :, None] + offs).reshape(Bt, A * Bn)
        cpos = torch.arange(T, device=feats.device).expand(Bt, T)
        x = self.mask_embd.to(u.dtype).expand(Bt, A, Bn, E).clone()
        x[:, :, 0] = tg.token_embd(t0).to(u.dtype)
        x = x.reshape(Bt, A * Bn, E)
        # a row of block a sees context j < anchors[a] and every row of block a
        blk = torch.arange(A, device=feats.device).repeat_interleave(Bn)  # [A*Bn]
        ctx_ok = torch.arange(T, device=feats.device)[None, None, :] < anchors.repeat_interleave(Bn, 1)[:, :, None]
        own = (blk[:, None] == blk[None, :]).expand(Bt, A * Bn, A * Bn)
        mask = torch.cat([ctx_ok, own], 2)[:, None]
        for layer in self.layers:
            x = layer(x, u, qpos, cpos, mask)
        z = rmsnorm(x, self.output_norm, c.eps).view(Bt, A, Bn, E)[:, :, 1:]
        tc = tg.c
        return tc.softcap * torch.tanh(tg.output(z) * tc.logit_scale / tc.softcap)

    def gguf_tensors(self):
        """(name, float32 numpy array in PyTorch order) with docs/dflash.md's GGUF names."""
        sd = {k: v.detach().float().cpu().numpy() for k, v in self.state_dict().items()}
        out = [("fc.weight", sd["fc.weight"]), ("hidden_norm.weight", sd["hidden_norm"]),
               ("mask_embd.weight", sd["mask_embd"])]
        for l in range(self.c.n_layer):
            for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
                      "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"):
                key = f"layers.{l}.{n}" + (".weight" if f"layers.{l}.{n}.weight" in sd else "")
                out.append((f"blk.{l}.{n}.weight", sd[key]))
        out.append(("output_norm.weight", sd["output_norm"]))
        return out

    def load_gguf(self, reader):
        """Weights from a gguf_io.Reader (dequantized), inverse of gguf_tensors."""
        sd = self.state_dict()
        plain = {"fc.weight": "fc.weight", "hidden_norm.weight": "hidden_norm",
                 "mask_embd.weight": "mask_embd", "output_norm.weight": "output_norm"}
        with torch.no_grad():
            for name in reader.names():
                if name in plain:
                    key = plain[name]
                else:
                    _, l, n, _ = name.split(".")
                    key = f"layers.{l}.{n}" + (".weight" if f"layers.{l}.{n}.weight" in sd else "")
                t = torch.from_numpy(reader.tensor(name).copy())
                assert sd[key].shape == t.shape, (name, sd[key].shape, t.shape)
                sd[key].copy_(t)


def config_from(reader):
    """DConfig from a drafter GGUF's metadata."""
    kv = reader.kv
    return DConfig(n_layer=kv["dflash.block_count"], n_embd=kv["dflash.embedding_length"],
                   n_ff=kv["dflash.feed_forward_length"], n_head=kv["dflash.attention.head_count"],
                   n_head_kv=kv["dflash.attention.head_count_kv"],
                   head_dim=kv["dflash.attention.key_length"], block=kv["dflash.block_size"],
                   taps=list(kv["dflash.target_layers"]),
                   eps=kv["dflash.attention.layer_norm_rms_epsilon"],
                   rope_theta=kv["dflash.rope.freq_base"])


def target_features(target, tokens, taps, kv_f16=False):
    """The target's residual stream after each layer in taps, concatenated: [B, T, len(taps)*E]
    (muser's hidden-state tap), and its logits [B, T, V]."""
    c = target.c
    B, T = tokens.shape
    pos = torch.arange(T, device=tokens.device)
    full_mask, swa_mask = target.masks(T, tokens.device)
    h = rmsnorm(target.token_embd(tokens), None, c.eps)
    outs = []
    for l, blk in enumerate(target.blocks):
        h = blk(h, pos, swa_mask if blk.swa else full_mask, kv_f16)
        if l in taps:
            outs.append(h)
    z = rmsnorm(h, target.output_norm, c.eps)
    logits = c.softcap * torch.tanh(target.output(z) * c.logit_scale / c.softcap)
    return torch.cat(outs, -1), logits
