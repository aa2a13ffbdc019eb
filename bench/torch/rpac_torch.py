#!/usr/bin/env python3
"""rpac's models in PyTorch, written from the paper's Appendix C listings
(GaussianFuzzy, FuzzyMHA with the RPA prior, FuzzyMoE, the block, the LM
loss) with the decisions compiler/model takes where the paper leaves them
open (tied LM head, learned positions, the prior's statistics as the batch
mean, the entropy floor on the per-token mean CE). It loads rpac's
checkpoints (model.safetensors: the parameter names are the listing's
module paths) and compares itself with rpac, then times training steps:

    python3 bench/torch/rpac_torch.py EXPORT_DIR [--out FILE.json]
        [--device cpu|cuda] [--context T] [--tokens-per-step N]
        [--steps N] [--warmup N] [--time-limit S] [--no-timing]

EXPORT_DIR is what `rpac bench torch-export` (bench/torch/export.go)
writes: checkpoint/ (model.safetensors, state.json with the config),
batch.safetensors (input_ids, targets) and rpac.json (rpac's loss on that
batch). The loss is the mean pure CE per token in evaluation mode with
batch statistics, in float32, with the experts dense (every expert on every
token, weights zero outside the top-k, as in the listing and in rpac) and
routed (each token only through its top-k experts): both must equal rpac's
(--tol, default 1e-3; the figure says how much closer they are).

Timing: training steps (forward with dropout and Gumbel noise, backward,
global-norm clipping at 1, AdamW) at the preset's tokens per step and the
given context, on random ids, eager and under torch.compile (which needs
PyTorch 2; with 1.13 it says so and skips only that), under bf16 autocast on
CUDA (fp32 on the CPU). The JSON result goes to --out and its last line to
stdout; the exit status is 1 when a loss differs from rpac's by more than
--tol.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    """The tensors of a safetensors file (no package needed)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[lo:hi]), dtype=DTYPES[e["dtype"]]) if hi > lo else torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out


# ---------------------------------------------------------------- model

class GaussianFuzzy(nn.Module):
    """Appendix C, GaussianFuzzy: memberships over R regimes."""

    def __init__(self, d, R):
        super().__init__()
        self.R = R
        self.proj = nn.Linear(d, d)
        self.centers = nn.Parameter(torch.randn(R, d) / math.sqrt(d))
        self.log_sigma = nn.Parameter(torch.zeros(R))

    def forward(self, h):
        z = self.proj(h)
        B, T, D = z.shape
        z2 = (z.unsqueeze(2) - self.centers.view(1, 1, self.R, D)).pow(2).sum(-1)
        inv2sig2 = torch.exp(-2 * self.log_sigma).clamp(1e-3, 1e3).view(1, 1, self.R)
        logits = torch.clamp(-0.5 * z2 * inv2sig2, -30.0, 30.0)
        return torch.nan_to_num(F.softmax(logits, dim=-1), nan=1.0 / self.R)


def soft_blocks(T, K, device):
    """FuzzyMHA._soft_blocks, float32 as the listing."""
    t = torch.arange(T, device=device, dtype=torch.float32)
    c = torch.linspace(0, T - 1, K, device=device, dtype=torch.float32)
    w = max(1.0, (T / max(1, K)) * 1.5)
    dist = (t[:, None] - c[None, :]).abs() / w
    phi = 0.5 * (1.0 + torch.cos(torch.clamp(dist, 0, 1) * math.pi))
    phi = phi * (dist <= 1).float()
    return phi / (phi.sum(dim=1, keepdim=True) + 1e-6)


def pos_distance(T, device):
    i = torch.arange(T, device=device, dtype=torch.float32)
    return (i[:, None] - i[None, :]).abs() / max(1.0, T - 1.0)


def zscore(x):
    return (x - x.mean()) / (x.std() + 1e-6)


