"""Issue 11, stage 1: long-horizon nowcasting (jumps along the parameter trajectory) against the tuned plain
frontier and the null control, in a plain PyTorch loop.

Every run -- plain and jumping -- uses the same loop: AdamW (betas 0.9/0.999, eps 1e-8, no weight decay, as
the project's `clm_stdlib` task), gradient clipping at 1.0 (the Trainer's default), linear warmup then
cosine decay to 10% of the peak (or constant after warmup), one torch thread, CPU time by
`time.process_time()` with evaluation and checkpoint writing excluded. Compute units: a real step 3, a probe
forward over one training batch 1, a jump's own arithmetic 0.

Jumps: every `P` real steps (counted from the start or the last jump attempt) the last `c` snapshots,
`s` real steps apart (the last one is the current weights), predict the weights `k` schedule steps ahead.
Time is measured in cumulative learning rate (tau = sum of the schedule's multipliers), so a horizon
under a decaying schedule is shortened by the schedule itself. A jump is accepted only if its loss on
held-out TRAINING blocks (the probe set, never trained on, never the eval set) is below the current
weights'; otherwise it is rolled back. Its probe forwards count in the cost.

Accountings (issue 11): `bonus` -- the jump is free and training continues for the same real steps;
`replace` -- an accepted jump stands for `k` steps: the schedule and the data advance past `k` batches.
Null control for `replace`: skip the same batches (at the same real-step indices) with no jump.

Runs are keyed by their settings and appended to one JSON file per (task, schedule); finished runs are
skipped, so every command is resumable. Plain full-budget runs save checkpoints (in a scratch folder
outside the repository) from which jumping runs branch at their first jump: the run is bit-identical
up to there (dropout is seeded per schedule position), its prefix's CPU time is the plain run's.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

torch.set_num_threads(1)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RESULTS = HERE / "results" / "nowcast"
SCRATCH = Path(os.environ.get("NOWCAST_SCRATCH", "/tmp/nowcast_scratch"))
CKPT_EVERY = int(
    os.environ.get("NOWCAST_CKPT_EVERY", "250")
)  # full checkpoints of plain runs (branch points)
SNAP_EVERY = int(os.environ.get("NOWCAST_SNAP_EVERY", "50"))  # weight snapshots of plain runs


# ----------------------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class TaskCfg:
    n_layer: int
    n_embd: int
    n_head: int
    seq_len: int
    batch: int
    train_blocks: int
    eval_blocks: int
    probe_blocks: int
    corpus: str = "stdlib"  # "stdlib" (scored tasks) or "cheaders" (meta-training only: disjoint)


TASKS: dict[str, TaskCfg] = {
    # the project's clm_stdlib model (see hf_hybrid/bench/tasks.py::_build_clm), longer and with more data
    "gpt2_2x64": TaskCfg(2, 64, 2, 128, 16, 80000, 2048, 64),
    "gpt2_4x128": TaskCfg(4, 128, 4, 128, 16, 80000, 2048, 64),
    # end-to-end validation only
    "tiny": TaskCfg(1, 16, 2, 32, 4, 4096, 64, 16),
}


def build_model(cfg: TaskCfg, seed: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=256, n_positions=cfg.seq_len, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def _stdlib_blocks(seq_len: int, n_train: int, n_eval: int) -> tuple[torch.Tensor, torch.Tensor]:
    from hf_hybrid.data import stdlib_lm_datasets

    train, evaluation = stdlib_lm_datasets(block_size=seq_len, train_blocks=n_train, eval_blocks=n_eval)
    return (
        torch.tensor(train["input_ids"], dtype=torch.uint8),
        torch.tensor(evaluation["input_ids"], dtype=torch.uint8),
    )


def _cheader_blocks(seq_len: int, n_train: int, n_eval: int) -> tuple[torch.Tensor, torch.Tensor]:
    """C headers of the system (/usr/include): a corpus disjoint from the Python standard library."""
    files = sorted(Path("/usr/include").rglob("*.h"))
    blocks: list[bytes] = []
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        blocks.extend(data[i : i + seq_len] for i in range(0, len(data) - seq_len + 1, seq_len))
        if len(blocks) >= n_train + n_eval:
            break
    if len(blocks) < n_train + n_eval:
        raise ValueError(f"/usr/include yielded {len(blocks)} blocks, fewer than {n_train + n_eval}")
    tensor = torch.tensor([list(b) for b in blocks[: n_train + n_eval]], dtype=torch.uint8)
    return tensor[:n_train], tensor[n_train:]


def load_data(cfg: TaskCfg) -> dict[str, torch.Tensor]:
    """train stream, probe (held-out TRAINING blocks) and eval blocks, cached in the scratch folder."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    path = SCRATCH / f"data_{cfg.corpus}_{cfg.seq_len}_{cfg.train_blocks}_{cfg.eval_blocks}.pt"
    if path.exists():
        train, evaluation = torch.load(path)
    else:
        loader = _stdlib_blocks if cfg.corpus == "stdlib" else _cheader_blocks
        train, evaluation = loader(cfg.seq_len, cfg.train_blocks, cfg.eval_blocks)
        torch.save((train, evaluation), path)
    # the probe is a fixed, evenly spread subset of the training split, removed from the training stream
    stride = train.shape[0] // cfg.probe_blocks
    probe_idx = torch.arange(cfg.probe_blocks) * stride
    mask = torch.ones(train.shape[0], dtype=torch.bool)
    mask[probe_idx] = False
    return {"train": train[mask], "probe": train[probe_idx], "eval": evaluation}


