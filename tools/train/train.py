#!/usr/bin/env python3
"""train.py — train the default Muse Glimmer model (and its draft) on the lent GPU.

  1. a byte-level BPE tokenizer (Hugging Face `tokenizers`, GPT-2 pre-tokenizer) on corpus.txt;
  2. the model of model.py, bf16 autocast, AdamW, cosine schedule, a fixed time/step budget;
  3. export: GGUF (SPEC §1 `muse` metadata, F16 matrices, F32 norms), (run_device.sh quantizes it on the device)
     so they can travel back; muser quantizes them (`muser quantize --type mix`) on the CPU side;
  4. the tokenizer's encodings of varied strings (tests/data/tokenizer_ref.json) and the loss
     curve (loss.png, loss.csv).

usage: train.py --corpus corpus.txt --out OUT [--steps N] [--minutes M] [--seed S]
"""
import argparse, json, math, os, random, sys, time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io as G  # noqa: E402
from model import Config, Muse  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

TOKENIZER_PROBES = [
    "In the beginning God created the heaven and the earth.",
    "The LORD is my shepherd; I shall not want.",
    "hello world", "Hello, World!", " leading space", "trailing space ", "  two  spaces  ",
    "tabs\tand\nnewlines\n\n", "numbers 12345 and 3.14159", "CamelCaseWord", "snake_case_word",
    "don't can't won't it's I'm you're we've they'll he'd", "ALL CAPS SHOUTING",
    "hacker slang: foo, bar, baz; kludge!", "a.b.c-d_e/f\\g", "email@example.com",
    "https://www.debian.org/", "(parentheses) [brackets] {braces}", "\"quoted\" 'single'",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u65e5\u672c\u8a9e\u306e\u6587", "emoji \U0001F600 ok",
    "family \U0001F468\u200D\U0001F469\u200D\U0001F467", "\u0645\u0631\u062d\u0628\u0627",
    "x" * 300, "The quick brown fox jumps over the lazy dog.", "", " ", "\n", "...!!!???",
    "Thou shalt not kill.", "And God said, Let there be light: and there was light.",
    "BOFH excuse #42: solar flares", "fortune: You will be hungry again in one hour.",
    "1+1=2; 2*3=6; 10/5=2", "    indented code()", "line1\r\nline2", "mixed\u00a0nbsp",
]


