#!/usr/bin/env python3
"""train_dflash.py — train a DFlash drafter (docs/dflash.md) for a committed target, on the lent GPU.

  1. data from the target itself: prompts are random windows of the corpus (tokenized with the
     target's tokenizer), continued by the target (greedy by default, --gen-temp to sample);
  2. the frozen target gives the residuals at the tapped layers for every position (the hidden
     states muser's tap reads at inference) and stays frozen: its embedding and LM head are shared;
  3. each training sequence gets --anchors random block positions p in the generated part; a block
     is [x_p, mask x (B-1)] at positions p..p+B-1 over the context j < p; cross-entropy of rows
     1..B-1 against x_{p+1..p+B-1}, weighted exp(-(k-1)/gamma) toward the first rows (a draft only
     counts while every earlier one was accepted);
  4. validation on held-out generated sequences: per-row accuracy and the greedy acceptance length
     (1 + the drafts accepted before the first miss) a verify round would see;
  5. export: GGUF (`general.architecture` dflash, F16 matrices, F32 norms; the target's
     fingerprint, layer count and vocabulary), the loss curve (csv, png) and a summary.

usage: train_dflash.py --target models/default.gguf --tokenizer models/tokenizer.json
                       --corpus .train/corpus.txt --out OUT [--block 16] [--minutes 4]
"""
import argparse, json, math, os, random, sys, time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_io  # noqa: E402
import gguf_io as G  # noqa: E402
from dflash_model import DConfig, DFlash, target_features  # noqa: E402
from model import Muse  # noqa: E402
from reference import config_from  # noqa: E402

DEFAULT_GAMMA = {4: 2.0, 8: 4.0, 16: 7.0}


def load_target(path, dev):
    r = G.Reader(path)
    c = config_from(r)
    t = Muse(c)
    t.load_gguf(r)
    t = t.to(dev).eval()
    for p in t.parameters():
        p.requires_grad_(False)
    return t


@torch.no_grad()
def generate(target, prompts, n_new, temp, gen):
    """prompts [N, P] -> [N, P + n_new], continued by the target (full recompute per step: the
    model is small and the context short)."""
    x = prompts
    for _ in range(n_new):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = target(x[:, -target.c.n_ctx:])[:, -1].float()
        if temp <= 0:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temp, -1), 1, generator=gen)
        x = torch.cat([x, nxt], 1)
    return x


def make_data(target, ids, args, dev):
    """Target-generated sequences: [N, prompt + gen] token ids on dev."""
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed)
    src = torch.from_numpy(ids.astype(np.int64)).to(dev)
    out, t0 = [], time.time()
    for s in range(0, args.gen_seqs, args.gen_batch):
        n = min(args.gen_batch, args.gen_seqs - s)
        ix = torch.randint(0, len(src) - args.prompt, (n,), device=dev, generator=g)
        prompts = src[ix[:, None] + torch.arange(args.prompt, device=dev)[None, :]]
        out.append(generate(target, prompts, args.gen, args.gen_temp, g))
        print(f"data: {s + n}/{args.gen_seqs} sequences ({time.time() - t0:.0f}s)", flush=True)
    return torch.cat(out)


def block_loss(drafter, target, seqs, args, gen, weights):
    """Cross-entropy of random blocks of seqs [N, T]; also (correct [N, A, B-1] bool)."""
    c = drafter.c
    N, T = seqs.shape
    B = c.block
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        feats, _ = target_features(target, seqs, c.taps)
    lo, hi = args.prompt - 1, T - B  # anchors: labels in the generated part
    anchors = torch.randint(lo, hi + 1, (N, args.anchors), device=seqs.device, generator=gen)
    t0 = seqs.gather(1, anchors)
    lab_idx = anchors[:, :, None] + torch.arange(1, B, device=seqs.device)
    labels = seqs.gather(1, lab_idx.view(N, -1)).view(N, args.anchors, B - 1)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = drafter(feats, t0, anchors).float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    ce = ce.view(N, args.anchors, B - 1)
    loss = (ce * weights).sum(-1).mean() / weights.sum()
    return loss, logits.argmax(-1) == labels


