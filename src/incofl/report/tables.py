"""The paper's Table 2: accuracy mean ± std over seeds per method x dataset x alpha, with the
improvement of each method over its base method (InCoAvg over FedAvg, ...)."""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from incofl.atomic import write_json, write_text
from incofl.report.published import PAPER_SETTING
from incofl.report.runs import alpha_tag, completed, dataset_label

METRIC_LABELS = {
    "final_acc": "final-round accuracy",
    "best_acc": "best-round accuracy",
    "last10_acc": "mean accuracy of the last 10 rounds",
}
CELL = ["method", "dataset", "alpha"]
TIDY = CELL + ["mean", "std", "n_seeds", "n_diverged", "base", "improvement"]


def row_order(methods: Sequence[str], base_of: Mapping[str, str | None]) -> list[str]:
    """Baselines (no base) in the given order, then the other methods grouped by their base's
    position among the baselines (given order within a group; unknown bases last)."""
    baselines = [m for m in methods if base_of.get(m) is None]
    rank = {b: i for i, b in enumerate(baselines)}
    derived = [m for m in methods if base_of.get(m) is not None]
    return baselines + sorted(derived, key=lambda m: rank.get(base_of[m], len(baselines)))


def table2(
    summaries: pd.DataFrame,
    *,
    metric: str = "final_acc",
    methods: Sequence[str],
    base_of: Mapping[str, str | None],
    datasets: Sequence[str] | None = None,
    alphas: Sequence[float] | None = None,
) -> pd.DataFrame:
    """Tidy Table 2, one row per (method, dataset, alpha) in display order.

    `std` is the sample std (ddof=1): NaN with a single seed, whose cell then shows the mean
    alone. A cell without runs has n_seeds 0 and NaN mean. `improvement` = mean - base mean;
    the base may be absent from `methods` but must have runs, else it is NaN.
    """
    if metric not in METRIC_LABELS:
        raise ValueError(f"metric must be one of {sorted(METRIC_LABELS)}, got {metric!r}")
    shown = summaries[summaries["method"].isin(methods)]
    datasets = list(pd.unique(shown["dataset"]) if datasets is None else datasets)
    alphas = sorted(float(a) for a in (shown["alpha"].unique() if alphas is None else alphas))
    done = completed(summaries)
    stats = done.groupby(CELL)[metric].agg(["mean", "std", "count"]).rename(columns={"count": "n_seeds"})
    grid = pd.MultiIndex.from_product([row_order(methods, base_of), datasets, alphas], names=CELL)
    t = stats.reindex(grid).reset_index()
    t["n_seeds"] = t["n_seeds"].fillna(0).astype(int)
    diverged = summaries[summaries["status"] == "diverged"].groupby(CELL).size()
    t["n_diverged"] = diverged.reindex(grid).fillna(0).astype(int).to_numpy()
    t["base"] = [base_of.get(m) for m in t["method"]]
    base_keys = pd.MultiIndex.from_arrays([t["base"], t["dataset"], t["alpha"]])
    t["improvement"] = t["mean"] - stats["mean"].reindex(base_keys).to_numpy()
    return t[TIDY]


def _cell(row, tex: bool, full_n: int) -> str:
    """`mean ± std (+improvement)`; a cell with fewer seeds than the table's fullest says so,
    and so does one with diverged runs (never averaged in)."""
    if row.n_seeds == 0:
        return "diverged" if row.n_diverged else "--" if tex else "–"
    pm, up, down = (r"$\pm$", r"$\uparrow$", r"$\downarrow$") if tex else ("±", "+", "-")
    text = f"{row.mean:.1f}" + ("" if math.isnan(row.std) else f" {pm} {row.std:.1f}")
    if not math.isnan(row.improvement):
        imp = round(row.improvement, 1) + 0.0  # + 0.0 turns -0.0 into 0.0
        text += f" ({up if imp >= 0 else down}{abs(imp):.1f})"
    text += f" [n={row.n_seeds}]" if row.n_seeds < full_n else ""
    return text + (f" [{row.n_diverged} diverged]" if row.n_diverged else "")


