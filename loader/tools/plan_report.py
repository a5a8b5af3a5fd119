"""``babelfeed plan CONFIG``: the static shapes a config gets, and what they cost against the alternatives."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import Counter

import numpy as np

from babelfeed.build import mixture_lengths, shape_plan, train_sources
from babelfeed.checks import at_least
from babelfeed.config.spec import parse
from babelfeed.plan.planner import EpochPlanner
from babelfeed.plan.shapes import edges_efficiency, equal_mass_edges, percentile_edges, plan_shapes
from babelfeed.tools import plots


def _epoch_summary(planner, per_shape: dict | None = None) -> tuple[Counter, int, float, int]:
    """Batches per shape, batches, padding efficiency (real / padded tokens, masked rows as padding), masked rows;
    ``per_shape`` receives each shape's [real, padded] tokens."""
    shapes = Counter()
    real = padded = masked = 0
    planner.num_batches(1)  # every window planned (the stream sampler knows its window count only then)
    setup = planner.setup(1)
    for w in range(setup.num_windows):
        win = planner.window(1, w)
        starts = np.concatenate([[0], win.ends[:-1]])
        for b, (a, e) in enumerate(zip(starts.tolist(), win.ends.tolist())):
            src, tgt = win.src_len[a:e], win.tgt_len[a:e]
            if win.shape is not None:
                shape = planner.opts.shapes[int(win.shape[b])]
                rows, ls, lt = shape[0], shape[1], shape[-1]
                masked += int(win.masked[b])
            else:
                rows, ls, lt = e - a, int(src.max()), int(tgt.max())
                shape = (rows, ls, lt)
            shapes[tuple(shape)] += 1
            real += int(src.sum() + tgt.sum())
            padded += rows * (ls + lt)
            if per_shape is not None:
                tokens = per_shape.setdefault(tuple(shape), [0, 0])
                tokens[0] += int(src.sum() + tgt.sum())
                tokens[1] += rows * (ls + lt)
    return shapes, sum(shapes.values()), real / max(padded, 1), masked


def _weighted_copies(cost: np.ndarray, weights: np.ndarray, most: int = 2_000_000) -> np.ndarray:
    """The lengths ``cost``, each repeated in proportion to its weight (at least once, at most ``most`` in all),
    for the 1-D edge methods that take samples, not weights. A weight of 0 (a corpus a low temperature never
    draws) leaves its lengths out."""
    keep = weights > 0
    cost, weights = cost[keep], weights[keep]
    if not len(cost) or len(cost) >= most:
        return cost
    copies = np.maximum(np.round(weights / weights.min()), 1)
    if copies.sum() > most:  # (a corpus drawn a million times more than another: the shares, in fewer copies)
        copies = np.maximum(np.round(copies * (most / copies.sum())), 1)
    return np.repeat(cost, copies.astype(np.int64))


def plan_report(config, num_shapes: int | None = None, plot_dir: str | None = None, as_json: bool = False) -> str:
    """The report's text (``as_json``: :func:`plan_data`'s dict as JSON); with ``plot_dir``, also shapes.png,
    mixing.png and plan.json there (plots.py)."""
    lines, data = _plan(config, num_shapes, with_data=bool(plot_dir or as_json))
    if plot_dir:
        files = plots.plan_figures(data, plot_dir)
        lines.append("wrote " + ", ".join(files))
    if as_json:
        return json.dumps(data, indent=1)
    return "\n".join(lines)


def plan_data(config, num_shapes: int | None = None) -> dict:
    """What ``plan --plot`` draws and ``plan --json`` prints, JSON-ready: the config's batching; per shape its
    ``batch``, ``source`` and ``target`` widths, planned share of the samples, and in epoch 1 its batches, their
    share, real and padded tokens (masked rows as padding) and ``efficiency`` (real / padded); epoch 1 with
    these shapes and with dynamic batches; the ``alternatives`` (name, efficiency, whether it is this plan,
    and its ``measure``: "1-D", a bucketing of one length per sample, max(source, target), without masked rows, or
    "2-D", what a batch pays, both sides, masked rows counted; compare within a measure, not across);
    ``lengths``, the (source, target) histogram of the mixture (:func:`plots.length_cells`); ``mixing``, each
    direction's size, probability and served samples with the tiers (:func:`plots.mixing_data`)."""
    return _plan(config, num_shapes)[1]


