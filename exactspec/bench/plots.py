"""The report's PNG plots: speedup against gamma (measured, predicted, the theory's curve, the peers),
acceptance by draft position, and the target's cost ratios v(k)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exactspec.bench.estimates import theory_curve
from exactspec.bench.formatting import is_nan, nan_to, setting_title
from exactspec.bench.methods import HF_ASSISTED, HF_PLAIN, PLAIN, SPECULATIVE, is_engine_method
from exactspec.bench.result import BenchResult, sampling_rows
from exactspec.bench.summary_records import Summary

SPEEDUP_PLOT = "speedup_vs_gamma.png"


ACCEPTANCE_PLOT = "acceptance_by_position.png"


COSTS_PLOT = "costs.png"


def write_plots(result: BenchResult, summary: Summary, out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    settings = sampling_rows(result)
    paths = {}
    for key, file_name, plot in (
        ("speedup_plot", SPEEDUP_PLOT, _plot_speedups),
        ("acceptance_plot", ACCEPTANCE_PLOT, _plot_acceptance),
    ):
        fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
        for ax, sampling in zip(axes[0], settings, strict=True):
            plot(ax, summary, sampling)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(setting_title(sampling))
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        paths[key] = _save_figure(plt, fig, out / file_name)

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    _plot_costs(ax, summary)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    paths["costs_plot"] = _save_figure(plt, fig, out / COSTS_PLOT)
    return paths


def _plot_speedups(ax: Any, summary: Summary, sampling: Any) -> None:
    """Speedup over plain decoding by gamma at one sampling row: measured (median, min-max), predicted,
    the theory curve at the pooled acceptance, our other methods and the HF peers."""
    rows = summary.rows_at(sampling.name)
    spec = [r for r in rows if r.method == SPECULATIVE]
    if spec:
        gammas = [r.gamma for r in spec]
        med = [nan_to(r.speedup.median) for r in spec]
        low = [m - nan_to(r.speedup.low, m) for m, r in zip(med, spec, strict=True)]
        high = [nan_to(r.speedup.high, m) - m for m, r in zip(med, spec, strict=True)]
        ax.errorbar(gammas, med, yerr=[low, high], fmt="o-", capsize=4, label="measured (median, min-max)")
        ax.plot(gammas, [r.predicted_speedup for r in spec], "s--", label="predicted S (alpha at gamma)")
        rec = summary.recommendation.get(sampling.name)
        alpha = rec.pooled_alpha if rec else None
        if alpha is not None and not is_nan(alpha):
            curve = theory_curve(alpha, summary.costs)
            ax.plot(
                [g for g, _ in curve],
                [s for _, s in curve],
                ":",
                color="gray",
                label=f"theory, pooled alpha={alpha:.2f}",
            )
    others = [r for r in rows if is_engine_method(r.method) and r.method not in (PLAIN, SPECULATIVE)]
    for r in others:
        if not is_nan(r.speedup.median):
            ax.plot([r.gamma], [r.speedup.median], "D", label=r.label)
    for r in rows:
        if r.method == HF_ASSISTED and not is_nan(r.speedup.median):
            ax.axhline(r.speedup.median, color="tab:red", linestyle="-.", label="HF assisted")
        if r.method == HF_PLAIN and not is_nan(r.speedup.median):
            ax.axhline(r.speedup.median, color="tab:green", linestyle=(0, (1, 3)), label="HF plain")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("gamma (draft tokens per round)")
    ax.set_ylabel("speedup over plain decoding")


def _plot_acceptance(ax: Any, summary: Summary, sampling: Any) -> None:
    """Acceptance rate by draft position, one line per gamma, at one sampling row."""
    for r in summary.rows_at(sampling.name):
        if r.method != SPECULATIVE:
            continue
        rates = r.acceptance_by_position
        ax.plot(range(1, len(rates) + 1), [nan_to(x) for x in rates], "o-", label=f"gamma={r.gamma}")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position i (given positions < i were accepted)")
    ax.set_ylabel("acceptance rate")


def _plot_costs(ax: Any, summary: Summary) -> None:
    """The target's cost ratios v(k): through the adapter, forwards only, each backend timed in the run."""
    for name, source, style in (
        ("v(k), adapter (median)", summary.costs, "o-"),
        ("v(k), forward only (median)", summary.forward_costs, "s--"),
    ):
        if not source.v:
            continue
        ks = sorted(source.v)
        ax.plot(ks, [source.v[k] for k in ks], style, label=name)
    for item in summary.costs_in_run:
        ks = sorted(item.costs.v)
        ax.plot(ks, [item.costs.v[k] for k in ks], ":", marker="^", label=f"v(k), {item.name} (fastest)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("k (tokens in one target forward)")
    ax.set_ylabel("time / one-token time")
    ax.set_title(f"target cost ratios (c = {summary.costs.c:.3f})")


def _save_figure(plt: Any, fig: Any, path: Path) -> Path:
    """Lay out, write as PNG and free one figure; returns its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
