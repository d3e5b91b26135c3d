"""A sweep's results, named after it (e.g. `selective-copying.csv`): a CSV (one row per cell),
Markdown tables in the paper's layout (architectures × parameter budgets, plus the evaluation
variants and the paper's numbers side by side) and a PNG (accuracy vs parameters per
architecture)."""

from __future__ import annotations

import csv
import io
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from experiments.expressivity.sweep import Sweep, unfinished
from experiments.files import number_id
from hybrid_jax.files import write_atomic
from hybrid_jax.train.plot import new_figure, save_figure

LABELS = {
    "transformer": "Transformer",
    "ssm": "SSM",
    "ssm-attention": "Hybrid SSM→Attn",
    "attention-ssm": "Hybrid Attn→SSM",
    "transformer-1layer": "Transformer (1 layer)",
}
_FIRST_COLUMNS = ["architecture", "budget", "params", "d_model", "learning_rate", "seed",
                  "steps", "accuracy", "loss"]


def metric_names(sweep: Sweep) -> list[str]:
    """`accuracy` (the training distribution) then one column per evaluation variant."""
    return ["accuracy"] + [f"accuracy[{label}]" for label, _ in sweep.eval_variants]


def aggregate(sweep: Sweep, rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict]:
    """Per (architecture, budget): the best learning rate and, at that rate, the mean, min and
    max of every metric over its seeds (`entry[name]`, `entry[name + " min"]`, ...).

    The rate is chosen by mean accuracy over the seeds that every rate of the group ran, so a
    rate rerun with more seeds (e.g. seeds 1 and 2 only at the best rate of seed 0) competes on
    the same seeds as the others; its entry then reports all of its seeds. Where no seed ran at
    every rate (cells failed), each rate competes on all of its seeds and the entry says so
    (`shared_seeds` False): every rate scored nothing, and the smallest won unseen.
    """
    groups: dict[tuple[str, int], dict[float, list[dict]]] = defaultdict(
        lambda: defaultdict(list))
    for row in rows:
        groups[(row["architecture"], row["budget"])][row["learning_rate"]].append(row)
    best: dict[tuple[str, int], dict] = {}
    for key, by_rate in groups.items():
        common = set.intersection(*({r["seed"] for r in g} for g in by_rate.values()))

        def score(lr: float, by_rate=by_rate, common=common) -> float:
            return statistics.fmean(r["accuracy"] for r in by_rate[lr]
                                    if not common or r["seed"] in common)

        lr = max(sorted(by_rate), key=score)
        group = sorted(by_rate[lr], key=lambda r: r["seed"])
        entry = {"architecture": key[0], "budget": key[1], "learning_rate": lr,
                 "params": group[0]["params"], "seeds": len(group),
                 "shared_seeds": bool(common)}
        for name in metric_names(sweep):
            values = [r[name] for r in group if name in r]
            entry[name] = statistics.fmean(values) if values else float("nan")
            entry[name + " min"] = min(values, default=float("nan"))
            entry[name + " max"] = max(values, default=float("nan"))
        best[key] = entry
    return best


def write_csv(sweep: Sweep, rows: list[dict[str, Any]], path: Path) -> None:
    columns = _FIRST_COLUMNS + metric_names(sweep)[1:] + ["wall_time_s", "layers"]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "layers": "+".join(row.get("layers", []))})
    write_atomic(path, text.getvalue())


def _budget_label(budget: int) -> str:
    return f"{number_id(budget / 1000)}k" if budget >= 1000 else str(budget)


def _entry_text(entry: dict | None, metric: str = "accuracy") -> str:
    """`mean` for one seed; `mean (min–max, n seeds)` for several."""
    if entry is None:
        return "–"
    text = f"{entry[metric]:.3f}"
    if entry["seeds"] > 1:
        text += (f" ({entry[metric + ' min']:.3f}–{entry[metric + ' max']:.3f}, "
                 f"{entry['seeds']} seeds)")
    return text


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(row) + " |" for row in body]]


