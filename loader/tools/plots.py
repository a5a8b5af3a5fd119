"""Pictures of a data_bin, a shape plan and a mixture: ``babelfeed inspect --plot DIR`` and ``plan --plot DIR``.

They are drawn for 1 to 10,000 directions. Up to ``DETAIL`` directions, each is drawn and named. Above, the
directions fall into three resource tiers by their train sentences (a third of the directions each, by rank:
high, mid, low); the ``TOP`` most telling ones (largest, smallest, longest tails, most unequal sides) are named
and the rest are drawn as a crowd or added up ("+980 others"). No figure grows past ``MAX_INCHES`` (100 dpi),
whatever the count. Legends sit outside the data, length axes stop at the 99.5th percentile (the label says how
much lies beyond), percentage axes stop at 100%, and bars carry their values.

Each picture draws one JSON-ready dict, :func:`inspect_data` for ``inspect`` and the dict of
:func:`babelfeed.tools.plan_report.plan_data` for ``plan`` (its parts from :func:`length_cells` and
:func:`mixing_data`), and :func:`save` writes that dict beside the PNGs (``inspect.json``, ``plan.json``), for
those who draw their own. :func:`inspect_pictures` and :func:`plan_pictures` return the Figures unsaved.

matplotlib is an optional extra (``pip install babelfeed[plot]``); it is imported inside the drawing functions
only, through its object API (no pyplot, no global backend switched under a user's notebook). The data
functions need numpy only.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from babelfeed.errors import DataError, InternalError, MissingExtraError, UsageError


DETAIL = 12  # up to this many directions, every one drawn and named
TOP = 10  # above: this many named at each end (largest, smallest, longest tails, most unequal sides)
CLIP = 99.5  # length axes stop at this percentile of the sentences (or samples)
WITHIN = 0.8  # inspect: ... of this share of the directions (each direction's own percentile)
MAX_INCHES = 19.5  # no figure wider or taller (1,950 pixels at 100 dpi)
LENGTH_BINS = 40  # inspect's tier length histograms: about this many bins up to the axis cut
MAX_SHAPES = 48  # shapes drawn one bar each; more: the most used, the rest named in the title
BEYOND = 6  # shapes past the length axes' cut named in a corner (the most used); more: counted
TIERS = ("high", "mid", "low")
TIER_COLOURS = ("#1f77b4", "#2ca02c", "#ff7f0e")
RANK_ALPHA = 0.55  # sentences.png's tier fills (and their legend's swatches)
MIX_ALPHA = 0.8  # mixing.png's tier points (and their legend's markers)
SPLIT_COLOURS = ("#33337a", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")  # not the tiers' colours
NAMED = (("o", "#d62728"), ("s", "#9467bd"), ("^", "#8c564b"), ("D", "#e377c2"), ("v", "#17becf"),
         ("P", "#bcbd22"), ("X", "#7f7f7f"), ("*", "#000000"), ("<", "#aec7e8"), (">", "#ff9896"))


# ------------------------------------------------------------------------------------------------ the numbers
def tiers(sizes) -> np.ndarray:
    """Each direction's tier by its size: 0 (high), 1 (mid) or 2 (low), a third of the directions each, by rank
    (the largest third is high-resource; equal sizes at a boundary are split by order)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    out = np.empty(len(sizes), dtype=np.int64)
    out[np.argsort(-sizes, kind="stable")] = np.arange(len(sizes)) * len(TIERS) // max(len(sizes), 1)
    return out


def rank_length(hist, q: float) -> int:
    """The length at percentile ``q`` of a histogram whose entry L counts sentences (or weighs samples) of L
    tokens: the nearest rank for counts, as ``inspect`` prints them; the weighted quantile for weights."""
    hist = np.asarray(hist)
    n = hist.sum()
    if n <= 0:
        return 0
    rank = max(1, int(np.ceil(q / 100.0 * n))) if hist.dtype.kind in "iu" else q / 100.0 * n
    return min(int(np.searchsorted(np.cumsum(hist), rank)), len(hist) - 1)


def _added(hists) -> np.ndarray:
    out = np.zeros(1, dtype=np.int64)
    for h in hists:
        h = np.asarray(h, dtype=np.int64)
        if len(h) > len(out):
            out = np.pad(out, (0, len(h) - len(out)))
        out[:len(h)] += h
    return out


def _trimmed(hist) -> list[int]:
    hist = np.asarray(hist, dtype=np.int64)
    nz = np.flatnonzero(hist)
    return hist[:nz[-1] + 1].tolist() if len(nz) else []


def _side(lang: str, hist) -> dict:
    hist = np.asarray(hist, dtype=np.int64)
    return {"lang": lang, "sentences": int(hist.sum()), "p50": rank_length(hist, 50), "p90": rank_length(hist, 90),
            "p99": rank_length(hist, 99), "max": max(len(_trimmed(hist)) - 1, 0), "histogram": _trimmed(hist)}


