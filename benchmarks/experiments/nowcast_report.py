"""Tables of the nowcasting experiment from its JSON (every ratio from runs recorded there).

python benchmarks/experiments/nowcast.py report --task gpt2_2x64 --schedule cosine
"""

from __future__ import annotations

import statistics
from pathlib import Path

import nowcast as nc


def _frontier(runs: list[dict], spec_lr: float, seed: int, n: int, schedule: str):
    """(units, loss) and (cpu, loss) points of the plain frontier for one seed."""
    plain = [
        r
        for r in runs
        if r["spec"]["method"] == "plain" and r["spec"]["lr"] == spec_lr and r["spec"]["seed"] == seed
    ]
    if schedule == "cosine":
        pts = [r for r in plain if r["spec"]["n"] in (n, round(0.25 * n), round(0.5 * n), round(0.75 * n))]
        units = [(r["units"], r["final_loss"]) for r in pts]
        cpu = [(r["cpu"], r["final_loss"]) for r in pts]
        budgets = sorted((r["spec"]["n"], r["final_loss"], r["units"], r["cpu"]) for r in pts)
    else:
        full = [r for r in plain if r["spec"]["n"] == n]
        if not full:
            return [], [], []
        curve = full[0]["curve"]
        units = [(pt["units"], pt["loss"]) for pt in curve]
        cpu = [(pt["cpu"], pt["loss"]) for pt in curve]
        budgets = [(pt["real"], pt["loss"], pt["units"], pt["cpu"]) for pt in curve]
    return units, cpu, budgets


def _fmt_speed(sp) -> str:
    mark = {"lower_bound": ">", "upper_bound": "<", "interpolated": "", "diverged": "div "}[sp.kind]
    return f"{mark}{sp.ratio:.2f}x"