class Stream:
    """Batch at schedule position p: a seeded permutation per epoch; a skipped batch is simply never used."""

    def __init__(self, train: torch.Tensor, batch: int, seed: int):
        self.train, self.batch, self.seed = train, batch, seed
        self.per_epoch = train.shape[0] // batch
        self._perms: dict[int, torch.Tensor] = {}

    def __call__(self, pos: int) -> torch.Tensor:
        epoch, i = divmod(pos, self.per_epoch)
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._perms = {epoch: torch.randperm(self.train.shape[0], generator=gen)}
        idx = self._perms[epoch][i * self.batch : (i + 1) * self.batch]
        return self.train[idx].long()


# -------------------------------------------------------------------------------------------- schedule
def multiplier(pos: int, n: int, warmup: int, kind: str) -> float:
    if pos < warmup:
        return (pos + 1) / warmup
    if kind == "constant":
        return 1.0
    if kind == "cosine":
        progress = min(1.0, (pos - warmup) / max(1, n - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(kind)


def tau_table(n: int, warmup: int, kind: str) -> list[float]:
    """tau[p] = sum of the multipliers of positions < p (cumulative learning rate), p = 0..n."""
    out = [0.0]
    for p in range(n):
        out.append(out[-1] + multiplier(p, n, warmup, kind))
    return out


# ---------------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class Spec:
    task: str
    schedule: str  # cosine | constant
    lr: float
    seed: int
    n: int  # schedule length in positions (the run's budget for plain runs)
    warmup: int
    method: str = "plain"  # plain | linefit | denoise | learned | null
    accounting: str = ""  # bonus | replace (jumping runs); replace (null)
    c: int = 0
    s: int = 0
    p: int = 0
    k: int = 0
    probe: int = 0  # probe batches per candidate
    alphas: str = ""  # denoise: candidate drift fractions, "0,0.5,1"
    blind: bool = False  # accept every jump (no probe)
    skips: str = ""  # null replay: real-step indices at which k batches are skipped ("" = every attempt)
    eval_every: int = 500

    def key(self) -> str:
        d = asdict(self)
        return "|".join(f"{k}={v}" for k, v in d.items() if v not in ("", 0, False) or k in ("seed",))

    def base_key(self) -> str:
        return f"{self.task}|{self.schedule}|lr={self.lr}|seed={self.seed}|n={self.n}|w={self.warmup}"


def warmup_for(n: int, schedule: str, full_n: int) -> int:
    """5% of the run's budget for cosine runs (each budget its own schedule); constant: 5% of the full N."""
    return max(1, round(0.05 * (n if schedule == "cosine" else full_n)))


# ------------------------------------------------------------------------------------------- helpers
def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def set_flat(model: torch.nn.Module, vec: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(vec[offset : offset + n].view_as(p))
            offset += n


def segments(model: torch.nn.Module) -> list[tuple[str, int]]:
    return [(name, p.numel()) for name, p in model.named_parameters()]


@torch.no_grad()
def mean_loss(model: torch.nn.Module, blocks: torch.Tensor, batch: int) -> float:
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, blocks.shape[0], batch):
        x = blocks[i : i + batch].long()
        total += model(input_ids=x, labels=x).loss.item() * x.shape[0]
        count += x.shape[0]
    model.train(was_training)
    return total / count


class Clock:
    """Process CPU time with pauses (evaluation and checkpoint writing are not training)."""

    def __init__(self, offset: float = 0.0):
        self.total = offset
        self._start: float | None = None

    def start(self) -> None:
        self._start = time.process_time()

    def stop(self) -> None:
        if self._start is not None:
            self.total += time.process_time() - self._start
            self._start = None

    def now(self) -> float:
        return self.total + (time.process_time() - self._start if self._start is not None else 0.0)


# --------------------------------------------------------------------------------------------- jumps
def linefit(snaps: torch.Tensor, taus: torch.Tensor, target: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per element least-squares line through the snapshots in tau: (mean, slope * (target - mean tau))."""
    t = taus - taus.mean()
    mean = snaps.mean(0)
    slope = (t[:, None] * (snaps - mean)).sum(0) / (t * t).sum()
    return mean, slope * (target - taus.mean())


def jump_candidates(spec: Spec, snaps: torch.Tensor, taus: torch.Tensor, target: float, model, nowcaster):
    """[(label, flat weights)] to compare on the probe."""
    if spec.method == "linefit":
        mean, drift = linefit(snaps, taus, target)
        return [("linefit", mean + drift)]
    if spec.method == "denoise":
        mean, drift = linefit(snaps, taus, target)
        return [(f"alpha={a:g}", mean + a * drift) for a in (float(x) for x in spec.alphas.split(","))]
    if spec.method == "learned":
        return [("learned", nowcaster.predict(snaps, taus, target, segments(model)))]
    raise ValueError(spec.method)


# ------------------------------------------------------------------------------------------- the run
def run(
    spec: Spec, data: dict[str, torch.Tensor], store: dict, save_ckpt: bool = False, nowcaster=None
) -> dict:
    cfg = TASKS[spec.task]
    model = build_model(cfg, spec.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    stream = Stream(data["train"], cfg.batch, spec.seed)
    tau = tau_table(spec.n, spec.warmup, spec.schedule)
    jumping = spec.method not in ("plain",)
    c, s, P, k = spec.c, spec.s, spec.p, spec.k
    snap_offsets = {P - (c - 1 - i) * s: i for i in range(c)} if jumping and spec.method != "null" else {}
    skip_at = {int(x) for x in spec.skips.split(",")} if spec.skips else None

    pos = real = since = 0
    units = 0.0
    curve: list[dict] = []
    events: list[dict] = []
    snaps: dict[int, tuple[int, torch.Tensor]] = {}
    clock = Clock()
    ckpt_dir = SCRATCH / "ckpt" / spec.base_key().replace("|", "_")

    # fast-forward: while no jump has been accepted (and nothing skipped) the run is bit-identical to the
    # plain run at the same lr and seed, so it can resume from that run's checkpoint at its next jump
    # attempt; the segment fast-forwarded is charged the plain run's own units and CPU time
    plain_key = Spec(
        spec.task, spec.schedule, spec.lr, spec.seed, spec.n, spec.warmup, eval_every=spec.eval_every
    )
    plain = store["runs"].get(plain_key.key()) if jumping else None
    plain_snaps: dict[int, torch.Tensor] = {}
    if plain is not None and (ckpt_dir / "snaps.pt").exists():
        plain_snaps = torch.load(ckpt_dir / "snaps.pt")
    forwarded: list[tuple[int, int]] = []

    def fast_forward() -> bool:
        nonlocal pos, real, since, units
        if plain is None or P <= 0 or real != pos:
            return False
        target = pos + (P - since)
        anchor = pos - since
        if target + k > spec.n:  # no further attempt: the rest of the run is the plain run's
            target = spec.n
        wanted = [anchor + off for off in snap_offsets if pos < anchor + off <= target]
        if any(w not in plain_snaps for w in wanted):
            return False
        f_to, f_from = ckpt_dir / f"full_{target}.pt", ckpt_dir / f"full_{pos}.pt"
        if not f_to.exists() or not (pos == 0 or f_from.exists()):
            return False
        state = torch.load(f_to)
        cpu_from = torch.load(f_from)["cpu"] if pos > 0 else 0.0
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        extra_units = units - 3.0 * real  # probe forwards so far
        cpu_offset = clock.total - cpu_from
        clock.total += state["cpu"] - cpu_from
        units += 3.0 * (target - pos)
        for pt in plain["curve"]:
            if pos < pt["real"] <= target:
                curve.append(pt | {"units": pt["units"] + extra_units, "cpu": pt["cpu"] + cpu_offset})
        for off in snap_offsets:
            if pos < anchor + off <= target:
                snaps[off] = (off, plain_snaps[anchor + off])
        forwarded.append((pos, target))
        real += target - pos
        since += target - pos
        pos = target
        return True

    if since == 0 and 0 in snap_offsets:
        snaps[0] = (0, flat_params(model))
    if jumping:
        fast_forward()

    def evaluate() -> None:
        running = clock._start is not None
        clock.stop()
        loss = mean_loss(model, data["eval"], 64)
        curve.append({"pos": pos, "real": real, "units": units, "cpu": clock.total, "loss": loss})
        print(f"  [{spec.method}/{spec.accounting or '-'}] pos {pos} real {real} units {units:.0f} "
              f"cpu {clock.total:.1f}s eval {loss:.4f}", flush=True)  # fmt: skip
        if running:
            clock.start()

    def save(kind: str) -> None:
        clock.stop()
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if kind == "full":
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "cpu": clock.total},
                       ckpt_dir / f"full_{pos}.pt")  # fmt: skip
        else:
            torch.save(saved_snaps, ckpt_dir / "snaps.pt")
        clock.start()

    saved_snaps: dict[int, torch.Tensor] = {0: flat_params(model)} if save_ckpt else {}
    ckpt_limit = spec.n
    wall0 = time.time()
    clock.start()
    while pos < spec.n:
        if jumping and since == P and pos + k <= spec.n:
            attempt = len(events)
            order = sorted(snaps)
            if spec.method == "null":
                do_skip = skip_at is None or real in skip_at
                if do_skip:
                    pos += k
                events.append({"real": real, "pos": pos, "accepted": do_skip})
            else:
                flats = torch.stack([snaps[o][1] for o in order])
                taus = torch.tensor([tau[pos - (P - o)] for o in order], dtype=torch.float64).float()
                target = tau[pos + k] if spec.accounting == "replace" else tau[min(spec.n, pos + k)]
                current = flat_params(model)
                cands = jump_candidates(spec, flats, taus, target, model, nowcaster)
                ev = {"real": real, "pos": pos, "attempt": attempt}
                if spec.blind:
                    label, best = cands[0]
                    accepted = bool(torch.isfinite(best).all())
                    ev.update(choice=label)
                else:
                    base = mean_loss(model, data["probe"][: spec.probe * cfg.batch], cfg.batch)
                    scores = []
                    for label, vec in cands:
                        if not torch.isfinite(vec).all():
                            scores.append((math.inf, label, vec))
                            continue
                        set_flat(model, vec)
                        scores.append((mean_loss(model, data["probe"][: spec.probe * cfg.batch], cfg.batch),
                                       label, vec))  # fmt: skip
                    units += spec.probe * (1 + len(cands))
                    loss_best, label, best = min(scores, key=lambda x: x[0])
                    accepted = loss_best < base
                    ev.update(probe_before=base, probe_after=loss_best, choice=label,
                              probe_all={lab: sc for sc, lab, _ in scores})  # fmt: skip
                ev["jump_norm"] = float((best - current).norm())
                ev["step_norm"] = float((current - snaps[order[0]][1]).norm())
                if accepted:
                    set_flat(model, best)
                    if spec.accounting == "replace":
                        pos += k
                    evaluate()  # diagnostic only (not charged): the eval loss right after the jump
                    curve[-1]["after_jump"] = True
                else:
                    set_flat(model, current)
                ev["accepted"] = bool(accepted)
                events.append(ev)
                before, after = ev.get("probe_before", math.nan), ev.get("probe_after", math.nan)
                print(
                    f"  jump @real {real}: {ev.get('choice')} accepted={accepted} "
                    f"probe {before:.4f}->{after:.4f}",
                    flush=True,
                )
            since = 0
            snaps = {}
            if 0 in snap_offsets:
                snaps[0] = (0, flat_params(model))
            if not any(e["accepted"] for e in events):
                clock.stop()
                fast_forward()
                clock.start()
            continue

        lr = spec.lr * multiplier(pos, spec.n, spec.warmup, spec.schedule)
        for group in opt.param_groups:
            group["lr"] = lr
        torch.manual_seed(spec.seed * 1_000_003 + pos)  # dropout: a function of the position only
        x = stream(pos)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        pos += 1
        real += 1
        since += 1
        units += 3.0
        if not math.isfinite(loss.item()):
            print("  diverged", flush=True)
            break
        if since in snap_offsets:
            snaps[since] = (since, flat_params(model))
        if save_ckpt and pos <= ckpt_limit:
            if pos % SNAP_EVERY == 0:
                saved_snaps[pos] = flat_params(model)
            if pos % CKPT_EVERY == 0:
                save("full")
            if pos % 1000 == 0 or pos == spec.n:
                save("snaps")
        if real % spec.eval_every == 0 or pos >= spec.n:
            evaluate()
    clock.stop()
    if not curve or curve[-1]["real"] != real or curve[-1]["pos"] != pos:
        evaluate()
    return {
        "key": spec.key(),
        "spec": asdict(spec),
        "final_loss": curve[-1]["loss"],
        "units": units,
        "cpu": clock.total,
        "wall": time.time() - wall0,
        "real": real,
        "curve": curve,
        "events": events,
        "branch": {"from": plain["key"], "segments": forwarded} if forwarded else None,
        "n_params": sum(p.numel() for p in model.parameters()),
    }


# ------------------------------------------------------------------------------------------- storage
def store_path(task: str, schedule: str, tag: str = "") -> Path:
    return RESULTS / f"{task}_{schedule}{('_' + tag) if tag else ''}.json"


def load_store(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"runs": {}}


def save_store(path: Path, store: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(store, indent=1))
    tmp.replace(path)


def ensure(spec: Spec, path: Path, data, save_ckpt: bool = False, nowcaster=None) -> dict:
    store = load_store(path)
    if spec.key() in store["runs"]:
        return store["runs"][spec.key()]
    print(f"RUN {spec.key()}", flush=True)
    record = run(spec, data, store, save_ckpt=save_ckpt, nowcaster=nowcaster)
    store = load_store(path)  # re-read: append only
    store["runs"][spec.key()] = record
    save_store(path, store)
    print(f"DONE final {record['final_loss']:.4f} units {record['units']:.0f} cpu {record['cpu']:.1f}s "
          f"wall {record['wall']:.0f}s", flush=True)  # fmt: skip
    return record


# ---------------------------------------------------------------------------------------------- CLI
def plain_spec(args, lr: float, seed: int, n: int) -> Spec:
    return Spec(args.task, args.schedule, lr, seed, n, warmup_for(n, args.schedule, args.n),
                eval_every=args.eval_every)  # fmt: skip


def best_lr(args, path: Path) -> float:
    store = load_store(path)
    runs = [
        r
        for r in store["runs"].values()
        if r["spec"]["method"] == "plain" and r["spec"]["seed"] == 0 and r["spec"]["n"] == args.n
    ]
    if not runs:
        raise SystemExit("no sweep yet")
    return min(runs, key=lambda r: r["final_loss"])["spec"]["lr"]


def cmd_sweep(args, data) -> None:
    path = store_path(args.task, args.schedule, args.tag)
    lrs = [float(x) for x in args.lrs.split(",")]
    while True:
        for lr in lrs:
            ensure(plain_spec(args, lr, 0, args.n), path, data, save_ckpt=True)
        store = load_store(path)
        results = {lr: store["runs"][plain_spec(args, lr, 0, args.n).key()]["final_loss"] for lr in lrs}
        best = min(results, key=results.get)
        print("sweep:", {f"{lr:g}": round(v, 4) for lr, v in sorted(results.items())}, "best", best)
        lrs_sorted = sorted(lrs)
        if best == lrs_sorted[-1] and len(lrs) < args.max_lrs:
            lrs.append(best * 2)
        elif best == lrs_sorted[0] and len(lrs) < args.max_lrs:
            lrs.append(best / 2)
        else:
            return


def cmd_frontier(args, data) -> None:
    path = store_path(args.task, args.schedule, args.tag)
    lr = args.lr or best_lr(args, path)
    for seed in args.seeds:
        ensure(plain_spec(args, lr, seed, args.n), path, data, save_ckpt=True)
        if args.schedule == "cosine":
            for frac in (0.25, 0.5, 0.75):
                ensure(plain_spec(args, lr, seed, round(frac * args.n)), path, data)


def variant_spec(args, lr: float, seed: int, method: str, accounting: str, skips: str = "") -> Spec:
    return Spec(
        args.task, args.schedule, lr, seed, args.n, warmup_for(args.n, args.schedule, args.n),
        method=method, accounting=accounting, c=args.c, s=args.s, p=args.p, k=args.k,
        probe=0 if (args.blind or method == "null") else args.probe,
        alphas=args.alphas if method == "denoise" else "", blind=args.blind and method != "null",
        skips=skips, eval_every=args.eval_every,
    )  # fmt: skip


def cmd_variants(args, data) -> None:
    path = store_path(args.task, args.schedule, args.tag)
    lr = args.lr or best_lr(args, path)
    nowcaster = None
    if "learned" in args.methods:
        from nowcast_learned import Nowcaster

        nowcaster = Nowcaster.load(RESULTS / "nowcaster")
    for seed in args.seeds:
        # the plain full run at this lr and seed first (it is the branch point and a frontier point)
        ensure(plain_spec(args, lr, seed, args.n), path, data, save_ckpt=True)
        for method in args.methods:
            for accounting in args.accountings:
                if method == "null" and accounting != "replace":
                    continue
                rec = ensure(
                    variant_spec(args, lr, seed, method, accounting), path, data, nowcaster=nowcaster
                )
                if method != "null" and accounting == "replace":
                    accepted = [e["real"] for e in rec["events"] if e["accepted"]]
                    attempts = [e["real"] for e in rec["events"]]
                    all_null = variant_spec(args, lr, seed, "null", "replace")
                    ensure(all_null, path, data)
                    if accepted and accepted != attempts:
                        replay = variant_spec(
                            args, lr, seed, "null", "replace", skips=",".join(map(str, accepted))
                        )
                        ensure(replay, path, data)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["sweep", "frontier", "variants", "report"])
    ap.add_argument("--task", default="gpt2_2x64", choices=sorted(TASKS))
    ap.add_argument("--schedule", default="cosine", choices=["cosine", "constant"])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--tag", default="")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--lrs", default="4e-3,8e-3,1.6e-2")
    ap.add_argument("--max-lrs", type=int, default=6)
    ap.add_argument("--lr", type=float, default=0.0, help="default: the sweep's best (seed 0)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--methods", nargs="+", default=["linefit", "denoise", "learned", "null"])
    ap.add_argument("--accountings", nargs="+", default=["bonus", "replace"])
    ap.add_argument("--c", type=int, default=5)
    ap.add_argument("--s", type=int, default=100)
    ap.add_argument("--p", type=int, default=1000)
    ap.add_argument("--k", type=int, default=500)
    ap.add_argument("--probe", type=int, default=4)
    ap.add_argument("--alphas", default="0,0.25,0.5,1")
    ap.add_argument("--blind", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "report":
        from nowcast_report import report

        report(args)
        return
    if (args.c - 1) * args.s > args.p:
        raise SystemExit("need (c - 1) * s <= P")
    data = load_data(TASKS[args.task])
    {"sweep": cmd_sweep, "frontier": cmd_frontier, "variants": cmd_variants}[args.cmd](args, data)


if __name__ == "__main__":
    main()