def inspect_data(rows: list[dict], top: int = TOP) -> dict:
    """What ``lengths.png`` and ``sentences.png`` draw, from ``stats.corpus_stats(..., histograms=True)``.

    ``directions``: per direction (every split's keys), its train ``sentences``, sentences per split, ``tier``
    and per side (source first) the length percentiles and ``histogram`` of its train split(s) (entry L counts
    sentences of L tokens). ``tiers``: per tier its directions, their sentences, and per side (``source``,
    ``target``) the pooled histogram and percentiles. ``lengths``: the axis cut (``clip``: 4 in 5 directions
    hold 99.5% of their train sentences, on either side, within it), the share of all sentences longer, the
    longest, and the ``top`` directions named for the longest tails (largest p99 of either side) and for the
    most unequal sides (source over target median, either way). ``sentences``: the directions named
    (``largest`` and ``smallest``, ``top`` each; all of them, as ``largest``, up to ``2 * top + 1``), the
    others added up per split, and per split how many directions lack it."""
    if not rows:
        raise DataError("no rows to draw: the data_bin holds no directions")
    if any("histogram" not in r for r in rows):
        raise UsageError("the rows need their length histograms: corpus_stats(..., histograms=True)")
    splits = list(dict.fromkeys(r["split"] for r in rows))
    trains = [s for s in splits if s.startswith("train")] or splits[:1]  # no train split: the first one's lengths
    keys = list(dict.fromkeys(r["key"] for r in rows))
    by_key: dict = {}
    for r in rows:
        by_key.setdefault(r["key"], []).append(r)
    directions = []
    for key in keys:
        counts: dict = {}
        hists: dict = {}
        for r in by_key[key]:
            counts[r["split"]] = max(counts.get(r["split"], 0), int(r["sentences"]))  # (both sides: one count)
            if r["split"] in trains:
                hists.setdefault(r["lang"], []).append(r["histogram"])
        order = key.split("-") if "-" in key else [key]
        langs = [lang for lang in order if lang in hists] + [lang for lang in hists if lang not in order]
        directions.append({"key": key, "sentences": sum(counts.get(s, 0) for s in trains),
                           "splits": {s: counts[s] for s in splits if s in counts},
                           "sides": [_side(lang, _added(hists[lang])) for lang in langs]})
    sizes = np.array([d["sentences"] for d in directions], dtype=np.int64)
    tier = tiers(sizes)
    for d, t in zip(directions, tier.tolist()):
        d["tier"] = TIERS[t]
    total = max(int(sizes.sum()), 1)
    tier_rows = []
    for t, name in enumerate(TIERS):
        members = [d for d, dt in zip(directions, tier.tolist()) if dt == t]
        if not members:
            continue
        n = [d["sentences"] for d in members]
        entry = {"tier": name, "directions": len(members), "min_sentences": min(n), "max_sentences": max(n),
                 "sentences": sum(n), "share": sum(n) / total}
        for role, i in (("source", 0), ("target", 1)):
            h = _added(d["sides"][i]["histogram"] for d in members if len(d["sides"]) > i)
            if h.sum():
                entry[role] = {k: v for k, v in _side("", h).items() if k != "lang"}
        tier_rows.append(entry)
    pooled = _added(s["histogram"] for d in directions for s in d["sides"])
    # the cut: each direction's 99.5th percentile (its longer side), at the 80th percentile of the directions, so
    # that neither one large corpus of long lines (documents among the sentences) nor a few small noisy ones
    # squeeze every other direction into a corner
    own = np.sort([max(rank_length(s["histogram"], CLIP) for s in d["sides"]) for d in directions if d["sides"]])
    clip = max(int(own[max(math.ceil(WITHIN * len(own)), 1) - 1]) if len(own) else 1, 1)
    longer = float(pooled[clip + 1:].sum() / max(pooled.sum(), 1))
    tails = sorted(directions, key=lambda d: -max([s["p99"] for s in d["sides"]] or [0]))
    pairs = [d for d in directions if len(d["sides"]) == 2 and min(s["p50"] for s in d["sides"]) > 0]
    unequal = sorted(pairs, key=lambda d: -abs(math.log(d["sides"][0]["p50"] / d["sides"][1]["p50"])))
    ranked = sorted(range(len(directions)), key=lambda i: -directions[i]["sentences"])
    if len(directions) <= max(DETAIL, 2 * top + 1):  # (one other is no crowd: then every one is named)
        largest, smallest, middle = [directions[i]["key"] for i in ranked], [], []
    else:
        largest = [directions[i]["key"] for i in ranked[:top]]
        smallest = [directions[i]["key"] for i in ranked[len(ranked) - top:]]
        middle = ranked[top:len(ranked) - top]
    others = {"directions": len(middle),
              "splits": {s: sum(directions[i]["splits"].get(s, 0) for i in middle) for s in splits},
              "median": float(np.median([directions[i]["sentences"] for i in middle])) if middle else 0.0}
    return {"splits": splits, "length_splits": trains, "directions": directions, "tiers": tier_rows,
            "lengths": {"clip": clip, "quantile": CLIP, "within": WITHIN, "longer": longer,
                        "longest": max(len(_trimmed(pooled)) - 1, 0), "sentences": int(pooled.sum()),
                        "longest_tails": [d["key"] for d in tails[:top]],
                        "unequal_sides": [d["key"] for d in unequal[:top]]},
            "sentences": {"largest": largest, "smallest": smallest, "others": others,
                          "without": {s: sum(1 for d in directions if s not in d["splits"]) for s in splits}}}