def report(args) -> None:
    from hf_hybrid.bench.frontier import speedup

    path = nc.store_path(args.task, args.schedule, args.tag)
    store = nc.load_store(path)
    runs = list(store["runs"].values())
    n = args.n
    lines = [f"## {args.task}, {args.schedule}, N = {n}", ""]
    sweep = sorted(
        (r["spec"]["lr"], r["final_loss"], r["cpu"])
        for r in runs
        if r["spec"]["method"] == "plain" and r["spec"]["seed"] == 0 and r["spec"]["n"] == n
    )
    lines += ["Plain lr sweep (seed 0, full N):", "", "| lr | final eval loss | CPU s |", "|---|---|---|"]
    lines += [f"| {lr:g} | {loss:.4f} | {cpu:.0f} |" for lr, loss, cpu in sweep]
    lr = args.lr or min(sweep, key=lambda x: x[1])[0]
    lines += ["", f"Best lr: {lr:g}.", ""]

    seeds = sorted({r["spec"]["seed"] for r in runs if r["spec"]["lr"] == lr})
    frontiers = {}
    lines += [
        "Plain frontier at the best lr (each budget its own full schedule; constant: the full run's curve):",
        "",
    ]
    lines += ["| seed | budget (steps) | eval loss | units | CPU s |", "|---|---|---|---|---|"]
    finals = {}
    for seed in seeds:
        u, c, budgets = _frontier(runs, lr, seed, n, args.schedule)
        if not u:
            continue
        frontiers[seed] = (u, c)
        for b, loss, units, cpu in budgets:
            lines.append(f"| {seed} | {b} | {loss:.4f} | {units:.0f} | {cpu:.0f} |")
            if b == n:
                finals[seed] = loss
    if len(finals) > 1:
        vals = list(finals.values())
        lines += [
            "",
            f"Plain final eval loss over seeds {sorted(finals)}: mean {statistics.mean(vals):.4f}, "
            f"range {max(vals) - min(vals):.4f}, std {statistics.stdev(vals):.4f}.",
        ]
    lines.append("")

    def null_for(rec: dict) -> dict | None:
        spec = rec["spec"]
        if spec["accounting"] != "replace":
            return None
        accepted = [e["real"] for e in rec["events"] if e["accepted"]]
        attempts = [e["real"] for e in rec["events"]]
        if not accepted:  # nothing skipped: the null control is the plain run itself
            return next(
                (
                    r
                    for r in runs
                    if r["spec"]["method"] == "plain"
                    and r["spec"]["lr"] == spec["lr"]
                    and r["spec"]["seed"] == spec["seed"]
                    and r["spec"]["n"] == n
                ),
                None,
            )
        want = "" if accepted == attempts else ",".join(map(str, accepted))
        for r in runs:
            s = r["spec"]
            if (
                s["method"] == "null"
                and s["lr"] == spec["lr"]
                and s["seed"] == spec["seed"]
                and (s["c"], s["s"], s["p"], s["k"]) == (spec["c"], spec["s"], spec["p"], spec["k"])
                and s["skips"] == want
            ):
                return r
        return None

    variants = [r for r in runs if r["spec"]["method"] not in ("plain",) and r["spec"]["n"] == n]
    groups: dict[tuple, list[dict]] = {}
    for r in variants:
        s = r["spec"]
        if s["method"] == "null" and s["skips"]:
            continue  # replays are shown beside their variant
        cfg = (s["method"], s["accounting"], s["lr"], s["c"], s["s"], s["p"], s["k"], s["probe"], s["blind"])
        groups.setdefault(cfg, []).append(r)
    lines += [
        "Variants (speed-up = plain cost to reach the run's final eval loss on the seed's frontier / the "
        "run's cost; `>`/`<` a bound outside the frontier). Null: the same batches skipped with no jump "
        "(replace); for bonus the null is the plain run at N (1.00x by construction).",
        "",
        "| variant | accounting | lr | c,s,P,k | seed | eval loss | accepted/attempts | units | x units | "
        "x CPU | null eval loss | null x units | null x CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary = []
    for cfg, recs in sorted(groups.items(), key=lambda kv: (kv[0][0] == "null", kv[0])):
        method, accounting, vlr, c, s, p, k, probe, blind = cfg
        ratios_u, ratios_c, beats = [], [], []
        for r in sorted(recs, key=lambda r: r["spec"]["seed"]):
            seed = r["spec"]["seed"]
            if seed not in frontiers:
                continue
            fu, fc = frontiers[seed]
            su = speedup(fu, r["final_loss"], r["units"])
            sc = speedup(fc, r["final_loss"], r["cpu"])
            acc = f"{sum(e['accepted'] for e in r['events'])}/{len(r['events'])}"
            null = null_for(r) if method != "null" else None
            if null is not None:
                nu = speedup(fu, null["final_loss"], null["units"])
                ncpu = speedup(fc, null["final_loss"], null["cpu"])
                null_txt = f"{null['final_loss']:.4f} | {_fmt_speed(nu)} | {_fmt_speed(ncpu)}"
                beats.append(r["final_loss"] < null["final_loss"])
            elif accounting == "bonus":
                null_txt = f"{finals.get(seed, float('nan')):.4f} | 1.00x | 1.00x"
                beats.append(r["final_loss"] < finals.get(seed, float("inf")))
            else:
                null_txt = "– | – | –"
            name = method + (" (blind)" if blind else "")
            lines.append(
                f"| {name} | {accounting} | {vlr:g} | {c},{s},{p},{k} | {seed} | {r['final_loss']:.4f} | "
                f"{acc} | {r['units']:.0f} | {_fmt_speed(su)} | {_fmt_speed(sc)} | {null_txt} |"
            )
            ratios_u.append(su.ratio)
            ratios_c.append(sc.ratio)
        if ratios_u:
            summary.append(
                (cfg, statistics.median(ratios_u), statistics.median(ratios_c), len(ratios_u), beats)
            )
    lines += ["", "Medians over seeds:", ""]
    lines += [
        "| variant | accounting | lr | c,s,P,k | seeds | median x units | median x CPU "
        "| every seed above its null |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cfg, mu, mc, count, beats in summary:
        method, accounting, vlr, c, s, p, k, probe, blind = cfg
        above = "–" if method == "null" else ("yes" if beats and all(beats) else "no")
        lines.append(
            f"| {method}{' (blind)' if blind else ''} | {accounting} | {vlr:g} | {c},{s},{p},{k} | {count} | "
            f"{mu:.2f}x | {mc:.2f}x | {above} |"
        )
    text = "\n".join(lines) + "\n"
    out = path.with_name(path.stem + "_tables.md")
    out.write_text(text)
    print(text)
    _plot(runs, frontiers, lr, n, path.with_suffix(".png"))


def _plot(runs, frontiers, lr, n, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if 0 not in frontiers:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    fu, _ = frontiers[0]
    pts = sorted(fu)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "k-o", label="plain frontier (seed 0)")
    for r in runs:
        s = r["spec"]
        if s["seed"] != 0 or s["method"] == "plain" or s["n"] != n or s["lr"] != lr:
            continue
        label = f"{s['method']}/{s['accounting']} k={s['k']}" + (f" skips={s['skips']}" if s["skips"] else "")
        (line,) = ax.plot(
            [pt["units"] for pt in r["curve"]], [pt["loss"] for pt in r["curve"]], ".-", alpha=0.5
        )
        ax.plot([r["units"]], [r["final_loss"]], "x", color=line.get_color(), label=label, markersize=9)
    lo = min(p[1] for p in pts)
    ax.set_ylim(lo - 0.03, lo + 0.25)
    ax.set_xlabel("compute units (real step 3, probe forward 1)")
    ax.set_ylabel("eval loss")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