def _plan(config, num_shapes: int | None, with_data: bool = True) -> tuple[list[str], dict | None]:
    """The report's lines, and with ``with_data`` :func:`plan_data`'s dict (its histograms and mixture are work
    the text alone does not need)."""
    parse(config)
    config = copy.deepcopy(config)  # (the shapes asked for are set on a copy: the caller's config is left as it is)
    if num_shapes is not None:
        at_least("num_shapes", num_shapes, 1)
        config.batching.num_shapes = num_shapes
        config.batching.shapes = ""
    # a config of dynamic batches: the report shows what static shapes would be, and says so first
    dynamic_config = config.batching.num_shapes <= 0 and not str(config.batching.shapes).strip()
    if dynamic_config:
        config.batching.num_shapes = 8

    settings = parse(config)  # (the copy with the shapes asked for, parsed once for the data and the shapes)
    sources, _, opts = train_sources(settings)
    dynamic = EpochPlanner(sources, opts)
    plan = shape_plan(settings, dynamic)
    static = EpochPlanner(sources, dataclasses.replace(opts, shapes=tuple(plan.shapes)))
    lines = [f"static shapes for {config.data.path} (max_tokens {config.batching.max_tokens}, "
             f"multiple {config.batching.required_batch_size_multiple}), from the mixture's length histogram:",
             plan.describe(), ""]
    if dynamic_config:
        lines[:0] = ["this config batches dynamically (batching.num_shapes = 0): its epoch is the last line, "
                     f"'epoch 1 with dynamic batches'. The {plan.num_shapes} shapes below are what "
                     f"batching.num_shapes = 8 (or --shapes K) would give, for XLA.", ""]
    all_lengths, all_weights, _ = mixture_lengths(dynamic)
    limits = (config.filter.max_source_positions, config.filter.max_target_positions)
    kept = (all_lengths[:, 0] <= limits[0]) & (all_lengths[:, 1] <= limits[1])  # what the filter lets through,
    lengths, weights = all_lengths[kept], all_weights[kept]  # as the shapes above are priced (shape_plan)
    if not kept.all():
        fate = "training skips them" if config.filter.on_too_long == "skip" else \
            "training stops at the first one drawn (filter.on_too_long = 'raise')"
        lines += [f"filter.max_source_positions / max_target_positions = {limits[0]} / {limits[1]} leave out "
                  f"{all_weights[~kept].sum() / max(all_weights.sum(), 1e-12):.2%} of the mixture's samples "
                  f"({fate}): every line below is without them", ""]
    cost = lengths.max(axis=1)
    k = plan.num_shapes
    reps = _weighted_copies(cost, weights)
    # the optimum of this very measure (windows=0: no masked rows priced in), so that it bounds the three others
    alternatives = {"optimal edges (dynamic programme)": plan_shapes(reps, k, config.batching.max_tokens,
                                                                     multiple=1, windows=0).efficiency,
                    "percentile edges (fairseq get_buckets)": edges_efficiency(reps, percentile_edges(reps, k)),
                    "equal token mass (Lhotse)": edges_efficiency(reps, equal_mass_edges(reps, k)),
                    "pad to the longest": edges_efficiency(reps, [reps.max()])}
    lines.append(f"the usual bucketings, 1-D: {k} length edges on max(src, tgt), each sample padded to its edge on "
                 f"that one length")
    lines.append("(their own measure, with no source/target split and no masked rows: compare them with each other, "
                 "not with the 2-D lines)")
    lines += [f"  {name:<40} {value:.1%}" for name, value in alternatives.items()]
    old = plan_shapes(lengths, k, config.batching.max_tokens, config.batching.required_batch_size_multiple,
                      config.batching.max_sentences or None, weights=weights, windows=plan.windows, method="max")
    lines.append("2-D, what a batch pays: (source, target) widths per shape, real / padded tokens of both sides, "
                 "masked rows counted (without them):")
    lines.append(f"  buckets of max(src, tgt), each its widest source and target   {old.fill:.1%} "
                 f"({old.efficiency:.1%})")
    lines.append(f"  this plan, free (source, target) boxes                         {plan.fill:.1%} "
                 f"({plan.efficiency:.1%})   <- the shapes above")
    tokens: dict = {}
    s_shapes, s_batches, s_eff, masked = _epoch_summary(static, tokens)
    d_shapes, d_batches, d_eff, _ = _epoch_summary(dynamic)
    lines.append("")
    lines.append(f"epoch 1 with these shapes: {s_batches:,} batches, padding efficiency {s_eff:.1%} "
                 f"(masked rows counted as padding: {masked:,})")
    for shape in plan.shapes:
        lines.append(f"  {' x '.join(map(str, shape)):<18} {s_shapes.get(tuple(shape), 0) / max(s_batches, 1):>7.1%} "
                     f"of batches")
    lines.append(f"epoch 1 with dynamic batches: {d_batches:,} batches in {len(d_shapes):,} distinct shapes "
                 f"(one XLA compilation each), padding efficiency {d_eff:.1%}")

    setup = dynamic.setup(1)
    served = setup.counts - dynamic.filtered(1)
    mixing = plots.mixing_data(
        [d.key for d in setup.directions], [d.size for d in setup.directions], np.asarray(setup.probs, np.float64),
        served, config.mixing.temperature,
        size_is="epoch 1's shard" if config.data.shards == "cycle" else "every shard", method=mixture_name(config))
    lines += [""] + mixture_lines(mixing)
    notice = setup.upsampling_notice(config.mixing.warn_upsample, method=config.mixing.method,
                                     cap=config.mixing.max_upsample)
    if notice:
        lines += ["", f"warning: {notice}"]
    if not with_data:
        return lines, None
    data = {"data_path": str(config.data.path), "batches": "dynamic" if dynamic_config else "static",
            "max_tokens": int(config.batching.max_tokens),
            "required_batch_size_multiple": int(config.batching.required_batch_size_multiple),
            "shapes": [], "alternatives": [],
            "epoch1": {"static": {"batches": s_batches, "efficiency": s_eff, "masked_rows": masked},
                       "dynamic": {"batches": d_batches, "shapes": len(d_shapes), "efficiency": d_eff}}}
    for shape, share in zip(plan.shapes, plan.share.tolist()):
        real, padded = tokens.get(tuple(shape), (0, 0))
        n = s_shapes.get(tuple(shape), 0)
        data["shapes"].append({"batch": int(shape[0]), "source": int(shape[1]), "target": int(shape[-1]),
                               "planned_share": float(share), "batches": n, "share_of_batches": n / max(s_batches, 1),
                               "real_tokens": real, "padded_tokens": padded, "efficiency": real / max(padded, 1)})
    # two measures, not to be compared across: "1-D", one length per sample (max(src, tgt)), no masked rows;
    # "2-D", what a batch pays, both sides, masked rows counted
    compared = [(f"{name}, 1-D", v, "1-D") for name, v in alternatives.items()] + [
        ("buckets of max(src, tgt), 2-D widths", old.fill, "2-D"),
        (f"this plan: {k} (source, target) boxes", plan.fill, "2-D"),
        (f"this plan, epoch 1 ({s_batches:,} batches)", s_eff, "2-D"),
        (f"dynamic batches ({len(d_shapes):,} shapes)", d_eff, "2-D")]
    data["alternatives"] = [{"name": name, "efficiency": float(v), "this_plan": name.startswith("this plan"),
                             "measure": measure} for name, v, measure in compared]
    data["lengths"] = plots.length_cells(all_lengths, all_weights, limits)  # (the filtered ones drawn beyond)
    data["mixing"] = mixing
    return lines, data