def length_cells(lengths, weights=None, limits: tuple | None = None, bins: int = 128) -> dict:
    """The (source, target) length histogram that ``shapes.png`` draws: cells of ``bin`` tokens (at most
    ``bins`` a side) up to each side's 99.5th percentile (``clip``; weighted), as ``[source, target, weight]``
    with the lower edges of the cell; the weight longer than the clip on each side, the longest of each side,
    the ``samples`` (the weights' total, rounded: with epoch 1's expected draws as weights, its samples) and the
    filter's ``limits`` (source, target)."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    w = np.ones(len(lengths)) if weights is None else np.asarray(weights, dtype=np.float64)
    total = float(w.sum())
    if not len(lengths) or total <= 0:
        raise DataError("no samples to draw: the mixture draws nothing from the data")
    clip, longer, longest = [], [], []
    for side in range(2):
        hist = np.bincount(lengths[:, side], weights=w)
        c = max(rank_length(hist, CLIP), 1)
        clip.append(c)
        longer.append(float(hist[c + 1:].sum() / total))
        longest.append(int(np.flatnonzero(hist)[-1]) if hist.any() else 0)
    width = max(1, -(-max(clip) // bins))
    keep = (lengths[:, 0] <= clip[0]) & (lengths[:, 1] <= clip[1])
    ns, nt = clip[0] // width + 1, clip[1] // width + 1
    flat = (lengths[keep, 0] // width) * nt + lengths[keep, 1] // width
    hist = np.bincount(flat, weights=w[keep], minlength=ns * nt)
    cells = np.flatnonzero(hist)
    s, t = np.divmod(cells, nt)
    return {"bin": int(width), "clip": clip, "quantile": CLIP, "longer": longer, "longest": longest,
            "samples": int(round(total)), "limits": None if limits is None else [int(x) for x in limits],
            "cells": [[int(a) * width, int(b) * width, float(v)] for a, b, v in zip(s, t, hist[cells])]}


def mixing_data(keys, sizes, probs, served, temperature: float, size_is: str = "every shard",
                top: int = TOP, method: str = "") -> dict:
    """What ``mixing.png`` draws: per direction its size (its sentences in ``size_is``: "every shard", or
    "epoch 1's shard" where each epoch reads one shard), configured probability, epoch 1's served samples and
    tier; per tier its share of the data (T = 1), of the probability and of the served samples, and the
    up-sampling factor (probability over share of the data); the directions named (all up to ``DETAIL``, else
    the ``top // 2`` largest and smallest). ``method``: how the probabilities were made, as the report names it
    (default: temperature sampling at ``temperature``)."""
    sizes = np.maximum(np.asarray(sizes, dtype=np.float64), 0)
    probs = np.asarray(probs, dtype=np.float64)
    served = np.asarray(served, dtype=np.float64)
    if not len(sizes) == len(probs) == len(served) == len(keys) or not len(keys):
        raise UsageError(f"mixing: {len(keys)} keys, {len(sizes)} sizes, {len(probs)} probabilities and "
                         f"{len(served)} served counts (one each per direction, at least one)")
    tier = tiers(sizes)
    data_share = sizes / max(sizes.sum(), 1)
    served_share = served / max(served.sum(), 1)
    rows = []
    for t, name in enumerate(TIERS):
        m = tier == t
        if m.any():
            rows.append({"tier": name, "directions": int(m.sum()), "min_size": int(sizes[m].min()),
                         "max_size": int(sizes[m].max()), "data_share": float(data_share[m].sum()),
                         "probability": float(probs[m].sum()), "served_share": float(served_share[m].sum()),
                         "upsampling": float(probs[m].sum() / max(data_share[m].sum(), 1e-300)),
                         "epochs": float(served[m].sum() / max(sizes[m].sum(), 1))})
    order = np.argsort(-sizes, kind="stable")
    half = max(top // 2, 1)
    named = order if len(keys) <= DETAIL else np.concatenate([order[:half], order[len(order) - half:]])
    return {"temperature": float(temperature), "method": method or f"temperature {temperature:g}", "size_is": size_is,
            "served": int(served.sum()),
            "directions": [{"key": k, "size": int(s), "probability": float(p), "served": int(v), "tier": TIERS[t]}
                           for k, s, p, v, t in zip(keys, sizes, probs, served, tier.tolist())],
            "tiers": rows, "named": [keys[i] for i in named.tolist()]}


def _num(x: float) -> str:
    """1234 -> 1.23k, 5600000 -> 5.6M, 87 -> 87."""
    x = float(x)
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")):
        if abs(x) >= div * 0.9995 or div == 1:
            text = f"{x / div:.3g}"
            if "e" in text:  # (999,999 rounds to 1e+03k: one unit up)
                continue
            return text + unit
    return f"{x:.3g}"


def _pct(share: float, least: float = 0.0) -> str:
    """0.243 -> 24.3%, 0.00026 -> 0.026%: the digits a share needs; below ``least`` (> 0), "<0.01%"."""
    if 0 < share < least:
        return f"<{least * 100:g}%"
    return f"{share * 100:.3g}%"


def _times(x: float) -> str:
    """190.4 -> 190x, 0.082 -> 0.082x."""
    return f"{x:,.0f}x" if x >= 10 else f"{x:.2g}x"


# ------------------------------------------------------------------------------------------------ the drawing
def require_matplotlib() -> None:
    """Raise :class:`babelfeed.errors.MissingExtraError` (with the pip line) unless matplotlib imports: the
    commands call it before any work when ``--plot`` is given, so a missing extra costs no planning time."""
    try:
        import matplotlib.colors  # noqa: F401  (the submodules the drawing imports, not the package alone)
        import matplotlib.figure  # noqa: F401
        import matplotlib.lines  # noqa: F401
        import matplotlib.patches  # noqa: F401
        import matplotlib.ticker  # noqa: F401
    except ImportError:
        raise MissingExtraError("--plot needs matplotlib: pip install 'babelfeed[plot]' (or matplotlib)") from None


def _figure(width: float, height: float):
    require_matplotlib()
    from matplotlib.figure import Figure  # optional: babelfeed[plot]

    return Figure(figsize=(min(width, MAX_INCHES), min(height, MAX_INCHES)), dpi=100, layout="constrained")


def _percent_axis(axis) -> None:
    """Shares as percentages with the digits they need (0.5%, 12%, 0.01%), on linear and log axes."""
    from matplotlib.ticker import FuncFormatter, NullFormatter  # optional: babelfeed[plot]

    axis.set_major_formatter(FuncFormatter(lambda v, _: _pct(v)))
    axis.set_minor_formatter(NullFormatter())


def _log_ticks(axis, lo: float, hi: float, percent: bool = False) -> None:
    """A log axis over [lo, hi] labelled in plain numbers (10k, not 10^4; or percentages), with 2s and 5s (and
    3s) between the powers of ten where it spans few decades."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # optional: babelfeed[plot]

    span = math.log10(max(hi, 1e-300) / max(lo, 1e-300))
    subs = (1.0, 2.0, 3.0, 5.0) if span <= 1.3 else (1.0, 2.0, 5.0) if span <= 3.2 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter((lambda v, _: _pct(v)) if percent else (lambda v, _: _num(v))))
    axis.set_minor_formatter(NullFormatter())


def _bar_values(ax, bars, texts, top: float = 1.0, size: float = 7) -> None:
    """Each bar's text at its end: inside where the bar is long enough (white on a dark bar), else just past it;
    ``top``: the axis's end, in bar units (horizontal bars from 0)."""
    for bar, text in zip(bars, texts):
        w = bar.get_width()
        y = bar.get_y() + bar.get_height() / 2
        inside = w > 0.62 * top
        r, g, b, _ = bar.get_facecolor()
        dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.6
        ax.annotate(text, (w, y), xytext=(-3 if inside else 3, 0), textcoords="offset points", va="center",
                    ha="right" if inside else "left", fontsize=size,
                    color="white" if inside and dark else "black", annotation_clip=False)


def _named_legend(ax, handles, title: str) -> None:
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, fontsize=7,
                  title=title, title_fontsize=7, frameon=False)


def _clip_note(what: str, clip: int, longer: float, longest: int, quantile: float = CLIP, sep: str = " ") -> str:
    if longer <= 0:
        return f"{what} (all shown, longest {longest:,})"
    return (f"{what}{sep}(axis cut at {clip:,}, the {quantile:g}th percentile: {_pct(longer)} are longer, up to "
            f"{longest:,})")


def _cut_note(what: str, L: dict, directions: int, sep: str = " ") -> str:
    """inspect's cut: where most directions hold nearly all their sentences."""
    if L["longer"] <= 0:
        return f"{what} (all shown, longest {L['longest']:,})"
    within = max(math.ceil(L["within"] * directions), 1)
    return (f"{what}{sep}(axis cut at {L['clip']:,}: {within:,} of the {directions:,} directions hold "
            f"{L['quantile']:g}% of their sentences within it;{sep}{_pct(L['longer'])} of all sentences are longer, "
            f"up to {L['longest']:,})")


def inspect_pictures(data: dict) -> dict:
    """``lengths.png`` and ``sentences.png`` for :func:`inspect_data`'s dict, as unsaved Figures."""
    require_matplotlib()
    lengths = _lengths_detail(data) if len(data["directions"]) <= DETAIL else _lengths_overview(data)
    return {"lengths.png": lengths, "sentences.png": _sentences(data)}