def _wide(table: pd.DataFrame, tex: bool) -> pd.DataFrame:
    """Cell strings, rows = methods, columns = (dataset, alpha), both in the table's order."""
    full_n = table["n_seeds"].max()
    cells = table.assign(cell=[_cell(r, tex, full_n) for r in table.itertuples()])
    wide = cells.pivot(index="method", columns=["dataset", "alpha"], values="cell")
    cols = pd.MultiIndex.from_frame(table[["dataset", "alpha"]].drop_duplicates())
    return wide.reindex(index=pd.unique(table["method"]), columns=cols)


def _paper_cell(paper: pd.DataFrame, key: tuple) -> str:
    if key not in paper.index:
        return "–"
    mean, std = paper.loc[key, ["mean", "std"]]
    return f"{mean:.1f} ± {std:.1f}"


def _with_paper(wide: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Each (dataset, alpha) column with published numbers gets a paper column beside it;
    columns become (dataset, alpha, source), source "" (measured) or "paper"."""
    paper = paper.set_index(["method", "dataset", "alpha"])
    published = set(paper.index.droplevel("method"))
    out = {}
    for d, a in wide.columns:
        out[(d, a, "")] = wide[(d, a)]
        if (d, a) in published:
            out[(d, a, "paper")] = [_paper_cell(paper, (m, d, a)) for m in wide.index]
    return pd.DataFrame(out, index=wide.index)


def _caption(table: pd.DataFrame, metric: str, extra: str, tex: bool) -> str:
    n = sorted(set(table.loc[table["n_seeds"] > 0, "n_seeds"]))
    seeds = "0" if not n else str(n[0]) if len(n) == 1 else f"{n[0]}–{n[-1]}"
    pct, pm, up = (r"\%", r"$\pm$", r"$\uparrow$") if tex else ("%", "±", "+")
    text = (
        f"Test accuracy ({pct}), {METRIC_LABELS[metric]}: mean {pm} std over {seeds} seeds; "
        f"({up}x) is the improvement over the base method."
    )
    return f"{text} {extra}".strip()


def _header(column: tuple) -> str:
    dataset, alpha, *source = column
    return f"{dataset_label(dataset)} α={alpha}" + "".join(f" ({s})" for s in source if s)


def _shown(
    table: pd.DataFrame, metric: str, caption_extra: str, paper: pd.DataFrame | None
) -> tuple[pd.DataFrame, str]:
    """The cells and caption of the Markdown and HTML tables: with `paper` (tidy published
    numbers, see `published.paper_table2`) each (dataset, alpha) column that has them is
    followed by the published column."""
    wide = _wide(table, tex=False)
    if paper is not None:
        wide = _with_paper(wide, paper)
        if "paper" in wide.columns.get_level_values(-1):
            caption_extra = f"{caption_extra} Columns (paper): the InCo paper's Table 2 ({PAPER_SETTING}).".strip()
    wide.columns = [_header(col) for col in wide.columns]
    return wide, _caption(table, metric, caption_extra, tex=False)


def to_markdown(table: pd.DataFrame, *, metric: str, caption_extra: str = "", paper: pd.DataFrame | None = None) -> str:
    """Markdown Table 2 (`_shown`)."""
    wide, caption = _shown(table, metric, caption_extra, paper)
    rows = [["Method", *wide.columns], [":---"] + [":---:"] * len(wide.columns)]
    rows += [[m, *cells] for m, cells in zip(wide.index, wide.to_numpy(), strict=True)]
    body = "\n".join("| " + " | ".join(r) + " |" for r in rows)
    return f"**Table 2.** {caption}\n\n{body}\n"


def to_html(table: pd.DataFrame, *, metric: str, caption_extra: str = "", paper: pd.DataFrame | None = None) -> str:
    """The Markdown table's cells and caption as an HTML page: the Snakemake report shows HTML
    inline, Markdown and CSV only as downloads."""
    wide, caption = _shown(table, metric, caption_extra, paper)
    body = wide.rename_axis("Method").reset_index().to_html(index=False, border=0, justify="center")
    style = "body{font-family:sans-serif}td,th{padding:2px 10px;text-align:center}td:first-child,th{text-align:left}"
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><style>{style}</style></head><body>\n'
        f"<p><b>Table 2.</b> {html.escape(caption)}</p>\n{body}\n</body></html>\n"
    )


def _esc(text: str) -> str:
    for ch in "&%_#":
        text = text.replace(ch, "\\" + ch)
    return text


def to_latex(table: pd.DataFrame, *, metric: str, caption_extra: str = "") -> str:
    """booktabs table; `\\resizebox` needs graphicx. A midrule separates baselines from the rest."""
    wide = _wide(table, tex=True)
    datasets = list(pd.unique(wide.columns.get_level_values("dataset")))
    k = len(wide.columns) // max(len(datasets), 1)  # alphas per dataset (a full grid)
    based = set(table.loc[table["base"].notna(), "method"])
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_caption(table, metric, _esc(caption_extra), tex=True)}}}",
        r"\label{tab:table2}",
        r"\resizebox{\linewidth}{!}{%",
        rf"\begin{{tabular}}{{l{'c' * len(wide.columns)}}}",
        r"\toprule",
        " & ".join([""] + [rf"\multicolumn{{{k}}}{{c}}{{{_esc(dataset_label(d))}}}" for d in datasets]) + r" \\",
        " ".join(rf"\cmidrule(lr){{{2 + i * k}-{1 + (i + 1) * k}}}" for i in range(len(datasets))),
        " & ".join(["Method"] + [rf"$\alpha={a}$" for _, a in wide.columns]) + r" \\",
        r"\midrule",
    ]
    for i, (m, cells) in enumerate(zip(wide.index, wide.to_numpy(), strict=True)):
        if i and m in based and wide.index[i - 1] not in based:
            lines.append(r"\midrule")
        lines.append(" & ".join([_esc(m), *cells]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_tables(
    table: pd.DataFrame,
    out_dir: str | os.PathLike,
    *,
    metric: str,
    caption_extra: str = "",
    paper: pd.DataFrame | None = None,
) -> None:
    """Write table2.md and table2.html (with `paper` columns if given), table2.tex and the tidy
    table2.csv into `out_dir`, atomically."""
    out = Path(out_dir)
    write_text(out / "table2.md", to_markdown(table, metric=metric, caption_extra=caption_extra, paper=paper))
    write_text(out / "table2.html", to_html(table, metric=metric, caption_extra=caption_extra, paper=paper))
    write_text(out / "table2.tex", to_latex(table, metric=metric, caption_extra=caption_extra))
    write_text(out / "table2.csv", table[TIDY].to_csv(index=False))


def _num(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def metrics_json(table: pd.DataFrame) -> dict:
    """{dataset: {"a0.5": {method: {mean, std, n_seeds, n_diverged, improvement}}}} for `dvc
    metrics`; cells without runs are left out, NaN becomes null."""
    out: dict = {}
    for r in table[(table["n_seeds"] > 0) | (table["n_diverged"] > 0)].itertuples():
        out.setdefault(r.dataset, {}).setdefault(alpha_tag(r.alpha), {})[r.method] = {
            "mean": _num(r.mean),
            "std": _num(r.std),
            "n_seeds": int(r.n_seeds),
            "n_diverged": int(r.n_diverged),
            "improvement": _num(r.improvement),
        }
    return out


def write_metrics_json(table: pd.DataFrame, path: str | os.PathLike) -> None:
    write_json(path, metrics_json(table))