class FuzzyMHA(nn.Module):
    """Appendix C, FuzzyMHA with the RPA prior and the legacy bias. The
    prior's statistics are the batch mean of μ per position (linear in μ:
    the listing's einsum over the batch, then mean)."""

    def __init__(self, c, fuzzy=True):
        super().__init__()
        d, H = c["d_model"], c["heads"]
        self.c, self.H, self.Hd = c, H, d // H
        self.Wq = nn.Linear(d, d, bias=False)
        self.Wk = nn.Linear(d, d, bias=False)
        self.Wv = nn.Linear(d, d, bias=False)
        self.out_proj = nn.Linear(d, d, bias=False)
        if fuzzy:  # the baseline's attention has the projections only
            self.value_gamma = nn.Linear(c["R"], H, bias=False)
            self.tau_att = nn.Parameter(torch.tensor(float(c["tau_att_init"])))
            self.pos_beta = nn.Parameter(torch.tensor(float(c["pos_beta"])))
            if not c["use_rpa"]:
                self.kappa = nn.Parameter(torch.tensor(float(c["kappa_init"])))
            self.register_buffer("bias_scale", torch.tensor(1.0))
        self.dropout = nn.Dropout(c["dropout"])

    def pos_bias(self, T, device):
        return -self.pos_beta.clamp_min(0.0) * pos_distance(T, device)

    def prior(self, mu):
        c = self.c
        T = mu.size(1)
        mbar = mu.mean(dim=0)  # [T,R]
        if c["use_rpa"]:
            K = c["rpa_K"] if c["rpa_K"] > 0 else c["R"]
            phi = soft_blocks(T, K, mu.device)
            S = mbar.t() @ phi  # [R,K]
            if c["rpa_detach"]:
                S = S.detach()
            X = torch.exp(S / max(1e-6, c["tau_align"])).clamp(1e-9, 1e9)
            for _ in range(c["sinkhorn_iters"]):
                X = X / (X.sum(dim=1, keepdim=True) + 1e-9)
                X = X / (X.sum(dim=0, keepdim=True) + 1e-9)
            bm = (mbar @ X) @ phi.t()  # [T,T]
            if c["rpa_posmix"] > 0:
                bm = (1.0 - c["rpa_posmix"]) * bm + c["rpa_posmix"] * self.pos_bias(T, mu.device)
            bm = zscore(bm)
        else:
            sim = torch.einsum("btr,bsr->bts", mu, mu).mean(dim=0)
            ks = self.kappa.sigmoid()
            bm = ks * zscore(sim) + (1.0 - ks) * self.pos_bias(T, mu.device)
        clip = c["bias_clip"]
        bm = torch.nan_to_num(bm, nan=0.0, posinf=clip, neginf=-clip)
        bm = torch.clamp(bm / self.tau_att.clamp(0.6, c["tau_max"]), -clip, clip)
        return bm * self.bias_scale.clamp(0.0, 1.0)

    def forward(self, x, mu, bias):
        B, T, D = x.shape
        H, Hd = self.H, self.Hd
        q = self.Wq(x).view(B, T, H, Hd).transpose(1, 2)
        k = self.Wk(x).view(B, T, H, Hd).transpose(1, 2)
        v = self.Wv(x).view(B, T, H, Hd).transpose(1, 2)
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(Hd)
        if bias is not None:
            s = s + bias.to(s.dtype)
        mask = torch.triu(torch.ones(T, T, device=x.device, dtype=torch.bool), diagonal=1)
        a = self.dropout(torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1))
        out = self.out_proj(torch.matmul(a, v).transpose(1, 2).reshape(B, T, D))
        if mu is None:
            return out
        gamma = torch.sigmoid(self.value_gamma(mu.mean(dim=1, keepdim=True))).mean(dim=-1, keepdim=True)
        return self.dropout(out * gamma)


class ExpertFFN(nn.Module):
    def __init__(self, d, d_ff, p):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), nn.Dropout(p), nn.Linear(d_ff, d), nn.Dropout(p))

    def forward(self, x):
        return self.net(x)