def _lengths_detail(data: dict):
    """Up to DETAIL directions: one panel each, the share of its sentences per length, both sides."""
    shown = [d for d in data["directions"] if d["sides"] and d["sentences"]]
    n = max(len(shown), 1)
    cols = n if n <= 4 else 3 if n <= 9 else 4
    nrows = -(-n // cols)
    fig = _figure(max(10.0, 3.4 * cols), 2.5 * nrows + 1.4)
    axes = fig.subplots(nrows, cols, squeeze=False, sharex=True, sharey=True)
    clip = data["lengths"]["clip"]
    x = np.arange(clip + 1)
    for k, (ax, d) in enumerate(zip(axes.ravel(), shown)):
        for i, side in enumerate(d["sides"][:2]):
            h = np.asarray(side["histogram"][:clip + 1], dtype=np.float64)
            share = np.pad(h, (0, clip + 1 - len(h))) / max(side["sentences"], 1)
            ax.step(x, share, where="mid", color="C0" if i == 0 else "C1", linestyle="-" if i == 0 else "--",
                    linewidth=1.1)
        p50 = " / ".join(str(s["p50"]) for s in d["sides"][:2])
        p99 = " / ".join(str(s["p99"]) for s in d["sides"][:2])
        ax.set_title(f"{d['key']}\n{_num(d['sentences'])} sentences, p50 {p50}, p99 {p99}", fontsize=8)
        ax.tick_params(labelsize=7)
        _percent_axis(ax.yaxis)
        if k + cols >= len(shown):  # nothing drawn below: this panel carries the x labels
            ax.tick_params(labelbottom=True)
    for ax in axes.ravel()[len(shown):]:
        ax.set_visible(False)
    axes[0, 0].set_xlim(0, clip)
    axes[0, 0].set_ylim(bottom=0)
    L = data["lengths"]
    fig.supxlabel(_cut_note("tokens per sentence, </s> included", L, sum(1 for d in data["directions"] if d["sides"])),
                  fontsize=8)
    fig.supylabel("share of the direction's sentences", fontsize=8)
    fig.suptitle(f"sentence lengths of each direction ({', '.join(data['length_splits'])}): solid source, dashed "
                 f"target (p50 and p99 as source / target)", fontsize=10)
    return fig


def _tier_handles(data_tiers: list[dict], points: float | None = None) -> list:
    """A legend entry per tier: its directions and their sizes (inspect's tiers or the mixture's); a swatch of
    the tier's colour, or with ``points`` (their alpha) a point as the scatter draws it."""
    from matplotlib.lines import Line2D  # optional: babelfeed[plot]
    from matplotlib.patches import Patch  # optional: babelfeed[plot]

    out = []
    for t in data_tiers:
        c = TIER_COLOURS[TIERS.index(t["tier"])]
        lo, hi = (t["min_sentences"], t["max_sentences"]) if "min_sentences" in t else (t["min_size"], t["max_size"])
        label = f"{t['tier']}: {t['directions']:,} directions of {_num(lo)}-{_num(hi)} sentences"
        out.append(Patch(color=c, label=label) if points is None else
                   Line2D([], [], marker="o", markersize=5, markeredgewidth=0, color=c, alpha=points, linestyle="",
                          label=label))
    return out


def _lengths_overview(data: dict):
    """Many directions: length distributions by tier, their tails, each direction's medians and p99s."""
    from matplotlib.lines import Line2D  # optional: babelfeed[plot]

    fig = _figure(16, 10)
    (ax_dist, ax_tail), (ax_med, ax_p99) = fig.subplots(2, 2)
    L = data["lengths"]
    clip = L["clip"]
    # bins of a few tokens (about LENGTH_BINS up to the cut): six 1-token step lines of the tiers, the low one
    # noisy from its few sentences, crossed at every token and could not be told apart
    width = max(1, math.ceil((clip + 1) / LENGTH_BINS))
    edges = np.arange(0, clip + width + 1, width)
    centres = (edges[:-1] + np.minimum(edges[1:], clip + 1) - 1) / 2
    for t in sorted(data["tiers"], key=lambda t: -TIERS.index(t["tier"])):  # the noisiest (low) first, under
        k = TIERS.index(t["tier"])
        c = TIER_COLOURS[k]
        for role, style in (("source", "-"), ("target", "--")):
            if role in t:
                h = np.asarray(t[role]["histogram"][:clip + 1], dtype=np.float64)
                binned = np.add.reduceat(np.pad(h, (0, clip + 1 - len(h))), edges[:-1])
                ax_dist.plot(centres, binned / max(t[role]["sentences"], 1), color=c, linestyle=style,
                             linewidth=(2.0, 1.5, 1.1)[k])
        both = _added([t[r]["histogram"] for r in ("source", "target") if r in t]).astype(np.float64)
        longer = 1 - np.cumsum(both) / max(both.sum(), 1)
        ax_tail.step(np.arange(len(both)), np.where(longer > 0, longer, np.nan), where="post", color=c,
                     linewidth=1.2)
    ax_dist.set_xlim(0, clip)
    ax_dist.set_ylim(bottom=0)
    _percent_axis(ax_dist.yaxis)
    ax_dist.set_xlabel(_cut_note("tokens per sentence", L, sum(1 for d in data["directions"] if d["sides"]), "\n"),
                       fontsize=8)
    ax_dist.set_ylabel(f"share of the tier's sentences per {width} tokens" if width > 1 else
                       "share of the tier's sentences", fontsize=8)
    ax_dist.set_title(f"length distribution by resource tier (solid: source, dashed: target; bins of {width} "
                      f"token{'s' if width > 1 else ''})", fontsize=9)
    ax_tail.set_yscale("log")
    ax_tail.axvline(clip, color="0.5", linestyle=":", linewidth=1)
    ax_tail.set_xlim(0, max(L["longest"], 1))
    ax_tail.set_xlabel(f"length L in tokens, every length (dotted: the left panel's cut at {clip:,})", fontsize=8)
    ax_tail.set_ylabel("share of the tier's sentences longer than L (log)", fontsize=8)
    ax_tail.set_title("the tails: what a length filter at L drops (both sides)", fontsize=9)
    _percent_axis(ax_tail.yaxis)

    by_key = {d["key"]: d for d in data["directions"]}
    pairs = [d for d in data["directions"] if len(d["sides"]) == 2]
    colours = [TIER_COLOURS[TIERS.index(d["tier"])] for d in pairs]
    if pairs:
        src = np.array([d["sides"][0]["p50"] for d in pairs], dtype=np.float64)
        tgt = np.array([d["sides"][1]["p50"] for d in pairs], dtype=np.float64)
        ax_med.scatter(np.maximum(src, 1), np.maximum(tgt, 1), s=9, c=colours, alpha=0.6, linewidths=0)
        lo, hi = max(min(src.min(), tgt.min()), 1) / 1.25, max(src.max(), tgt.max()) * 1.25
        ax_med.plot([lo, hi], [lo, hi], color="0.5", linestyle="--", linewidth=1)
        ax_med.set_xscale("log")
        ax_med.set_yscale("log")
        ax_med.set_xlim(lo, hi)
        ax_med.set_ylim(lo, hi)
        _log_ticks(ax_med.xaxis, lo, hi)
        _log_ticks(ax_med.yaxis, lo, hi)
        handles = []
        for (marker, colour), key in zip(NAMED, L["unequal_sides"]):
            s, t = (side["p50"] for side in by_key[key]["sides"])
            ax_med.scatter([max(s, 1)], [max(t, 1)], s=40, marker=marker, color=colour, edgecolors="black",
                           linewidths=0.6, zorder=3)
            handles.append(Line2D([], [], marker=marker, color=colour, markeredgecolor="black", linestyle="",
                                  label=f"{key}: {s} / {t}"))
        _named_legend(ax_med, handles, "most unequal medians\n(source / target)")
    else:
        ax_med.text(0.5, 0.5, "no direction has two sides", ha="center", va="center", transform=ax_med.transAxes)
    ax_med.set_xlabel("median source length (tokens, log)", fontsize=8)
    ax_med.set_ylabel("median target length (tokens, log)", fontsize=8)
    ax_med.set_title(f"each direction's median lengths ({len(pairs):,} pairs; dashed: equal)", fontsize=9)

    sizes = np.array([max(d["sentences"], 1) for d in data["directions"]], dtype=np.float64)
    p99 = np.array([max([s["p99"] for s in d["sides"]] or [0]) for d in data["directions"]], dtype=np.float64)
    ax_p99.scatter(sizes, np.maximum(p99, 1), s=9, alpha=0.6, linewidths=0,
                   c=[TIER_COLOURS[TIERS.index(d["tier"])] for d in data["directions"]])
    handles = []
    for (marker, colour), key in zip(NAMED, L["longest_tails"]):
        d = by_key[key]
        v = max(s["p99"] for s in d["sides"])
        ax_p99.scatter([max(d["sentences"], 1)], [max(v, 1)], s=40, marker=marker, color=colour,
                       edgecolors="black", linewidths=0.6, zorder=3)
        sides = " / ".join(str(s["p99"]) for s in d["sides"])
        handles.append(Line2D([], [], marker=marker, color=colour, markeredgecolor="black", linestyle="",
                              label=f"{key}: {sides}"))
    _named_legend(ax_p99, handles, "longest tails\n(p99 source / target)")
    ax_p99.set_xscale("log")
    ax_p99.set_yscale("log")
    _log_ticks(ax_p99.xaxis, sizes.min(), sizes.max())
    _log_ticks(ax_p99.yaxis, max(p99.min(), 1), max(p99.max(), 1))
    ax_p99.set_xlabel("sentences of the direction (log)", fontsize=8)
    ax_p99.set_ylabel("99th percentile length, longer side (log)", fontsize=8)
    ax_p99.set_title("each direction's long tail against its size", fontsize=9)
    for ax in (ax_dist, ax_tail, ax_med, ax_p99):
        ax.tick_params(labelsize=7)
    fig.suptitle(f"sentence lengths of {len(data['directions']):,} directions ({', '.join(data['length_splits'])})"
                 f" in three resource tiers of a third of the directions each", fontsize=10)
    fig.legend(handles=_tier_handles(data["tiers"]), loc="outside lower center", ncols=3, fontsize=8,
               frameon=False)
    return fig


def _sentences(data: dict):
    """Sentences per direction and split on a log scale, each bar's value printed; above DETAIL directions the
    largest and smallest named, the rest added up, and beside them every direction by rank."""
    from matplotlib.lines import Line2D  # optional: babelfeed[plot]
    from matplotlib.patches import Patch  # optional: babelfeed[plot]

    S = data["sentences"]
    by_key = {d["key"]: d for d in data["directions"]}
    many = len(data["directions"]) > DETAIL
    crowd = S["others"]["directions"] > 0
    labels = list(S["largest"]) + ([f"+{S['others']['directions']:,} others (sum)"] if crowd else []) + \
        list(S["smallest"])
    splits = data["splits"]
    rows = [by_key[k]["splits"] if k in by_key else S["others"]["splits"] for k in labels]
    per_row = 0.16 + 0.15 * len(splits)
    height = min(1.8 + per_row * len(labels), MAX_INCHES)
    fig = _figure(16 if many else 10, max(height, 4.0))
    if many:
        ax, ax_rank = fig.subplots(1, 2, width_ratios=[1.15, 1])
    else:
        ax = fig.subplots()
    # the others' sum is a row of text, not a bar: on the directions' log axis it would dwarf them (1M against
    # the largest direction's 80k) and stretch the axis past every single one
    other = len(S["largest"]) if crowd else -1
    values = [v for j, r in enumerate(rows) if j != other for v in r.values() if v > 0]
    lo, hi = (min(values), max(values)) if values else (1, 10)
    h = 0.8 / max(len(splits), 1)
    sums = []
    for i, split in enumerate(splits):
        at = [j for j, r in enumerate(rows) if r.get(split, 0) > 0 and j != other]  # a split a direction lacks: none
        bars = ax.barh(np.asarray(at, np.float64) + i * h, [rows[j][split] for j in at], height=h,
                       color=_split_colour(i), log=True)
        share = split in data["length_splits"] and many  # the train bars: their share of all
        total = max(sum(d["splits"].get(split, 0) for d in data["directions"]), 1)
        _log_bar_values(ax, bars, [_num(rows[j][split]) + (f", {_pct(rows[j][split] / total, 1e-4)}" if share else "")
                                   for j in at])
        if crowd and rows[other].get(split, 0):
            v = rows[other][split]
            sums.append(f"{_num(v)} {split}" + (f" ({_pct(v / total, 1e-4)} of all)" if share else ""))
    if crowd:
        ax.axhspan(other - h / 2, other + h * (len(splits) - 0.5), color="0.93", linewidth=0, zorder=0)
        ax.annotate(f"the {S['others']['directions']:,} directions between, added up: {', '.join(sums) or 'none'}; "
                    f"median {_num(S['others']['median'])} each", (0.01, other + h * (len(splits) - 1) / 2),
                    xycoords=("axes fraction", "data"), va="center", ha="left", fontsize=7, style="italic",
                    color="0.2")
    span = max(math.log10(hi) - math.log10(max(lo, 1)), 1.0)
    ax.set_xlim(max(lo, 1) / 2, hi * 10 ** (0.14 * span + 0.2))  # room for the values past the longest bar
    _log_ticks(ax.xaxis, max(lo, 1), hi * 10)
    ax.set_yticks(np.arange(len(labels)) + h * (len(splits) - 1) / 2, labels, fontsize=7)
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("sentences (log scale)", fontsize=8)
    missing = ", ".join(f"{n:,} lack {s}" for s, n in S["without"].items() if n)
    handles = [Patch(color=_split_colour(i), label=s) for i, s in enumerate(splits)]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=min(len(handles), 3), fontsize=7,
              frameon=False, borderaxespad=0.3)
    title = (f"the {len(S['largest'])} largest and {len(S['smallest'])} smallest of {len(data['directions']):,} "
             f"directions" if crowd else f"sentences per direction ({len(data['directions'])})")
    ax.set_title(title + (f"; {missing}" if missing else ""), fontsize=9, pad=22 if len(handles) <= 3 else 34)
    if many:
        sizes = np.array([d["sentences"] for d in data["directions"]], dtype=np.float64)
        order = np.argsort(-sizes, kind="stable")
        rank = np.arange(1, len(sizes) + 1)
        tier = np.array([TIERS.index(data["directions"][i]["tier"]) for i in order])
        for t in range(len(TIERS)):
            m = np.flatnonzero(tier == t)
            if len(m):  # each direction a step one rank wide, the tiers meeting without a gap
                ys = np.maximum(sizes[order][m], 1)
                ax_rank.fill_between(np.append(rank[m] - 0.5, rank[m[-1]] + 0.5), np.append(ys, ys[-1]), 0.5,
                                     step="post", color=TIER_COLOURS[t], alpha=RANK_ALPHA, linewidth=0)
        ys = np.maximum(sizes[order], 1)
        ax_rank.step(np.append(rank - 0.5, rank[-1] + 0.5), np.append(ys, ys[-1]), where="post", color="black",
                     linewidth=0.8)
        tier_handles = [Patch(facecolor=TIER_COLOURS[TIERS.index(t["tier"])], alpha=RANK_ALPHA, linewidth=0,
                              label=f"{t['tier']}: {t['directions']:,} directions, {_num(t['min_sentences'])}-"
                                    f"{_num(t['max_sentences'])} sentences each, {t['share']:.1%} of all")
                        for t in data["tiers"]]
        for i, split in enumerate(splits):
            if split in data["length_splits"]:
                continue
            v = np.array([data["directions"][j]["splits"].get(split, 0) for j in order], dtype=np.float64)
            m = v > 0
            ax_rank.scatter(rank[m], v[m], s=4, color=_split_colour(i), zorder=3)
            tier_handles.append(Line2D([], [], marker="o", markersize=3, color=_split_colour(i), linestyle="",
                                       label=f"{split} of the same direction"))
        ax_rank.set_yscale("log")
        _log_ticks(ax_rank.yaxis, 1, max(sizes.max(), 1))
        ax_rank.set_ylim(bottom=0.5)
        ax_rank.set_xlim(0.5, len(sizes) + 0.5)
        ax_rank.tick_params(labelsize=7)
        ax_rank.set_xlabel("directions, largest first (rank)", fontsize=8)
        ax_rank.set_ylabel(f"sentences ({', '.join(data['length_splits'])}; log)", fontsize=8)
        ax_rank.set_title(f"all {len(sizes):,} directions by size: {_num(sizes.sum())} sentences", fontsize=9)
        ax_rank.legend(handles=tier_handles, loc="upper left", bbox_to_anchor=(0.0, -0.09), fontsize=7,
                       frameon=False, borderaxespad=0)
    return fig