def train_tokenizer(corpus, vocab, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([corpus], trainer)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    return tok


def tokenizer_meta(tok):
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    n = len(vocab)
    tokens = [None] * n
    for t, i in vocab.items():
        tokens[i] = t
    for a in j.get("added_tokens", []):
        tokens[a["id"]] = a["content"]
    assert all(t is not None for t in tokens)
    types = [3 if t in SPECIALS else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return tokens, types, merges


def gguf_kvs(c: Config, tokens, types, merges, name):
    a = "muse."
    return [
        ("general.architecture", G.T_STR, "muse"),
        ("general.name", G.T_STR, name),
        ("general.alignment", G.T_U32, 32),
        (a + "block_count", G.T_U32, c.n_layer),
        (a + "embedding_length", G.T_U32, c.n_embd),
        (a + "feed_forward_length", G.T_U32, c.n_ff),
        (a + "attention.head_count", G.T_U32, c.n_head),
        (a + "attention.head_count_kv", G.T_U32, c.n_head_kv),
        (a + "attention.key_length", G.T_U32, c.head_dim),
        (a + "attention.value_length", G.T_U32, c.head_dim),
        (a + "vocab_size", G.T_U32, c.n_vocab),
        (a + "context_length", G.T_U32, c.n_ctx),
        (a + "attention.layer_norm_rms_epsilon", G.T_F32, c.eps),
        (a + "attention.post_norm_epsilon", G.T_F32, c.post_eps),
        (a + "attention.sliding_window", G.T_U32, c.window),
        (a + "attention.sliding_window_pattern", G.T_U32, c.pattern),
        (a + "rope.freq_base", G.T_F32, c.rope_theta),
        (a + "rope.dimension_count", G.T_U32, c.head_dim),
        (a + "logit_scale", G.T_F32, c.logit_scale),
        (a + "final_logit_softcapping", G.T_F32, c.softcap),
        ("tokenizer.ggml.model", G.T_STR, "gpt2"),
        ("tokenizer.ggml.pre", G.T_STR, "gpt-2"),
        ("tokenizer.ggml.tokens", G.T_ARR, (G.T_STR, tokens)),
        ("tokenizer.ggml.token_type", G.T_ARR, (G.T_I32, types)),
        ("tokenizer.ggml.merges", G.T_ARR, (G.T_STR, merges)),
        ("tokenizer.ggml.bos_token_id", G.T_U32, 0),
        ("tokenizer.ggml.eos_token_id", G.T_U32, 0),
        ("tokenizer.ggml.eot_token_id", G.T_U32, tokens.index("<|end|>")),
        ("tokenizer.ggml.add_bos_token", G.T_BOOL, False),
    ]


def train_model(c, data, val, args, label, seconds, steps, lr):
    torch.manual_seed(args.seed)
    dev = "cuda"
    model = Muse(c, dropout=args.dropout).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    print(f"[{label}] {nparam/1e6:.2f}M parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95),
                            fused=True)
    B, T = args.batch, c.n_ctx
    data_t = torch.from_numpy(data.astype(np.int64)).to(dev)
    val_t = torch.from_numpy(val.astype(np.int64)).to(dev)
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed)

    def batch(src):
        ix = torch.randint(0, len(src) - T - 1, (B,), device=dev, generator=g)
        idx = ix[:, None] + torch.arange(T + 1, device=dev)[None, :]
        seq = src[idx]
        return seq[:, :-1], seq[:, 1:]

    def loss_of(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        return torch.nn.functional.cross_entropy(logits.float().view(-1, c.n_vocab), y.reshape(-1))

    log, t0, step, warm = [], time.time(), 0, 100
    best, best_state = 1e9, None
    while step < steps and time.time() - t0 < seconds:
        frac = step / steps
        cur = lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for pg in opt.param_groups:
            pg["lr"] = cur
        x, y = batch(data_t)
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0 or step == 1:
            model.eval()
            with torch.no_grad():
                vl = sum(loss_of(*batch(val_t)).item() for _ in range(4)) / 4
            model.train()
            tl = loss.item()
            log.append((step, time.time() - t0, tl, vl))
            print(f"[{label}] step {step} t {time.time()-t0:.0f}s lr {cur:.2e} train {tl:.3f} "
                  f"val {vl:.3f}", flush=True)
            if vl < best:
                best = vl
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if best_state is not None:
        model.load_state_dict(best_state)
    return model, log, best


def sample(model, tok, prompt, n=80, temp=0.8, seed=0):
    torch.manual_seed(seed)
    ids = tok.encode(prompt).ids
    x = torch.tensor([ids], device="cuda")
    model.eval()
    with torch.no_grad():
        for _ in range(n):
            logits = model(x[:, -model.c.n_ctx:])[0, -1].float()
            p = torch.softmax(logits / temp, -1)
            nxt = torch.multinomial(p, 1)
            x = torch.cat([x, nxt[None]], 1)
    return tok.decode(x[0].tolist())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--minutes", type=float, default=4.5)
    ap.add_argument("--draft-minutes", type=float, default=1.0)
    ap.add_argument("--val", choices=["tail", "random"], default="tail")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True

    t0 = time.time()
    tok = train_tokenizer(args.corpus, args.vocab, args.out)
    print(f"tokenizer: {tok.get_vocab_size()} tokens in {time.time()-t0:.1f}s", flush=True)
    tokens, types, merges = tokenizer_meta(tok)
    json.dump([{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids}
               for s in TOKENIZER_PROBES],
              open(os.path.join(args.out, "tokenizer_ref.json"), "w"), ensure_ascii=False, indent=0)

    text = open(args.corpus, encoding="utf-8").read()
    docs = text.split("\n<|endoftext|>\n")
    eot = tok.token_to_id("<|endoftext|>")
    enc = [np.array(e.ids + [eot], dtype=np.int32)
           for e in tok.encode_batch(docs, add_special_tokens=False)]
    if args.val == "random":  # a random 3% of the documents: every source in both sets
        order = list(range(len(enc)))
        random.Random(args.seed).shuffle(order)
        enc = [enc[i] for i in order]
        n_val = sum(len(e) for e in enc[:max(1, len(enc) * 3 // 100)])
    else:  # "tail": the last 2% of the token stream (the released model used this)
        n_val = sum(len(e) for e in enc) // 50
    ids = np.concatenate(enc)
    data, val = ids[:-n_val], ids[-n_val:]
    print(f"corpus: {len(text)/1e6:.2f} MB -> {len(ids)/1e6:.2f}M tokens "
          f"({len(val)/1e3:.0f}k validation, {args.val})", flush=True)

    c = Config(n_vocab=len(tokens))
    model, log, best = train_model(c, data, val, args, "main", args.minutes * 60, args.steps, args.lr)
    with open(os.path.join(args.out, "loss.csv"), "w") as f:
        f.write("step,seconds,train_loss,val_loss\n")
        for r in log:
            f.write("%d,%.1f,%.4f,%.4f\n" % r)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([r[0] for r in log], [r[2] for r in log], label="train")
        ax.plot([r[0] for r in log], [r[3] for r in log], label="validation")
        ax.set_xlabel("step (64 x 512 tokens)")
        ax.set_ylabel("cross-entropy (nats)")
        ax.set_title("muse-glimmer-mini")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "loss.png"), dpi=100)
    except Exception as e:  # the PNG is documentation only
        print("loss plot failed:", e)
    samples = {p: sample(model, tok, p) for p in
               ["The Lord is my shepherd;", "In the beginning", "A hacker is"]}
    json.dump(samples, open(os.path.join(args.out, "samples.json"), "w"), indent=1)
    for p, s in samples.items():
        print("SAMPLE:", repr(s), flush=True)
    G.write(os.path.join(args.out, "default-f16.gguf"),
            gguf_kvs(c, tokens, types, merges, "muse-glimmer-mini"), model.gguf_tensors())

    d = Config(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
               n_vocab=len(tokens))
    draft, dlog, dbest = train_model(d, data, val, args, "draft", args.draft_minutes * 60,
                                     args.steps, args.draft_lr)
    G.write(os.path.join(args.out, "draft-f16.gguf"),
            gguf_kvs(d, tokens, types, merges, "muse-glimmer-mini-draft"), draft.gguf_tensors())
    json.dump({"main_best_val": best, "draft_best_val": dbest, "main_steps": log[-1][0],
               "draft_steps": dlog[-1][0], "tokens": int(len(ids)),
               "seconds": time.time() - t0}, open(os.path.join(args.out, "summary.json"), "w"))
    print(f"done in {time.time()-t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