class FuzzyMoE(nn.Module):
    """Appendix C, FuzzyMoE. routed=False runs every expert on every token
    (the listing, and rpac); routed=True runs each token only through the
    experts its top-k weights keep: the same sums without the zero terms."""

    def __init__(self, c, routed):
        super().__init__()
        d = c["d_model"]
        self.E, self.top_k, self.routed = c["experts"], c["top_k"], routed
        self.gate = nn.Linear(c["R"], self.E, bias=False)
        self.experts = nn.ModuleList([ExpertFFN(d, d * c["ff_mult"], c["dropout"]) for _ in range(self.E)])

    def weights(self, mu):
        logits = torch.clamp(self.gate(mu), -30.0, 30.0)
        if self.training:
            g = -torch.log(-torch.log(torch.rand_like(logits).clamp_(1e-6, 1 - 1e-6)))
            logits = logits + g
        y = torch.nan_to_num(F.softmax(logits / 0.5, dim=-1), nan=0.0)
        idx = torch.topk(y, k=min(self.top_k, self.E), dim=-1).indices
        mask = torch.zeros_like(y).scatter_(-1, idx, 1.0)
        return (y * mask) / (y.sum(dim=-1, keepdim=True) + 1e-6), idx

    def forward(self, x, mu):
        y, idx = self.weights(mu)
        if not self.routed:
            return torch.stack([y[..., e].unsqueeze(-1) * ex(x) for e, ex in enumerate(self.experts)], dim=-1).sum(-1)
        B, T, D = x.shape
        xf, yf, kf = x.reshape(-1, D), y.reshape(-1, self.E), idx.reshape(B * T, -1)
        out = torch.zeros_like(xf)
        for e, ex in enumerate(self.experts):
            rows = (kf == e).any(dim=-1).nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            out = out.index_add(0, rows, (yf[rows, e].unsqueeze(-1) * ex(xf[rows])).to(out.dtype))
        return out.view(B, T, D)


class FuzzyBlock(nn.Module):
    """Appendix C, FuzzyTransformerBlock: mem -> attn (RPA) -> fuzzy MoE."""

    def __init__(self, c, routed):
        super().__init__()
        d = c["d_model"]
        self.mem = GaussianFuzzy(d, c["R"])
        self.attn = FuzzyMHA(c)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.moe = FuzzyMoE(c, routed)
        self.res_gate = nn.Linear(c["R"], 1, bias=False)
        self.dropout = nn.Dropout(c["dropout"])

    def forward(self, x):
        mu = self.mem(x)
        eta = torch.sigmoid(self.res_gate(mu))
        a = self.attn(self.norm1(x), mu, self.attn.prior(mu))
        x = x + eta * self.dropout(a)
        x = x + eta * self.dropout(self.moe(self.norm2(x), mu))
        h = -(mu * mu.clamp_min(1e-8).log()).sum(-1).mean()
        return x, h


class BaselineBlock(nn.Module):
    """rpac's baseline: pre-LN attention and a dense FFN as wide as the top-k
    experts together."""

    def __init__(self, c):
        super().__init__()
        d, p = c["d_model"], c["dropout"]
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = FuzzyMHA(c, fuzzy=False)
        self.ffn = ExpertFFN(d, c["ff_mult"] * d * max(1, c["top_k"]), p)
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        x = x + self.dropout(self.attn(self.norm1(x), None, None))
        return x + self.dropout(self.ffn(self.norm2(x))), None


class RPACModel(nn.Module):
    def __init__(self, c, routed=False):
        super().__init__()
        for key in ("rope", "smear_keys"):
            if c.get(key):
                raise SystemExit(f"rpac_torch: {key} is not implemented here (not in the paper)")
        if c.get("pos_init", "") not in ("", "normal", "sinusoid", "none"):
            raise SystemExit(f"rpac_torch: pos_init {c['pos_init']!r} unknown")
        self.c, d = c, c["d_model"]
        self.tok_emb = nn.Embedding(c["vocab"], d)
        self.pos_emb = nn.Embedding(c["max_len"], d) if c.get("pos_init", "") != "none" else None
        fuzzy = c["model"] == "fuzzy"
        self.blocks = nn.ModuleList([FuzzyBlock(c, routed) if fuzzy else BaselineBlock(c) for _ in range(c["layers"])])
        self.ln_f = nn.LayerNorm(d)
        self.drop = nn.Dropout(c["dropout"])

    def forward(self, ids):
        T = ids.size(1)
        x = self.tok_emb(ids)
        if self.pos_emb is not None:
            x = x + self.pos_emb.weight[:T]
        x = self.drop(x)
        ents = []
        for blk in self.blocks:
            x, h = blk(x)
            if h is not None:
                ents.append(h)
        return F.linear(self.ln_f(x), self.tok_emb.weight), ents

    def loss(self, ids, targets, smooth=True):
        """lm_loss_from_xy: the smoothed CE (per-token mean, as rpac) plus
        the entropy floor while training; pure CE otherwise."""
        logits, ents = self(ids)
        c = self.c
        V = logits.size(-1)
        ls = c["label_smooth"] if (self.training and smooth) else 0.0
        loss = F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1), label_smoothing=ls)
        if self.training and ents and c["R"] >= 2 and c["ent_floor_alpha"] > 0:
            hmean = torch.stack(ents).mean()
            pen = F.relu(c["ent_floor_eta"] * math.log(max(2, c["R"])) - hmean)
            loss = loss + c["ent_floor_alpha"] * 0.5 * pen
        return loss


