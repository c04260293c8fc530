"""A PNG of a comparison: available KV GiB and the ceiling against gmu (matplotlib, optional).

matplotlib is an optional extra (`pip install 'autotune[plot]'` or `pip install matplotlib`);
without it write_plot raises PlotUnavailable with that advice, and nothing else needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.analysis.compare import Report
from autotune.analysis.gmu_predict import predict
from autotune.errors import AutotuneError


class PlotUnavailable(AutotuneError):
    """matplotlib is missing (or unusable); the message says how to get it."""


def _pyplot() -> Any:  # matplotlib.pyplot: imported only when a plot is drawn
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("the plot needs matplotlib, which is not installed: "
                              "pip install 'autotune[plot]' (or: pip install matplotlib)") from exc
    return plt


def write_plot(report: Report, path: Path) -> Path:
    """Two panels sharing the gmu axis: available KV GiB, and the verified ceiling.

    Each comparable group has its own colour: a point per run, the least-squares line of
    available KV where the group has one, and the ceiling that line predicts (the KV token
    line minus how far the measured ceilings sat below the pool).
    """
    plt = _pyplot()
    path = Path(path)
    rows = {r.run_id: r for r in report.runs}
    fig, (ax_kv, ax_ceiling) = plt.subplots(1, 2, figsize=(11, 4.5))
    plotted = 0
    for index, group in enumerate(report.groups):
        members = [rows[i] for i in group.run_ids if rows[i].gmu is not None]
        if not members:
            continue
        colour = f"C{index % 10}"
        first = members[0]
        label = f"{group.group_id}: {first.model.rstrip('/').split('/')[-1] if first.model else '?'}, " \
                f"vLLM {first.vllm_version or '?'}"
        kv = [(r.gmu, r.available_kv_gib) for r in members if r.available_kv_gib is not None]
        if kv:
            ax_kv.scatter(*zip(*kv, strict=True), color=colour, label=label, zorder=3)
            plotted += 1
        ceilings = [(r.gmu, r.ceiling) for r in members if r.ceiling is not None]
        if ceilings:
            ax_ceiling.scatter(*zip(*ceilings, strict=True), color=colour, label=label, zorder=3)
        fit = group.fit
        if fit is not None:
            span = fit.gmu_max - fit.gmu_min
            xs = [fit.gmu_min - 0.1 * span, fit.gmu_max + 0.1 * span]
            ax_kv.plot(xs, [fit.a_gib * x - fit.b_gib for x in xs], color=colour, linewidth=1,
                       label=f"{group.group_id} fit: {fit.a_gib:.2f} x gmu - {fit.b_gib:.2f} GiB")
            predicted = [predict(group, members, x) for x in xs]
            if all(p is not None and p.ceiling is not None and not p.ceiling_is_upper_bound for p in predicted):
                ax_ceiling.plot(xs, [p.ceiling for p in predicted if p is not None], color=colour, linewidth=1,
                                label=f"{group.group_id} predicted ceiling")
    if not plotted:
        plt.close(fig)
        raise ValueError("no run with a gmu and an available-KV figure to plot")
    ax_kv.set_xlabel("--gpu-memory-utilization")
    ax_kv.set_ylabel("available KV cache (GiB)")
    ax_kv.set_title("Available KV cache")
    ax_ceiling.set_xlabel("--gpu-memory-utilization")
    ax_ceiling.set_ylabel("verified --max-model-len (tokens)")
    ax_ceiling.set_title("Verified ceiling")
    ax_ceiling.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    for ax in (ax_kv, ax_ceiling):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
