"""Pictures of a data_bin, a shape plan and a mixture: ``babelfeed inspect --plot DIR`` and ``plan --plot DIR``.

matplotlib is an optional extra (``pip install babelfeed[plot]``); it is imported here only, through its
object API (no pyplot, no global backend switched under a user's notebook). Every function writes PNG files
into ``out_dir`` and returns their paths.
"""

from __future__ import annotations

import os

import numpy as np


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        from babelfeed.errors import MissingExtraError

        raise MissingExtraError("--plot needs matplotlib: pip install 'babelfeed[plot]' (or matplotlib)") from None
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _save(fig, out_dir: str, name: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    fig.savefig(path)
    return path


def inspect_figures(rows: list[dict], out_dir: str) -> list[str]:
    """From ``stats.corpus_stats(..., histograms=True)``: ``lengths.png``, the length histogram of every train
    direction (both sides), and ``sentences.png``, sentences per direction and split on a log scale."""
    train = [r for r in rows if r["split"].startswith("train")]
    keys = list(dict.fromkeys(r["key"] for r in train))
    cols = min(4, max(1, len(keys)))
    nrows = -(-len(keys) // cols) if keys else 1
    fig = _figure(3.2 * cols, 2.6 * nrows + 0.6)
    axes = np.atleast_1d(fig.subplots(nrows, cols, squeeze=False)).reshape(-1)
    for ax, key in zip(axes, keys):
        for r in (r for r in train if r["key"] == key):
            hist = np.asarray(r["histogram"], dtype=np.float64)
            x = np.arange(len(hist))
            ax.step(x, hist, where="mid", label=f"{r['lang']} (p50 {r['p50']}, p99 {r['p99']})")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("tokens (</s> included)", fontsize=8)
        ax.set_ylabel("sentences", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    fig.suptitle("sentence lengths per train direction and side")
    paths = [_save(fig, out_dir, "lengths.png")]

    splits = list(dict.fromkeys(r["split"] for r in rows))
    all_keys = list(dict.fromkeys(r["key"] for r in rows))
    fig = _figure(7, 1.6 + 0.3 * len(all_keys) * max(len(splits), 1))
    ax = fig.subplots()
    height = 0.8 / max(len(splits), 1)
    for i, split in enumerate(splits):
        count = {r["key"]: r["sentences"] for r in rows if r["split"] == split}  # both sides: the same count
        at = [j for j, k in enumerate(all_keys) if count.get(k, 0) > 0]  # a split a direction lacks: no bar
        ax.barh(np.asarray(at, np.float64) + i * height, [count[all_keys[j]] for j in at], height=height,
                label=split, log=True, color=f"C{i % 10}")
    ax.set_yticks(np.arange(len(all_keys)) + height * (len(splits) - 1) / 2, all_keys, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("sentences (log scale)")
    ax.legend(fontsize=8)
    ax.set_title("sentences per direction")
    paths.append(_save(fig, out_dir, "sentences.png"))
    return paths


def plan_figures(lengths: np.ndarray, weights: np.ndarray, shapes: list, per_shape: dict, alternatives: dict,
                 out_dir: str, limits: tuple | None = None) -> list[str]:
    """``shapes.png``: the mixture's (source, target) length histogram with every static shape's box over it
    (``limits``: the filter's (source, target) limits, drawn dashed: longer samples are dropped), the padding
    efficiency of each shape's batches, and the plan against the alternatives."""
    fig = _figure(15, 4.6)
    ax_hist, ax_shape, ax_alt = fig.subplots(1, 3, width_ratios=[1.3, 1, 1.2])
    top = int(max(lengths.max(), max(s[1] for s in shapes), max(s[-1] for s in shapes))) + 1
    bins = min(top, 128)
    h, xe, ye = np.histogram2d(lengths[:, 0], lengths[:, 1], bins=bins, range=[[0, top], [0, top]], weights=weights)
    from matplotlib.colors import LogNorm

    mesh = ax_hist.pcolormesh(xe, ye, np.where(h > 0, h, np.nan).T, norm=LogNorm(), cmap="viridis")
    fig.colorbar(mesh, ax=ax_hist, label="samples")
    for k, s in enumerate(shapes):  # named in a legend: labels in the corners of small boxes overlap
        ax_hist.add_patch(_box(s[1], s[-1], f"C{k % 10}", " x ".join(map(str, s))))
    if limits is not None:
        src_max, tgt_max = limits
        if src_max < top:
            ax_hist.axvline(src_max, color="C3", linestyle="--", linewidth=1, label=f"filter: source > {src_max} dropped")
        if tgt_max < top:
            ax_hist.axhline(tgt_max, color="C3", linestyle=":", linewidth=1, label=f"filter: target > {tgt_max} dropped")
    ax_hist.legend(fontsize=6, loc="upper left", title="B x src x tgt", title_fontsize=6)
    ax_hist.set_xlabel("source tokens")
    ax_hist.set_ylabel("target tokens")
    ax_hist.set_title("lengths of an epoch, and each shape's box")

    names = [" x ".join(map(str, s)) for s in shapes]
    eff = [per_shape.get(tuple(s), (0.0, 0.0))[0] for s in shapes]
    share = [per_shape.get(tuple(s), (0.0, 0.0))[1] for s in shapes]
    bars = ax_shape.barh(np.arange(len(names)), eff, color=[f"C{k % 10}" for k in range(len(names))])
    for bar, sh in zip(bars, share):
        ax_shape.annotate(f"{bar.get_width():.0%}, {sh:.0%} of batches", (bar.get_width(), bar.get_y() + 0.4),
                          fontsize=7, xytext=(3, 0), textcoords="offset points", va="center")
    ax_shape.set_yticks(np.arange(len(names)), names, fontsize=8)
    ax_shape.invert_yaxis()
    ax_shape.set_xlim(0, 1.25)
    ax_shape.set_xlabel("real / padded tokens (masked rows as padding)")
    ax_shape.set_title("padding efficiency per shape (B x src x tgt)")

    labels = list(alternatives)
    values = [alternatives[k] for k in labels]
    ax_alt.barh(np.arange(len(labels)), values, color=["C3" if "this plan" in k else "C7" for k in labels])
    for i, v in enumerate(values):
        ax_alt.annotate(f"{v:.1%}", (v, i), fontsize=8, xytext=(3, 0), textcoords="offset points", va="center")
    ax_alt.set_yticks(np.arange(len(labels)), labels, fontsize=8)
    ax_alt.invert_yaxis()
    ax_alt.set_xlim(0, 1.15)
    ax_alt.set_xlabel("real / padded tokens")
    ax_alt.set_title(f"{len(shapes)} static shapes against the alternatives")
    return [_save(fig, out_dir, "shapes.png")]


def _box(width: int, height: int, color: str, label: str | None = None):
    from matplotlib.patches import Rectangle

    return Rectangle((0, 0), width, height, fill=False, edgecolor=color, linewidth=1.3, label=label)


def mixing_figure(keys: list[str], sizes: np.ndarray, probs: np.ndarray, served: np.ndarray, temperature: float,
                  out_dir: str, size_label: str = "sentences in the direction (log)") -> list[str]:
    """``mixing.png``: each direction's sampling probability against its size at the configured temperature,
    the share it was served in epoch 1, and the two ends of the temperature scale (proportional and uniform)."""
    sizes = np.maximum(np.asarray(sizes, np.float64), 1)
    fig = _figure(7.5, 5)
    ax = fig.subplots()
    order = np.argsort(sizes)
    x = sizes[order]
    ax.plot(x, x / sizes.sum(), "--", color="C7", label="T = 1: proportional to size")
    ax.plot(x, np.full(len(x), 1 / len(x)), ":", color="C7", label="T = inf: uniform")
    ax.scatter(sizes, probs, s=40, color="C0", label=f"configured probability (T = {temperature:g})", zorder=3)
    total = served.sum()
    if total:
        ax.scatter(sizes, served / total, s=14, color="C3", marker="x", label="served share, epoch 1", zorder=4)
    for k, s, p in zip(keys, sizes, probs):
        ax.annotate(k, (s, p), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(size_label)
    ax.set_ylabel("share of the mixture (log)")
    ax.set_title("temperature sampling: small directions up-sampled, large ones down")
    ax.legend(fontsize=8)
    return [_save(fig, out_dir, "mixing.png")]
