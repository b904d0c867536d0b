"""Trains a small qwen3-style byte-level decoder on the Debian-files corpus (data.py) on the CPU.

Seeded: weights from torch.manual_seed(seed), training windows from numpy's default_rng(seed).
Saves to --out every --ckpt-minutes (config.json, model.safetensors in float32,
tokenizer.json), logs to --out/train.log, stops after --steps steps or --minutes of training,
whichever first, then writes the held-out perplexity per byte of the final weights, computed
through ContiguousCache (a prefix in one forward, then one token per forward).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
from model import Config, ContiguousCache, Model, score  # noqa: E402
from tokenizer import ByteTokenizer, VOCAB_SIZE  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--minutes", type=float, default=40.0, help="wall-time limit of the training loop")
    p.add_argument("--steps", type=int, default=0,
                   help="steps of the cosine schedule; 0: estimated from the first steps' speed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--ckpt-minutes", type=float, default=4.0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-docs", type=int, default=8, help="held-out documents in the final perplexity")
    p.add_argument("--eval-prefix", type=int, default=512,
                   help="tokens of each evaluated document fed in one forward before token-by-token")
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


class Log:
    def __init__(self, path):
        self.f = open(path, "a")

    def __call__(self, msg):
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def lr_at(step, args, total):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def lm_loss(model, x):
    """Mean next-token cross entropy over windows x [b, n + 1], one full-sequence forward."""
    inp, tgt = x[:, :-1], x[:, 1:]
    pos = torch.arange(inp.shape[1], dtype=torch.int64).unsqueeze(0).expand_as(inp)
    logits = model(inp, pos, ContiguousCache())
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


@torch.no_grad()
def quick_heldout(model, docs, ctx, n=4):
    """Held-out loss (nats per byte) of full-sequence forwards on the first ctx+1 tokens of n docs."""
    model.eval()
    losses = [lm_loss(model, torch.from_numpy(d[: ctx + 1].astype(np.int64)).unsqueeze(0)).item()
              for d in docs[:n]]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def final_perplexity(model, docs, ctx, prefix):
    """Perplexity per byte over the first ctx tokens of each doc, scored through
    ContiguousCache; also the full-sequence value for comparison."""
    model.eval()
    nll = nll_full = 0.0
    count = 0
    for d in docs:
        toks = torch.from_numpy(d[:ctx].astype(np.int64)).unsqueeze(0)
        logits = score(model, toks, ContiguousCache, chunk=prefix)
        tgt = toks[:, 1:].reshape(-1)
        nll += F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tgt, reduction="sum").item()
        pos = torch.arange(toks.shape[1]).unsqueeze(0)
        full = model(toks, pos, ContiguousCache())
        nll_full += F.cross_entropy(full[:, :-1].reshape(-1, full.shape[-1]), tgt, reduction="sum").item()
        count += tgt.numel()
    return math.exp(nll / count), math.exp(nll_full / count), count


def save_checkpoint(model, tok, out, info):
    model.save(out)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "checkpoint.json.tmp"), "w") as f:
        json.dump(info, f, indent=2)
    os.replace(os.path.join(out, "checkpoint.json.tmp"), os.path.join(out, "checkpoint.json"))


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train.log"))
    log(f"args {json.dumps(vars(args))}")

    t0 = time.time()
    corpus = data.build(os.path.join(args.out, "manifest.json"))
    train = corpus["train"]
    heldout = [d for d in corpus["heldout"] if len(d) >= 2048]
    log(f"data: train {len(train)} tokens, heldout {len(heldout)} documents "
        f"{sum(len(d) for d in heldout)} tokens ({time.time() - t0:.1f} s)")

    cfg = Config(vocab_size=VOCAB_SIZE, hidden_size=args.hidden, intermediate_size=args.intermediate,
                 num_hidden_layers=args.layers, num_attention_heads=args.heads,
                 num_key_value_heads=args.kv_heads, head_dim=args.head_dim, rms_norm_eps=1e-6,
                 rope_theta=10000.0, max_position_embeddings=args.ctx, tie_word_embeddings=True,
                 model_type="qwen3")
    model = Model(cfg)
    model.init_weights()
    nparams = sum(p.numel() for p in model.parameters())
    log(f"model: {json.dumps(cfg.to_dict())} params {nparams} ({nparams * 4 / 1e6:.1f} MB float32)")
    tok = ByteTokenizer()

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    total = args.steps if args.steps > 0 else None
    budget = args.minutes * 60
    start = time.time()
    last_ckpt = start
    step, tokens, loss_acc, n_acc = 0, 0, 0.0, 0
    t_log = time.time()
    tok_log = 0
    t_measure = None
    model.train()
    while True:
        elapsed = time.time() - start
        if (total is not None and step >= total) or elapsed >= budget:
            break
        if total is None and step == 10:
            t_measure = time.time()
        if total is None and step == 30:
            per_step = (time.time() - t_measure) / 20
            total = step + int((budget - elapsed) / per_step * 0.97)
            log(f"schedule: {per_step:.3f} s/step measured, {total} steps in all")
        lr = lr_at(step, args, total if total is not None else 10 ** 9)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train) - args.ctx - 1, size=args.batch)
        x = torch.from_numpy(np.stack([train[s : s + args.ctx + 1] for s in starts]).astype(np.int64))
        loss = lm_loss(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        step += 1
        tokens += x.shape[0] * args.ctx
        tok_log += x.shape[0] * args.ctx
        loss_acc += loss.item()
        n_acc += 1
        if step % args.log_every == 0:
            now = time.time()
            log(f"step {step} tokens {tokens} loss {loss_acc / n_acc:.4f} "
                f"bpb {loss_acc / n_acc / math.log(2):.3f} lr {lr:.2e} gnorm {gnorm:.2f} "
                f"tok/s {tok_log / (now - t_log):.0f} elapsed {now - start:.0f}s")
            loss_acc, n_acc, t_log, tok_log = 0.0, 0, now, 0
        if time.time() - last_ckpt >= args.ckpt_minutes * 60:
            hl = quick_heldout(model, heldout, args.ctx)
            save_checkpoint(model, tok, args.out, {"step": step, "tokens": tokens, "heldout_loss": hl,
                                                   "final": False})
            log(f"checkpoint step {step} tokens {tokens} heldout_loss {hl:.4f} "
                f"heldout_ppl_per_byte {math.exp(hl):.3f}")
            last_ckpt = time.time()

    train_s = time.time() - start
    hl = quick_heldout(model, heldout, args.ctx)
    info = {"step": step, "tokens": tokens, "train_seconds": round(train_s), "heldout_loss": hl,
            "final": True}
    save_checkpoint(model, tok, args.out, info)
    log(f"final checkpoint step {step} tokens {tokens} train {train_s:.0f}s "
        f"mean {tokens / train_s:.0f} tok/s heldout_loss {hl:.4f}")
    docs = heldout[: args.eval_docs]
    t1 = time.time()
    ppl, ppl_full, count = final_perplexity(model, docs, args.ctx, args.eval_prefix)
    info.update({"heldout_ppl_per_byte": ppl, "heldout_ppl_per_byte_full_forward": ppl_full,
                 "eval_documents": len(docs), "eval_tokens": count, "eval_prefix": args.eval_prefix})
    with open(os.path.join(args.out, "checkpoint.json"), "w") as f:
        json.dump(info, f, indent=2)
    log(f"final heldout perplexity per byte (ContiguousCache, prefix {args.eval_prefix} then 1 token "
        f"per forward, {len(docs)} documents, {count} predicted bytes): {ppl:.4f} "
        f"[{math.log2(ppl):.4f} bits/byte; full-sequence forward {ppl_full:.4f}] ({time.time() - t1:.0f}s)")


if __name__ == "__main__":
    main()