def mixture_name(config) -> str:
    """How a config makes its mixture, in a few words: "temperature 5", "UniMax, max_upsample 4", "uniform"..."""
    m = config.mixing
    name = {"temperature": f"temperature {m.temperature:g}", "unimax": "UniMax", "uniform": "uniform",
            "weights": "fixed weights"}.get(m.method, str(m.method))
    return name + (f", max_upsample {m.max_upsample:g}" if m.max_upsample else "")


def mixture_lines(mixing: dict) -> list[str]:
    """Epoch 1's mixture as text (:func:`plots.mixing_data`'s dict): per resource tier its share of the data, of
    the probability and of the served samples; then each direction (the largest and smallest above 12): its size,
    probability and served samples."""
    dirs = mixing["directions"]
    lines = [f"epoch 1's mixture ({mixing.get('method') or 'temperature %g' % mixing['temperature']}; sizes: "
             f"{mixing['size_is']}): "
             f"{len(dirs):,} directions, {mixing['served']:,} samples served"]
    if len(mixing["tiers"]) > 1:
        lines.append(f"  {'tier':<5} {'directions':>10} {'sizes':>19} {'data share':>10} {'probability':>11} "
                     f"{'served share':>12} {'epochs':>7}")
        for t in mixing["tiers"]:
            lines.append(f"  {t['tier']:<5} {t['directions']:>10,} {t['min_size']:>9,}-{t['max_size']:<9,} "
                         f"{t['data_share']:>10.1%} {t['probability']:>11.1%} {t['served_share']:>12.1%} "
                         f"{t['epochs']:>6.1f}x")
    by_key = {d["key"]: d for d in dirs}
    named = [by_key[k] for k in mixing["named"]]
    served = max(mixing["served"], 1)
    head = "direction" if len(named) == len(dirs) else f"direction ({len(named)} of {len(dirs):,}: largest, smallest)"
    width = max([len(head)] + [len(d["key"]) for d in named])
    lines.append(f"  {head:<{width}} {'size':>11} {'probability':>11} {'served':>11} {'served share':>12} "
                 f"{'epochs':>7}")
    for d in named:
        epochs = d["served"] / d["size"] if d["size"] else 0.0
        lines.append(f"  {d['key']:<{width}} {d['size']:>11,} {d['probability']:>11.3f} {d['served']:>11,} "
                     f"{d['served'] / served:>12.3f} {epochs:>6.1f}x")
    lines.append("  (epochs: how many times the epoch serves a direction's data, its up-sampling)")
    return lines