def acceptance_length(correct):
    """Greedy tokens per verify round: 1 (the target's own) + drafts accepted before the first miss."""
    run = torch.cumprod(correct.int(), -1)
    return 1.0 + run.sum(-1).float().mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--block", type=int, default=16, choices=range(2, 17), metavar="B")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--taps", default="", help="target layers, comma separated (default: 1, L/2, L-1)")
    ap.add_argument("--gamma", type=float, default=0.0, help="loss weight decay (default by block)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--gen", type=int, default=224)
    ap.add_argument("--gen-temp", type=float, default=0.0)
    ap.add_argument("--gen-seqs", type=int, default=4096)
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--val-seqs", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--data-cache", default="",
                    help="a .pt file: the generated sequences are loaded from it when it exists, else saved to it "
                         "(drafters of several block sizes then train on one generation)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    t_start = time.time()

    target = load_target(args.target, dev)
    tc = target.c
    assert args.prompt + args.gen <= tc.n_ctx, "sequences must fit the target's context"
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    text = open(args.corpus, encoding="utf-8").read()
    docs = text.split("\n<|endoftext|>\n")
    eot = tok.token_to_id("<|endoftext|>")
    ids = np.concatenate([np.array(e.ids + [eot], dtype=np.int32)
                          for e in tok.encode_batch(docs, add_special_tokens=False)])
    print(f"corpus: {len(ids) / 1e6:.2f}M tokens", flush=True)

    args.gen_seqs += args.val_seqs
    if args.data_cache and os.path.exists(args.data_cache):
        seqs = torch.load(args.data_cache).to(dev)
        print(f"data: {len(seqs)} sequences from {args.data_cache}", flush=True)
    else:
        seqs = make_data(target, ids, args, dev)
        if args.data_cache:
            torch.save(seqs.cpu(), args.data_cache)
    perm = torch.randperm(len(seqs), device=dev)
    val, data = seqs[perm[:args.val_seqs]], seqs[perm[args.val_seqs:]]
    print(f"data: {len(data)} training, {len(val)} validation sequences of {seqs.shape[1]} tokens "
          f"({time.time() - t_start:.0f}s)", flush=True)

    L = tc.n_layer
    taps = [int(x) for x in args.taps.split(",")] if args.taps else sorted({1 if L > 2 else 0, L // 2, L - 1})
    c = DConfig(n_layer=args.layers, n_embd=tc.n_embd, n_ff=tc.n_ff, n_head=tc.n_head,
                n_head_kv=tc.n_head_kv, head_dim=tc.head_dim, block=args.block, taps=taps,
                eps=tc.eps, rope_theta=tc.rope_theta)
    drafter = DFlash(c, target).to(dev)
    nparam = sum(p.numel() for p in drafter.parameters())
    print(f"drafter: {nparam / 1e6:.2f}M parameters, {c.n_layer} layer(s), block {c.block}, taps {taps}",
          flush=True)
    gamma = args.gamma or DEFAULT_GAMMA.get(c.block, c.block / 2.0)
    weights = torch.exp(-torch.arange(c.block - 1, device=dev, dtype=torch.float32) / gamma)
    decay = [p for p in drafter.parameters() if p.dim() >= 2]
    nodecay = [p for p in drafter.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed)
    gv = torch.Generator(device=dev)

    def validate():
        drafter.eval()
        gv.manual_seed(args.seed + 1)  # the same anchors every time
        with torch.no_grad():
            losses, corr = [], []
            for s in range(0, len(val), args.batch):
                lv, cv = block_loss(drafter, target, val[s:s + args.batch], args, gv, weights)
                losses.append(lv.item())
                corr.append(cv)
        drafter.train()
        cc = torch.cat(corr)
        return sum(losses) / len(losses), acceptance_length(cc), cc.float().mean((0, 1)).tolist()

    log, step, warm, t0 = [], 0, 100, time.time()
    best, best_state, best_acc = 1e9, None, None
    seconds = args.minutes * 60
    while step < args.steps and time.time() - t0 < seconds:
        frac = min(1.0, (time.time() - t0) / seconds)
        cur = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for pg in opt.param_groups:
            pg["lr"] = cur
        ix = torch.randint(0, len(data), (args.batch,), device=dev, generator=g)
        loss, correct = block_loss(drafter, target, data[ix], args, g, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0 or step == 1:
            vl, tau, per_row = validate()
            log.append((step, time.time() - t0, loss.item(), vl, acceptance_length(correct), tau))
            print(f"step {step} t {time.time() - t0:.0f}s lr {cur:.2e} train {loss.item():.3f} val {vl:.3f} "
                  f"acceptance length {tau:.2f} (row accuracy {', '.join('%.2f' % a for a in per_row[:4])}, ...)",
                  flush=True)
            if vl < best:
                best, best_acc = vl, (tau, per_row)
                best_state = {k: v.detach().clone() for k, v in drafter.state_dict().items()}
    if best_state is not None:
        drafter.load_state_dict(best_state)

    tag = f"dflash-b{c.block}"
    with open(os.path.join(args.out, f"{tag}-loss.csv"), "w") as f:
        f.write("step,seconds,train_loss,val_loss,train_acceptance_length,val_acceptance_length\n")
        for r in log:
            f.write("%d,%.1f,%.4f,%.4f,%.3f,%.3f\n" % r)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
        ax[0].plot([r[0] for r in log], [r[2] for r in log], label="train")
        ax[0].plot([r[0] for r in log], [r[3] for r in log], label="validation")
        ax[0].set_xlabel(f"step ({args.batch} sequences x {args.anchors} blocks)")
        ax[0].set_ylabel("weighted cross-entropy (nats)")
        ax[0].legend()
        ax[1].plot([r[0] for r in log], [r[5] for r in log])
        ax[1].set_xlabel("step")
        ax[1].set_ylabel("validation acceptance length")
        fig.suptitle(f"DFlash drafter, block {c.block}, for muse-glimmer-mini")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, f"{tag}-loss.png"), dpi=100)
    except Exception as e:  # the PNG is documentation only
        print("loss plot failed:", e)
    kvs = dflash_io.drafter_kvs(args.target, c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_head_kv, c.head_dim,
                                c.eps, c.rope_theta, c.block, c.taps, f"muse-glimmer-mini {tag}")
    G.write(os.path.join(args.out, f"{tag}-f16.gguf"), kvs, drafter.gguf_tensors())
    json.dump({"block": c.block, "taps": c.taps, "layers": c.n_layer, "gamma": gamma,
               "parameters": nparam, "best_val_loss": best, "val_acceptance_length": best_acc[0] if best_acc else None,
               "val_row_accuracy": best_acc[1] if best_acc else None, "steps": step,
               "train_sequences": len(data), "sequence_tokens": int(seqs.shape[1]),
               "gen_temp": args.gen_temp, "seconds": time.time() - t_start},
              open(os.path.join(args.out, f"{tag}-summary.json"), "w"), indent=1)
    print(f"done in {time.time() - t_start:.0f}s: {tag}-f16.gguf", flush=True)


if __name__ == "__main__":
    main()