def markdown(sweep: Sweep, rows: list[dict[str, Any]],
             missing: dict[str, str] | None = None) -> str:
    """The report's tables; `missing`: the cells without results and why (`unfinished`)."""
    best = aggregate(sweep, rows)
    seeds = len(sweep.seeds)
    lines = [f"## {sweep.name}", "", sweep.description, "",
             f"Token accuracy on the scored positions of the held-out split, after "
             f"{_steps_text(sweep, rows)} (batch {sweep.train.batch_size}); each entry is the "
             f"best of the learning rates {list(sweep.learning_rates)}"
             + (f" (chosen on the seeds every rate ran), the mean (min–max) over the seeds "
                f"{list(sweep.seeds)} run at that rate." if seeds > 1 else ", one seed.")
             + f" Positions: {_position_text(sweep)}. SSM layers: `{sweep.family.ssm_type}`; "
             f"attention heads {sweep.family.num_heads}, window {sweep.family.window or 'full'}; "
             f"FFN ratio {sweep.family.ffn_ratio:g}.", ""]
    header = ["architecture"] + [_budget_label(b) for b in sweep.budgets]
    body = [[LABELS[a]] + [_entry_text(best.get((a, b))) for b in sweep.budgets]
            for a in sweep.architectures]
    lines += _table(header, body) + ["", "Actual parameter counts (d_model):", ""]
    body = [[LABELS[a]] + [f"{best[(a, b)]['params']:,} ({_d_model(rows, a, b)})"
                           if (a, b) in best else "–" for b in sweep.budgets]
            for a in sweep.architectures]
    lines += _table(header, body)
    if sweep.eval_variants:
        names = metric_names(sweep)
        for budget in sweep.budgets:
            lines += ["", f"Evaluations at budget {_budget_label(budget)} (trained on the "
                      "first column's distribution):", ""]
            head = ["architecture", "train distribution"] + [l for l, _ in sweep.eval_variants]
            body = [[LABELS[a]] + [_entry_text(best.get((a, budget)), n) for n in names]
                    for a in sweep.architectures]
            lines += _table(head, body)
    if sweep.paper:
        lines += ["", "Side by side with the paper (Cooper et al., 2026):"
                  + (f" {sweep.paper_note}" if sweep.paper_note else ""), ""]
        body = []
        for budget, paper_row in sweep.paper:
            for arch, value in paper_row:
                ours = best.get((arch, budget))
                body.append([_budget_label(budget), LABELS[arch],
                             _entry_text(ours),
                             f"{value:.3f}"])
        lines += _table(["budget", "architecture", "ours", "paper"], body)
    unshared = [f"{LABELS[a]} {_budget_label(b)}" for (a, b), e in best.items()
                if not e["shared_seeds"]]
    if unshared:
        lines += ["", f"No seed ran at every learning rate for {', '.join(unshared)}: there "
                  "each rate competed on all of its own seeds."]
    if missing:
        lines += ["", f"Cells without results ({len(missing)} of {len(sweep.cells())}; run the "
                  "sweep again to retry them):", ""]
        lines += [f"- `{cell_id}`: {why}" for cell_id, why in missing.items()]
    return "\n".join(lines) + "\n"


def _steps_text(sweep: Sweep, rows: list[dict[str, Any]]) -> str:
    """The configured steps, and the cells that `train.time_limit_s` stopped before them."""
    short = [r["steps"] for r in rows if r["steps"] < sweep.train.steps]
    text = f"{sweep.train.steps} steps"
    if short:
        text += (f" ({len(short)} of {len(rows)} cells stopped early by the time limit, "
                 f"after {min(short)}–{max(short)} steps)")
    return text


def _position_text(sweep: Sweep) -> str:
    family = sweep.family
    if family.position == "learned":
        return f"learned absolute table of {family.max_positions} (no RoPE)"
    if family.rope_fraction == 0:
        return "none (no RoPE, no position table)"
    return "RoPE" if family.rope_fraction == 1 else f"RoPE on {family.rope_fraction:g} of channels"


def _d_model(rows: list[dict[str, Any]], arch: str, budget: int) -> str:
    return next((str(r["d_model"]) for r in rows
                 if r["architecture"] == arch and r["budget"] == budget), "?")


def plot(sweep: Sweep, rows: list[dict[str, Any]], path: Path) -> None:
    """Accuracy vs parameters per architecture, bars from the min to the max over seeds; one
    panel per evaluation (matplotlib Agg). The x ticks are the budgets."""
    from matplotlib.ticker import NullFormatter

    best = aggregate(sweep, rows)
    names = metric_names(sweep)
    titles = ["train distribution"] + [label for label, _ in sweep.eval_variants]
    fig, axes = new_figure(1, len(names), figsize=(4.5 * len(names), 3.6), squeeze=False)
    for ax, name, title in zip(axes[0], names, titles, strict=True):
        for arch in sweep.architectures:
            entries = sorted((e for (a, _), e in best.items() if a == arch),
                             key=lambda e: e["params"])
            if entries:
                y = [e[name] for e in entries]
                spread = [[v - e[name + " min"] for v, e in zip(y, entries, strict=True)],
                          [e[name + " max"] - v for v, e in zip(y, entries, strict=True)]]
                ax.errorbar([e["params"] for e in entries], y, yerr=spread, marker="o",
                            capsize=3, label=LABELS[arch])
        ax.set_xscale("log")
        xs = [e["params"] for e in best.values()] + list(sweep.budgets)
        ax.set_xlim(min(xs) / 1.25, max(xs) * 1.25)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(sweep.budgets, [_budget_label(b) for b in sweep.budgets])
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("parameters (ticks: budgets)")
        ax.set_ylabel("token accuracy")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(sweep.name)
    save_figure(fig, path)


def write_report(sweep: Sweep, rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Writes `<short name>.csv`, `.md` and `.png` into `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    paths = [out_dir / f"{sweep.short_name}.{ext}" for ext in ("csv", "md", "png")]
    write_csv(sweep, rows, paths[0])
    write_atomic(paths[1], markdown(sweep, rows, unfinished(sweep, out_dir)))
    plot(sweep, rows, paths[2])
    return paths
