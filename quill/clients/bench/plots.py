"""PNG plots of a concurrency sweep and a context sweep.

Figures are built with matplotlib's object API on the Agg canvas: no pyplot, so no global
figure state and no display needed.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

DPI = 80  # small files: these go in the repository


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def _log2_x(ax, values) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([str(v) for v in values])
    ax.minorticks_off()


def throughput_vs_concurrency(summaries: list[dict], path: Path, title: str) -> Path:
    xs = [s["concurrency"] for s in summaries]
    fig = Figure(figsize=(10, 4), layout="constrained")
    tokens, requests = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    tokens.plot(xs, [s["output_token_throughput"] for s in summaries], "o-", label="generated tokens")
    tokens.plot(xs, [s["total_token_throughput"] for s in summaries], "s--", label="prompt + generated tokens")
    tokens.set_ylabel("tokens/s")
    tokens.legend(fontsize=8)
    requests.plot(xs, [s["request_throughput"] for s in summaries], "o-", color="tab:green")
    requests.set_ylabel("requests/s")
    for ax in (tokens, requests):
        _log2_x(ax, xs)
        ax.set_xlabel("concurrent requests")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def latency_vs_concurrency(summaries: list[dict], path: Path, title: str) -> Path:
    xs = [s["concurrency"] for s in summaries]
    fig = Figure(figsize=(12, 4), layout="constrained")
    panels = [("ttft_s", "time to first token"), ("itl_s", "inter-token latency"), ("e2e_s", "end-to-end latency")]
    for i, (key, label) in enumerate(panels, 1):
        ax = fig.add_subplot(1, 3, i)
        for q, style in [(50, "o-"), (90, "s--"), (99, "^:")]:
            ys = [s[key][f"p{q}"] for s in summaries]
            pts = [(x, y * 1000) for x, y in zip(xs, ys) if y is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=f"p{q}")
        ax.set_ylim(bottom=0)
        _log2_x(ax, xs)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("ms")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def ttft_distribution(ttfts: dict[int, list[float]], path: Path, title: str) -> Path:
    """Empirical CDF of time to first token, one curve per concurrency."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    for concurrency, values in ttfts.items():
        if not values:
            continue
        ordered = sorted(v * 1000 for v in values)
        n = len(ordered)
        ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=f"concurrency {concurrency}")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def sweep_plots(summaries: list[dict], ttfts: dict[int, list[float]], out_dir: str | Path, title: str) -> list[Path]:
    out = Path(out_dir)
    return [
        throughput_vs_concurrency(summaries, out / "throughput_vs_concurrency.png", title),
        latency_vs_concurrency(summaries, out / "latency_vs_concurrency.png", title),
        ttft_distribution(ttfts, out / "ttft_distribution.png", title),
    ]


def context_sweep_plot(curves: dict[str, list[dict]], path: str | Path, title: str) -> Path:
    """Per-token decode latency against context length; one line per model, a band from p10 to p90."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    contexts = [p["context"] for points in curves.values() for p in points]
    for label, points in curves.items():
        xs = [p["context"] for p in points]
        ax.plot(xs, [p["ms_per_token"] for p in points], "o-", label=label)
        ax.fill_between(xs, [p["p10_ms"] for p in points], [p["p90_ms"] for p in points], alpha=0.15)
    if contexts:  # ticks at powers of two: the measured contexts differ a little between models
        low, high = max(1, min(contexts)).bit_length() - 1, max(contexts).bit_length()
        _log2_x(ax, [2**k for k in range(low, high + 1)])
    ax.set_xlabel("context length (tokens in the prompt)")
    ax.set_ylabel("decode ms per token (median inter-token gap)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return _save(fig, Path(path))
