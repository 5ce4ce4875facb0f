"""The learned nowcaster of issue 11 (stage 1): a small per-element MLP on the normalised snapshot history.

Meta-training data come from task families DISJOINT from the scored ones: byte-level GPT-2s of other
widths and depths (1x32, 2x32, 3x48, 2x96; held out: 2x48) trained on a different corpus (the system's C
headers under /usr/include, not Python) with AdamW, cosine or constant schedules and several learning
rates. Weights are recorded every 25 steps; a training example is one parameter element of one window:
`c` snapshots `s` steps apart ending at step t, target the real weights at t + k.

Features of an element (NiNo-like in spirit -- per-tensor scaling, residual prediction from the last
state, conditioning on the horizon -- but an MLP of our own): the differences of the earlier snapshots to
the last one divided by the tensor's scale sigma = RMS over the tensor of (last - first snapshot); the
snapshots' times and the horizon in cumulative learning rate, relative to the window's span; the element's
standardised value; the tensor's kind (matrix, embedding, LayerNorm gain, bias). Target: (theta(t+k) -
last) / sigma. Loss: mean squared error in those units.

    python benchmarks/experiments/nowcast_learned.py record   # the trajectories (scratch folder)
    python benchmarks/experiments/nowcast_learned.py train    # weights + errors -> results/nowcast/nowcaster/
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nowcast as nc  # noqa: E402

OUT = nc.RESULTS / "nowcaster"
TRAJ = nc.SCRATCH / "trajectories"
RECORD_EVERY = 25
CTX = 5
SPACINGS = (50, 100, 200)
HORIZONS = (100, 250, 500, 750, 1000)
KINDS = ("matrix", "embedding", "ln_gain", "bias")

# (name, layers, width, schedule, lr, steps, seed); the last is held out from meta-training
RECORDINGS = (
    ("c1x32_cos", 1, 32, "cosine", 1.6e-2, 2500, 100),
    ("c2x32_const", 2, 32, "constant", 8e-3, 2500, 101),
    ("c3x48_cos", 3, 48, "cosine", 8e-3, 2500, 102),
    ("c2x96_cos", 2, 96, "cosine", 4e-3, 2500, 103),
    ("c2x48_cos_heldout", 2, 48, "cosine", 1.2e-2, 2500, 104),
)
HELD_OUT = "c2x48_cos_heldout"


# ------------------------------------------------------------------------------------------ features
def features(snaps: torch.Tensor, taus: torch.Tensor, target: float, seg: list[tuple[str, int, int]]):
    """snaps (c, n) -> (n, F) features and the per-element sigma (n,).  seg: (name, numel, kind)."""
    c, n = snaps.shape
    last = snaps[-1]
    diffs = snaps[:-1] - last  # (c-1, n)
    sigma = torch.empty(n)
    value = torch.empty(n)
    kind = torch.empty(n, dtype=torch.long)
    offset = 0
    for _, numel, k in seg:
        sl = slice(offset, offset + numel)
        move = (last[sl] - snaps[0][sl]).pow(2).mean().sqrt()
        sigma[sl] = move.clamp_min(1e-12)
        std = last[sl].std() if numel > 1 else last[sl].abs().mean()
        value[sl] = (last[sl] - last[sl].mean()) / (std + 1e-8)
        kind[sl] = k
        offset += numel
    span = float(taus[-1] - taus[0])
    rel_t = ((taus[:-1] - taus[-1]) / span).float()
    h = (target - float(taus[-1])) / span
    feats = torch.cat(
        [
            (diffs / sigma).T.clamp(-50, 50),
            rel_t.expand(n, c - 1),
            torch.full((n, 1), h),
            value.clamp(-10, 10)[:, None],
            nn.functional.one_hot(kind, len(KINDS)).float(),
        ],
        dim=1,
    )
    return feats, sigma


class MLP(nn.Module):
    def __init__(self, n_in: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


class Nowcaster:
    def __init__(self, mlp: MLP, mean: torch.Tensor, std: torch.Tensor):
        self.mlp, self.mean, self.std = mlp.eval(), mean, std

    @classmethod
    def load(cls, folder: Path) -> Nowcaster:
        from safetensors.torch import load_file

        tensors = load_file(str(folder / "nowcaster.safetensors"))
        mlp = MLP(tensors["feat_mean"].numel(), tensors["mlp.net.0.weight"].shape[0])
        mlp.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("mlp.")})
        return cls(mlp, tensors["feat_mean"], tensors["feat_std"])

    @torch.no_grad()
    def predict_scaled(self, feats: torch.Tensor) -> torch.Tensor:
        out = []
        for i in range(0, feats.shape[0], 65536):
            out.append(self.mlp((feats[i : i + 65536] - self.mean) / self.std))
        return torch.cat(out).clamp(-50, 50)

    @torch.no_grad()
    def predict(self, snaps, taus, target, segs: list[tuple[str, int]]) -> torch.Tensor:
        seg = seg_kinds(segs)
        feats, sigma = features(snaps, taus, target, seg)
        return snaps[-1] + self.predict_scaled(feats) * sigma


def seg_kinds(segs: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    out = []
    for name, numel in segs:
        if name.endswith("bias"):
            k = 3
        elif ".ln_" in name or name.startswith("transformer.ln_f") or ".ln_f" in name:
            k = 2
        elif "wte" in name or "wpe" in name:
            k = 1
        else:
            k = 0
        out.append((name, numel, k))
    return out


# ----------------------------------------------------------------------------------------- recording
def record(args) -> None:
    TRAJ.mkdir(parents=True, exist_ok=True)
    base = nc.TaskCfg(2, 32, 2, 128, 16, 40000, 256, 16, corpus="cheaders")
    data = nc.load_data(base)
    for name, layers, width, schedule, lr, steps, seed in RECORDINGS:
        path = TRAJ / f"{name}.pt"
        if path.exists():
            continue
        cfg = replace(base, n_layer=layers, n_embd=width)
        model = nc.build_model(cfg, seed)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        stream = nc.Stream(data["train"], cfg.batch, seed)
        warmup = round(0.05 * steps)
        snaps = {0: nc.flat_params(model)}
        t0 = time.process_time()
        for pos in range(steps):
            for g in opt.param_groups:
                g["lr"] = lr * nc.multiplier(pos, steps, warmup, schedule)
            torch.manual_seed(seed * 1_000_003 + pos)
            x = stream(pos)
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if (pos + 1) % RECORD_EVERY == 0:
                snaps[pos + 1] = nc.flat_params(model)
            if (pos + 1) % 500 == 0:
                ev = nc.mean_loss(model, data["eval"], 64)
                print(f"{name} step {pos + 1} train {loss.item():.3f} eval {ev:.3f}", flush=True)
        ev = nc.mean_loss(model, data["eval"], 64)
        torch.save(
            {
                "snaps": torch.stack([snaps[p] for p in sorted(snaps)]),
                "steps": sorted(snaps),
                "tau": nc.tau_table(steps, warmup, schedule),
                "segs": nc.segments(model),
                "meta": {
                    "layers": layers,
                    "width": width,
                    "schedule": schedule,
                    "lr": lr,
                    "steps": steps,
                    "seed": seed,
                    "cpu": time.process_time() - t0,
                    "final_eval": ev,
                },  # fmt: skip
            },
            path,
        )
        print(f"recorded {name}: {time.process_time() - t0:.0f}s cpu", flush=True)


# ------------------------------------------------------------------------------------------ examples
def windows(traj: dict, gen: torch.Generator, count: int):
    """Random (snaps, taus, target tau, target weights) windows of a recorded trajectory."""
    steps, tau = traj["steps"], traj["tau"]
    index = {p: i for i, p in enumerate(steps)}
    last_step = steps[-1]
    out = []
    while len(out) < count:
        s = SPACINGS[int(torch.randint(len(SPACINGS), (1,), generator=gen))]
        k = HORIZONS[int(torch.randint(len(HORIZONS), (1,), generator=gen))]
        lo, hi = (CTX - 1) * s + 100, last_step - k
        if hi <= lo:
            continue
        end = lo + RECORD_EVERY * int(torch.randint((hi - lo) // RECORD_EVERY + 1, (1,), generator=gen))
        pts = [end - (CTX - 1 - i) * s for i in range(CTX)]
        snaps = traj["snaps"][[index[p] for p in pts]]
        taus = torch.tensor([tau[p] for p in pts], dtype=torch.float64)
        out.append((snaps, taus, tau[end + k], traj["snaps"][index[end + k]], s, k))
    return out


def examples(trajs: dict[str, dict], names: list[str], per_traj: int, per_window: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    xs, ys, base = [], [], []
    for name in names:
        traj = trajs[name]
        seg = seg_kinds(traj["segs"])
        for snaps, taus, target, truth, _, _ in windows(traj, gen, per_traj):
            feats, sigma = features(snaps, taus, target, seg)
            y = ((truth - snaps[-1]) / sigma).clamp(-50, 50)
            # stratified: every tensor gets elements, large tensors more
            idx = []
            offset = 0
            for _, numel, _ in seg:
                m = min(numel, max(32, per_window * numel // snaps.shape[1]))
                idx.append(offset + torch.randperm(numel, generator=gen)[:m])
                offset += numel
            idx = torch.cat(idx)
            mean, drift = nc.linefit(snaps[:, idx].double(), taus, target)
            xs.append(feats[idx])
            ys.append(y[idx])
            base.append(
                torch.stack(
                    [
                        torch.zeros(len(idx)),  # last snapshot
                        ((snaps[:, idx].mean(0) - snaps[-1, idx]) / sigma[idx]),  # snapshots' mean
                        ((mean + drift).float() - snaps[-1, idx]) / sigma[idx],  # linefit in tau
                    ],
                    dim=1,
                ).clamp(-50, 50)
            )
    return torch.cat(xs), torch.cat(ys), torch.cat(base)


def errors(pred: torch.Tensor, y: torch.Tensor, base: torch.Tensor) -> dict[str, float]:
    out = {name: float((base[:, i] - y).pow(2).mean()) for i, name in enumerate(("last", "mean", "linefit"))}
    if pred is not None:
        out["learned"] = float((pred - y).pow(2).mean())
    return out


def train(args) -> None:
    trajs = {name: torch.load(TRAJ / f"{name}.pt") for name, *_ in RECORDINGS}
    train_names = [n for n in trajs if n != HELD_OUT]
    x, y, base = examples(trajs, train_names, args.windows, args.per_window, seed=0)
    xv, yv, basev = examples(trajs, [HELD_OUT], args.windows, args.per_window, seed=1)
    # a validation split of the training families' windows (different windows, same runs)
    xt, yt, baset = examples(trajs, train_names, max(8, args.windows // 4), args.per_window, seed=2)
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    std[-len(KINDS) :] = 1.0
    mean[-len(KINDS) :] = 0.0
    torch.manual_seed(0)
    mlp = MLP(x.shape[1], args.hidden)
    opt = torch.optim.AdamW(mlp.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)
    xn = (x - mean) / std
    t0 = time.process_time()
    for step in range(args.steps):
        idx = torch.randint(x.shape[0], (args.batch,))
        loss = (mlp(xn[idx]) - y[idx]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % 2000 == 0:
            with torch.no_grad():
                v = (mlp((xv - mean) / std) - yv).pow(2).mean()
            print(f"step {step + 1} train {loss.item():.4f} held-out {v.item():.4f}", flush=True)
    cast = Nowcaster(mlp, mean, std)
    report = {
        "train_examples": int(x.shape[0]),
        "held_out_examples": int(xv.shape[0]),
        "train_families": [r for r in RECORDINGS if r[0] != HELD_OUT],
        "held_out_family": [r for r in RECORDINGS if r[0] == HELD_OUT],
        "features": x.shape[1],
        "hidden": args.hidden,
        "meta_train_steps": args.steps,
        "meta_train_cpu_s": time.process_time() - t0,
        "recording_cpu_s": {n: t["meta"]["cpu"] for n, t in trajs.items()},
        "mse_normalised": {
            "train": errors(cast.predict_scaled(x), y, base),
            "train_families_new_windows": errors(cast.predict_scaled(xt), yt, baset),
            "held_out_family": errors(cast.predict_scaled(xv), yv, basev),
        },
        "by_horizon_held_out": by_horizon(cast, trajs[HELD_OUT]),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    tensors = {f"mlp.{k}": v.contiguous() for k, v in mlp.state_dict().items()}
    tensors.update(feat_mean=mean.contiguous(), feat_std=std.contiguous())
    save_file(tensors, str(OUT / "nowcaster.safetensors"))
    (OUT / "meta_training.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report["mse_normalised"], indent=1))


def by_horizon(cast: Nowcaster, traj: dict) -> dict:
    """Held-out MSE by (spacing, horizon), all elements of a few windows, in sigma units."""
    gen = torch.Generator().manual_seed(3)
    seg = seg_kinds(traj["segs"])
    acc: dict[str, list[dict]] = {}
    for snaps, taus, target, truth, s, k in windows(traj, gen, 60):
        feats, sigma = features(snaps, taus, target, seg)
        y = ((truth - snaps[-1]) / sigma).clamp(-50, 50)
        mean, drift = nc.linefit(snaps.double(), taus, target)
        base = torch.stack(
            [
                torch.zeros_like(y),
                (snaps.mean(0) - snaps[-1]) / sigma,
                ((mean + drift).float() - snaps[-1]) / sigma,
            ],
            dim=1,
        ).clamp(-50, 50)
        acc.setdefault(f"s={s},k={k}", []).append(errors(cast.predict_scaled(feats), y, base))
    return {
        key: {m: sum(e[m] for e in v) / len(v) for m in v[0]} | {"windows": len(v)}
        for key, v in sorted(acc.items())
    }


def score_on(args) -> None:
    """Parameter-space errors on a scored task's recorded plain trajectory (diagnostic, not used to fit)."""
    cast = Nowcaster.load(OUT)
    folder = Path(args.ckpt_dir)
    saved = torch.load(folder / "snaps.pt")
    steps = sorted(saved)
    tau = nc.tau_table(args.n, args.warmup, args.schedule)
    from transformers import GPT2Config  # noqa: F401  (segments need the model)

    model = nc.build_model(nc.TASKS[args.task], 0)
    seg = seg_kinds(nc.segments(model))
    results = {}
    for s in (50, 100):
        for k in (250, 500):
            errs = []
            for end in steps:
                pts = [end - (CTX - 1 - i) * s for i in range(CTX)]
                if pts[0] < 250 or end + k not in saved or any(p not in saved for p in pts):
                    continue
                snaps = torch.stack([saved[p] for p in pts])
                taus = torch.tensor([tau[p] for p in pts], dtype=torch.float64)
                feats, sigma = features(snaps, taus, tau[end + k], seg)
                y = ((saved[end + k] - snaps[-1]) / sigma).clamp(-50, 50)
                mean, drift = nc.linefit(snaps.double(), taus, tau[end + k])
                base = torch.stack(
                    [torch.zeros_like(y), (snaps.mean(0) - snaps[-1]) / sigma,
                     ((mean + drift).float() - snaps[-1]) / sigma], dim=1,
                ).clamp(-50, 50)  # fmt: skip
                errs.append(errors(cast.predict_scaled(feats), y, base))
            if errs:
                results[f"s={s},k={k}"] = {m: sum(e[m] for e in errs) / len(errs) for m in errs[0]} | {
                    "windows": len(errs)
                }
    out = OUT / f"scored_task_{args.task}_{args.schedule}.json"
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["record", "train", "score"])
    ap.add_argument("--windows", type=int, default=120, help="windows per trajectory")
    ap.add_argument("--per-window", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--ckpt-dir", default="")
    ap.add_argument("--task", default="gpt2_2x64")
    ap.add_argument("--schedule", default="cosine")
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=250)
    args = ap.parse_args()
    {"record": record, "train": train, "score": score_on}[args.cmd](args)


if __name__ == "__main__":
    main()