def _split_colour(i: int) -> str:
    return SPLIT_COLOURS[i % len(SPLIT_COLOURS)]


def _log_bar_values(ax, bars, texts) -> None:
    for bar, text in zip(bars, texts):
        ax.annotate(text, (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(3, 0),
                    textcoords="offset points", va="center", ha="left", fontsize=6.5)


def plan_pictures(data: dict) -> dict:
    """``shapes.png`` and ``mixing.png`` for the dict of :func:`babelfeed.tools.plan_report.plan_data`, as
    unsaved Figures."""
    require_matplotlib()
    return {"shapes.png": _shapes(data), "mixing.png": _mixing(data["mixing"])}


def _shares(values, what: str) -> list[float]:
    """Shares as they are; one outside [0, 1] is an error (real tokens never outnumber the padded ones: a sample
    always fits its shape), not a bar to cut at 100%."""
    values = [float(v) for v in values]
    wrong = [v for v in values if not 0 <= v <= 1 + 1e-9]
    if wrong:
        raise InternalError(f"{what} of {wrong[0]:.1%}: a share lies in [0, 100%] (from babelfeed plan: a bug, please "
                            f"report it)")
    return values


def _shape_colours(k: int) -> list:
    if k <= 10:
        return [f"C{i}" for i in range(k)]
    from matplotlib import colormaps  # optional: babelfeed[plot]

    cmap = colormaps["tab20" if k <= 20 else "turbo"]
    return [cmap(i / max(k - 1, 1)) if k > 20 else cmap(i) for i in range(k)]


def _shapes(data: dict):
    """The epoch's (source, target) length histogram with each shape's box, each shape's padding efficiency and
    share of the batches, and the plan against the alternatives."""
    from matplotlib.colors import LogNorm  # optional: babelfeed[plot]
    from matplotlib.patches import Rectangle  # optional: babelfeed[plot]

    shapes = data["shapes"]
    alt = data["alternatives"]
    eff = _shares([s["efficiency"] for s in shapes], "a shape's padding efficiency")
    values = _shares([a["efficiency"] for a in alt], "an alternative's padding efficiency")
    drawn = list(range(len(shapes)))
    if len(shapes) > MAX_SHAPES:
        drawn = sorted(sorted(drawn, key=lambda i: -shapes[i]["batches"])[:MAX_SHAPES])
    colours = _shape_colours(len(drawn))
    if len(drawn) <= 16:  # one row: the histogram, the shapes, the alternatives
        fig = _figure(17, max(5.4, 2.6 + 0.27 * len(drawn)))
        grid = fig.add_gridspec(1, 3, width_ratios=[1.25, 1, 1.1])
        ax_hist, ax_shape = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
        alt_slot = grid[0, 2]
    else:  # the shapes' bars down the right, as tall as they need; the histogram above the alternatives
        fig = _figure(17, max(10.0, 2.0 + 0.2 * len(drawn)))
        grid = fig.add_gridspec(2, 2, width_ratios=[1.2, 1], height_ratios=[1.6, 1])
        ax_hist, alt_slot = fig.add_subplot(grid[0, 0]), grid[1, 0]
        ax_shape = fig.add_subplot(grid[:, 1])

    H = data["lengths"]
    w, (cs, ct) = H["bin"], H["clip"]
    xe, ye = np.arange(0, cs + w + 1, w), np.arange(0, ct + w + 1, w)
    grid = np.full((len(xe) - 1, len(ye) - 1), np.nan)
    for s, t, v in H["cells"]:
        grid[s // w, t // w] = v
    mesh = ax_hist.pcolormesh(xe, ye, grid.T, norm=LogNorm(), cmap="viridis")
    bar = fig.colorbar(mesh, ax=ax_hist, pad=0.01)
    bar.set_label("samples drawn in epoch 1 (expected)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    for c, i in zip(colours, drawn):
        ax_hist.add_patch(Rectangle((0, 0), shapes[i]["source"], shapes[i]["target"], fill=False, edgecolor=c,
                                    linewidth=1.4))
    notes = []
    limits = H.get("limits")
    if limits:
        inside = [f"{side} > {value:,}" for value, side, top in ((limits[0], "source", cs), (limits[1], "target", ct))
                  if value <= top]
        if limits[0] <= cs:
            ax_hist.axvline(limits[0], color="C3", linestyle="--", linewidth=1)
        if limits[1] <= ct:
            ax_hist.axhline(limits[1], color="C3", linestyle="--", linewidth=1)
        notes.append(f"red dashes: the filter ({', '.join(inside)} dropped)" if inside else
                     f"the filter (source > {limits[0]:,}, target > {limits[1]:,} dropped) lies past the axes")
    wider = [(c, i) for c, i in zip(colours, drawn) if shapes[i]["source"] > cs or shapes[i]["target"] > ct]
    if wider:
        corner = _emptier_corner(H["cells"], cs, ct)
        notes.append(f"{len(wider)} box{'es reach' if len(wider) > 1 else ' reaches'} past the axes: named "
                     f"{corner}")
        _beyond_labels(ax_hist, [(c, shapes[i]) for c, i in wider], corner, cs + w, ct + w)
    ax_hist.set_xlim(0, cs + w)
    ax_hist.set_ylim(0, ct + w)
    ax_hist.set_xlabel(_clip_note("source tokens", cs, H["longer"][0], H["longest"][0], H["quantile"], "\n"),
                       fontsize=8)
    ax_hist.set_ylabel(_clip_note("target tokens", ct, H["longer"][1], H["longest"][1], H["quantile"], "\n"),
                       fontsize=8)
    ax_hist.set_title("\n".join(["lengths of an epoch, each shape's box in its bar's colour"] + notes), fontsize=9)
    ax_hist.tick_params(labelsize=7)

    names = [f"{shapes[i]['batch']} x {shapes[i]['source']} x {shapes[i]['target']}" for i in drawn]
    bars = ax_shape.barh(np.arange(len(drawn)), [eff[i] for i in drawn], color=colours)
    _bar_values(ax_shape, bars, [f"{_pct(eff[i])}, {_pct(shapes[i]['share_of_batches'])} of batches"
                                 if shapes[i]["batches"] else "no batch in epoch 1" for i in drawn],
                size=7 if len(drawn) <= 24 else 6)
    ax_shape.set_yticks(np.arange(len(drawn)), names, fontsize=7 if len(drawn) <= 24 else 6)
    ax_shape.invert_yaxis()
    ax_shape.set_xlim(0, 1)
    _percent_axis(ax_shape.xaxis)
    ax_shape.tick_params(axis="x", labelsize=7)
    ax_shape.set_xlabel("real / padded tokens of the shape's batches, epoch 1 (masked rows as padding)", fontsize=8)
    more = f" ({len(drawn)} most used of {len(shapes)})" if len(drawn) < len(shapes) else ""
    ax_shape.set_title(f"padding efficiency per shape (B x src x tgt){more}", fontsize=9)

    _alternatives(fig, alt_slot, alt, values, len(shapes))
    return fig


MEASURES = {"1-D": ("1-D: the usual bucketings, one length per sample (max(src, tgt)),\nno masked rows: compare "
                    "them with each other, not with the 2-D bars", "#8da0cb"),
            "2-D": ("2-D: what a batch pays, both sides, masked rows counted\n(red: this plan)", "C7")}


def _measure(alt: dict) -> str:
    """An alternative's measure; a plan.json of before the field: from its name."""
    return alt.get("measure") or ("1-D" if alt["name"].endswith("1-D") else "2-D")


def _alternatives(fig, slot, alt: list[dict], values: list[float], shapes: int) -> None:
    """The plan against the alternatives, one axes per measure (1-D bucketings apart from the 2-D lines, so that
    no bar is read against one of the other measure), each with its heading, its bars in their own colour."""
    order = list(MEASURES) + [m for m in dict.fromkeys(_measure(a) for a in alt) if m not in MEASURES]
    groups = [(m, [j for j, a in enumerate(alt) if _measure(a) == m]) for m in order]
    groups = [(m, js) for m, js in groups if js]
    sub = slot.subgridspec(len(groups), 1, height_ratios=[len(js) + 1.2 for _, js in groups])
    for g, (m, js) in enumerate(groups):
        ax = fig.add_subplot(sub[g, 0])
        heading, colour = MEASURES.get(m, (m, "C7"))
        bars = ax.barh(np.arange(len(js)), [values[j] for j in js], height=0.7,
                       color=["C3" if alt[j]["this_plan"] else colour for j in js])
        _bar_values(ax, bars, [f"{values[j]:.1%}" for j in js], size=8)
        names = [alt[j]["name"].removesuffix(", 1-D") if m == "1-D" else alt[j]["name"] for j in js]
        ax.set_yticks(np.arange(len(js)), names, fontsize=7)
        ax.set_ylim(len(js) - 0.4, -0.6)
        ax.set_xlim(0, 1)
        _percent_axis(ax.xaxis)
        ax.tick_params(axis="x", labelsize=7)
        # (right-aligned, the headings reach over the names' column, not past the figure)
        ax.set_title(heading if g else f"{shapes} static shapes against the alternatives, in two measures\n{heading}",
                     fontsize=8, loc="right")
        if g == len(groups) - 1:
            ax.set_xlabel("real / padded tokens", fontsize=8)


def _emptier_corner(cells: list, cs: int, ct: int) -> str:
    """Where the names of the boxes past the axes hide the least data: the top left (long targets are rare) or
    the bottom right (long sources), whichever holds less of the histogram's weight."""
    c = np.asarray(cells, dtype=np.float64).reshape(-1, 3)
    top_left = c[(c[:, 0] < 0.5 * cs) & (c[:, 1] > 0.75 * ct), 2].sum()
    bottom_right = c[(c[:, 0] > 0.5 * cs) & (c[:, 1] < 0.25 * ct), 2].sum()
    return "bottom right" if bottom_right < top_left else "top left"


def _beyond_labels(ax, wider: list, corner: str, x_end: float, y_end: float) -> None:
    """The boxes past the axes' cut, named in their colours in a corner of the axes with their share of the
    batches, an arrow to the side they leave by: a shape of 15% of the batches is not to be invisible."""
    right = corner == "bottom right"
    lines = [("boxes past the axes:", "0.15", "normal")]
    named = sorted(wider, key=lambda cs: -cs[1]["share_of_batches"])[:BEYOND]
    for c, s in [cs for cs in wider if cs in named]:  # (the most used, in the bars' order)
        arrow = "\u2197" if s["source"] > x_end and s["target"] > y_end else "\u2192" if s["source"] > x_end else \
            "\u2191"
        lines.append((f"{arrow} {s['batch']} x {s['source']} x {s['target']}: {_pct(s['share_of_batches'])} of "
                      f"batches", c, "bold"))
    if len(wider) > len(named):
        rest = sum(s["share_of_batches"] for c, s in wider if (c, s) not in named)
        lines.append((f"+{len(wider) - len(named)} more: {_pct(rest)} of batches", "0.15", "normal"))
    if right:
        lines.reverse()  # (stacked up from the bottom)
    for n, (text, colour, weight) in enumerate(lines):
        ax.annotate(text, (0.985 if right else 0.015, 0.02 if right else 0.98), xycoords="axes fraction",
                    xytext=(0, 10.5 * n if right else -10.5 * n), textcoords="offset points", fontsize=7,
                    ha="right" if right else "left", va="bottom" if right else "top", color=colour,
                    fontweight=weight,
                    bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.9})


def _mixing(data: dict):
    """Each direction's probability against its size at the configured temperature (and the share epoch 1
    served it), and per tier (per direction up to DETAIL) the shares of the data, the probability and the
    served samples."""
    from matplotlib.lines import Line2D  # optional: babelfeed[plot]

    dirs = data["directions"]
    many = len(dirs) > DETAIL
    sizes = np.array([max(d["size"], 1) for d in dirs], dtype=np.float64)
    probs = np.array([d["probability"] for d in dirs], dtype=np.float64)
    served = np.array([d["served"] for d in dirs], dtype=np.float64)
    groups = data["tiers"] if many else sorted(dirs, key=lambda d: -d["size"])
    fig = _figure(16, min(max(5.5, 2.2 + 0.5 * len(groups)), MAX_INCHES))
    ax, ax_bar = fig.subplots(1, 2, width_ratios=[1.3, 1])
    x = np.sort(sizes)
    ax.plot(x, x / sizes.sum(), "--", color="0.5", linewidth=1)
    ax.plot(x, np.full(len(x), 1 / len(x)), ":", color="0.5", linewidth=1)
    handles = [Line2D([], [], color="0.5", linestyle="--", label="T = 1: proportional to size"),
               Line2D([], [], color="0.5", linestyle=":", label="T = inf: uniform")]
    total = served.sum()
    by_key = {d["key"]: i for i, d in enumerate(dirs)}
    if many:
        ax.scatter(sizes, probs, s=14, linewidths=0, alpha=MIX_ALPHA, zorder=3,
                   c=[TIER_COLOURS[TIERS.index(d["tier"])] for d in dirs])
        handles += _tier_handles(data["tiers"], points=MIX_ALPHA)
    for (marker, colour), key in zip(NAMED, data["named"]):
        i = by_key[key]
        ax.scatter([sizes[i]], [probs[i]], s=45, marker=marker, color=colour, edgecolors="black", linewidths=0.6,
                   zorder=4)
        passes = f", served {_times(served[i] / sizes[i])} its size" if total else ""
        handles.append(Line2D([], [], marker=marker, color=colour, markeredgecolor="black", linestyle="",
                              label=f"{key}: {_num(sizes[i])}, p {probs[i]:.2%}{passes}"))
    if total:
        ax.scatter(sizes, np.where(served > 0, served / total, np.nan), s=7, color="black", marker="x",
                   linewidths=0.5, alpha=0.6, zorder=5)
        handles.append(Line2D([], [], color="black", marker="x", linestyle="", markersize=4,
                              label="served share, epoch 1"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    shown = np.concatenate([probs[probs > 0], served[served > 0] / max(total, 1)])
    if len(shown):  # the directions, not the lines' far ends
        ax.set_ylim(shown.min() / 2, min(shown.max() * 2, 1.0))
        _log_ticks(ax.yaxis, shown.min() / 2, min(shown.max() * 2, 1.0), percent=True)
    _log_ticks(ax.xaxis, sizes.min(), sizes.max())
    ax.tick_params(labelsize=7)
    cycle = "; data.shards='cycle'" if data["size_is"] == "epoch 1's shard" else ""
    ax.set_xlabel(f"sentences of the direction, {data['size_is']} (log{cycle})", fontsize=8)
    ax.set_ylabel("share of the mixture (log)", fontsize=8)
    method = data.get("method") or f"temperature {data['temperature']:g}"
    ax.set_title(f"temperature sampling (T = {data['temperature']:g}): small directions up-sampled, large ones down"
                 if method == f"temperature {data['temperature']:g}" else
                 f"{method}: each direction's share of the mixture against its size", fontsize=9)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, fontsize=7,
              frameon=False, title="size, configured probability" if not many else
              "tiers; the largest and smallest named", title_fontsize=7)

    n = len(groups)
    names = [f"{g['tier']} ({g['directions']:,})" for g in groups] if many else [g["key"] for g in groups]
    if many:
        cols = [[g[k] for g in groups] for k in ("data_share", "probability", "served_share")]
    else:
        idx = [by_key[g["key"]] for g in groups]
        cols = [(sizes[idx] / sizes.sum()).tolist(), probs[idx].tolist(),
                (served[idx] / max(total, 1)).tolist()]
    labels = ["share of the data (T = 1)", f"configured probability ({data.get('method') or 'temperature'})",
              "served in epoch 1"]
    h = 0.27
    for j, (vals, label) in enumerate(zip(cols, labels)):
        if j == 2 and not total:
            continue
        bars = ax_bar.barh(np.arange(n) + (j - 1) * h, vals, height=h, label=label, color=("0.6", "C0", "C3")[j])
        _bar_values(ax_bar, bars, [f"{v:.1%}" for v in vals], size=7)
    ax_bar.set_yticks(np.arange(n), names, fontsize=7)
    ax_bar.invert_yaxis()
    ax_bar.set_xlim(0, 1)
    _percent_axis(ax_bar.xaxis)
    ax_bar.tick_params(axis="x", labelsize=7)
    ax_bar.set_xlabel("share of the samples", fontsize=8)
    if many:
        ups = ", ".join(f"{g['tier']} {_times(g['upsampling'])}" for g in groups)
        ax_bar.set_title(f"per resource tier (a third of the directions each)\nprobability over share of the data: "
                         f"{ups}", fontsize=9)
    else:
        ax_bar.set_title("per direction", fontsize=9)
    ax_bar.legend(loc="upper left", bbox_to_anchor=(0.0, -0.1), fontsize=7, frameon=False, borderaxespad=0)
    return fig


def save(figures: dict, data: dict, out_dir: str, json_name: str) -> list[str]:
    """Write each Figure as ``out_dir/NAME`` and ``data`` as ``out_dir/json_name``; the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        path = os.path.join(out_dir, name)
        fig.savefig(path)
        paths.append(path)
    path = os.path.join(out_dir, json_name)
    with open(path, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    return paths + [path]


def inspect_figures(rows: list[dict], out_dir: str) -> list[str]:
    """``inspect --plot``: from ``stats.corpus_stats(..., histograms=True)``, ``lengths.png``, ``sentences.png``
    and ``inspect.json`` (:func:`inspect_data`) in ``out_dir``; the paths written."""
    data = inspect_data(rows)
    return save(inspect_pictures(data), data, out_dir, "inspect.json")


def plan_figures(data: dict, out_dir: str) -> list[str]:
    """``plan --plot``: ``shapes.png``, ``mixing.png`` and ``plan.json`` (``data``) in ``out_dir``."""
    return save(plan_pictures(data), data, out_dir, "plan.json")
