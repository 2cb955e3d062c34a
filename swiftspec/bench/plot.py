"""report.png: decode tok/s per mode (mean, p10/p90 whiskers) and acceptance length vs tok/s per prompt."""

from __future__ import annotations

from pathlib import Path


def write_plot(report: dict, path: Path) -> None:
    """Two panels side by side; matplotlib with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = report["modes"]
    names = list(modes)
    fig, (bars, scatter) = plt.subplots(1, 2, figsize=(max(8.0, 1.1 * len(names) + 6.0), 4.5))
    means = [modes[n]["tokens_per_s"]["mean"] for n in names]
    low = [max(m - modes[n]["tokens_per_s"]["p10"], 0.0) for n, m in zip(names, means)]
    high = [max(modes[n]["tokens_per_s"]["p90"] - m, 0.0) for n, m in zip(names, means)]
    colors = ["tab:blue" if modes[n]["kind"] == "ours" else "tab:gray" for n in names]
    bars.bar(names, means, yerr=[low, high], capsize=4, color=colors)
    bars.set_ylabel("decode tokens/s (mean, p10–p90)")
    bars.set_title("Decode speed per mode")
    bars.tick_params(axis="x", labelrotation=45)
    for n in names:
        points = modes[n]["per_prompt"]
        scatter.scatter([p["acceptance_length"] for p in points], [p["tokens_per_s"] for p in points], label=n, s=18)
    scatter.set_xlabel("acceptance length (tokens per target forward)")
    scatter.set_ylabel("decode tokens/s")
    scatter.set_title("Per prompt")
    scatter.legend(fontsize="small")
    fig.suptitle(f"{report['machine']['cpu']}, {report['machine']['threads']} threads", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