def load_model(ckpt_dir, routed, device):
    with open(os.path.join(ckpt_dir, "state.json")) as f:
        cfg = json.load(f)["config"]
    m = RPACModel(cfg, routed)
    sd = read_safetensors(os.path.join(ckpt_dir, "model.safetensors"))
    own = m.state_dict()
    # rpac's store also holds running statistics and training buffers the
    # listing's modules do not have (blocks.i.attn.rpa_mu_mean.T*, ...).
    missing = [k for k in own if k not in sd]
    if missing:
        raise SystemExit(f"rpac_torch: the checkpoint lacks {missing[:5]}")
    m.load_state_dict({k: sd[k].reshape(own[k].shape).to(own[k].dtype) for k in own})
    return m.to(device), cfg


# ---------------------------------------------------------------- run

def fixed_loss(export, routed, device):
    m, _ = load_model(os.path.join(export, "checkpoint"), routed, device)
    m.eval()
    b = read_safetensors(os.path.join(export, "batch.safetensors"))
    ids, tg = b["input_ids"].long().to(device), b["targets"].long().to(device)
    with torch.no_grad():
        return float(m.loss(ids, tg))


def time_steps(export, cfg, args, compiled, routed):
    """Tokens/s of training steps; None and why where it cannot run."""
    if compiled and not hasattr(torch, "compile"):
        return {"skipped": f"torch.compile needs PyTorch 2 (this is {torch.__version__})"}
    dev = torch.device(args.device)
    m, _ = load_model(os.path.join(export, "checkpoint"), routed, dev)
    m.train()
    T = args.context or cfg.get("max_len")
    B = max(1, args.tokens_per_step // T)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.1)
    step_fn = torch.compile(m.loss) if compiled else m.loss
    g = torch.Generator(device="cpu").manual_seed(7)
    ids = torch.randint(0, cfg["vocab"], (B, T + 1), generator=g).to(dev)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)

    def step():
        with amp:
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync()
    warm = time.perf_counter() - t0
    n, t1 = 0, time.perf_counter()
    while n < args.steps and (n == 0 or time.perf_counter() - t1 < args.time_limit):
        step()
        n += 1
    sync()
    dt = (time.perf_counter() - t1) / n
    return {"T": T, "B": B, "steps": n, "warmup_s": round(warm, 3), "ms_per_step": round(1e3 * dt, 3),
            "tokens_per_s": round(B * T / dt, 1), "precision": "bf16 autocast" if dev.type == "cuda" else "fp32"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--context", type=int, default=0, help="T of the timed steps (default: the model's max_len)")
    ap.add_argument("--tokens-per-step", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds of timed steps at most, each variant")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with open(os.path.join(args.export, "rpac.json")) as f:
        rpac = json.load(f)
    res = {"torch": torch.__version__, "device": args.device, "preset": rpac.get("preset"), "rpac_loss": rpac["loss"],
           "batch": [rpac["batch"], rpac["context"]], "tol": args.tol}

    def save():
        # after every phase, so that a run stopped by its time limit keeps
        # what it measured
        if args.out:
            with open(args.out + ".tmp", "w") as f:
                f.write(json.dumps(res) + "\n")
            os.replace(args.out + ".tmp", args.out)

    ok = True
    for kind, routed in (("dense", False), ("routed", True)):
        loss = fixed_loss(args.export, routed, args.device)
        diff = abs(loss - rpac["loss"])
        res[f"loss_{kind}"], res[f"diff_{kind}"] = loss, diff
        ok = ok and diff <= args.tol
    res["loss_ok"] = ok
    save()
    if not args.no_timing:
        cfg = rpac["config"]
        for kind, compiled, routed in (("eager", False, False), ("compile", True, False), ("eager_routed", False, True)):
            res[kind] = time_steps(args.export, cfg, args, compiled, routed)
            if "skipped" in res[kind]:
                print(f"rpac_torch: torch.compile skipped: {res[kind]['skipped']}", file=sys.stderr)
            save()
    print(json.dumps(res))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