def upsampling(config) -> tuple[dict, str]:
    """``({direction: (sentences, epochs in epoch 1)}, warning)``: how many times epoch 1's mixture serves each
    train direction's data (its shard this epoch: that many sentences), and the warning naming those above
    ``mixing.warn_upsample`` ("" when none is)."""
    sources, _, opts = train_sources(config)
    setup = EpochPlanner(sources, opts).setup(1)
    times = setup.epochs()
    notice = setup.upsampling_notice(config.mixing.warn_upsample, method=config.mixing.method,
                                     cap=config.mixing.max_upsample)
    return {d.key: (d.size, float(t)) for d, t in zip(setup.directions, times.tolist())}, notice or ""


def upsampling_lines(config, top: int = 12) -> list[str]:
    """What ``inspect`` adds for a translation config over its data_bin: each direction's epochs in epoch 1 (how
    many times the mixture serves its data), the most up-sampled first, and the warning ``plan`` ends with."""
    got, notice = upsampling(config)
    order = sorted(got, key=lambda k: -got[k][1])
    width = max(len(k) for k in got)
    lines = [f"epoch 1's up-sampling (mixing.method {config.mixing.method!r}, temperature "
             f"{config.mixing.temperature:g}{f', max_upsample {config.mixing.max_upsample:g}' if config.mixing.max_upsample else ''}): "
             f"how many times it serves each direction's data (its shard this epoch)"]
    for key in order[:top]:
        lines.append(f"  {key:<{width}} {got[key][0]:>11,} sentences {got[key][1]:>7.1f}x")
    if len(order) > top:
        lines.append(f"  ... and {len(order) - top:,} more (babelfeed plan shows every one)")
    return lines + ([f"warning: {notice}"] if notice else [])

