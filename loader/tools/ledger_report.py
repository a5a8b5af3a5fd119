"""``babelfeed ledger``: what a run trained on, from its latest state alone.

Per corpus and shard (an LM run: per blended dataset), the samples and tokens served, the passes over its rows,
and what the run's skips dropped; per skip, when it took effect, why, what it named and how much it dropped.
The counts are a recount of the run's plan, segment by segment (its mixture edits, weight changes and world
sizes, as the state's history has them), so they are exact and need no log of the training: the batches a run
serves are a pure function of its config, its data and its history.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np

from babelfeed.errors import UsageError
from babelfeed.iterators.ledger import check_trace_state
from babelfeed.iterators.protocol import MAX_EPOCHS_AHEAD
from babelfeed.iterators.replay import _segment, _views, cached, state_key
from babelfeed.run.edits import Edits
from babelfeed.run.history import upgrade
from babelfeed.run.skips import Skips
from babelfeed.tools import plots
from babelfeed.tools.plots import _figure


def _what(e: dict) -> str:
    if "steps" in e:
        a, b = e["steps"]
        on = f" (of a run on {e['world_size']} ranks)" if "world_size" in e else ""
        return (f"step {a}" if b == a + 1 else f"steps {a}-{b - 1}") + on
    if "ids" in e and "rows" in e:
        return f"{e['ids']} sample id(s)"
    if "ids" in e:  # an LM run's: global samples
        n = sum(hi - lo for lo, hi in e["ids"])
        return f"{n} sample(s)"
    terms = []
    for k, v in e["where"].items():
        if k in ("rows", "documents"):
            terms.append(f"{k} {v[0]}-{v[1] - 1}")
        else:
            terms.append(f"{k} {','.join(map(str, v))}")
    return "; ".join(terms)


def _event_row(i: int, e: dict, samples: int, tokens: int) -> dict:
    where = {"epoch": e["epoch"], "batch": e["batch"]} if "epoch" in e else {"sample": e["sample"]}
    return {"skip": i + 1, "after_step": e["step"], **where, "reason": e["reason"], "what": _what(e),
            "samples": int(samples), "tokens": int(tokens), "event": e}


def _segment_ranges(probe, state: dict, views) -> list:
    """Per segment of the run (before, between and after its mixture edits): (iterator of its plan, first
    (epoch, batch), end (epoch, batch)), the end not served."""
    edits = views.edits
    out = []
    world, split = probe.world_size, probe.split  # (the plan, and so the count, does not depend on them)
    for m in range(len(edits) + 1):
        it = cached(probe, ("segment", state_key(state), m, world, split),
                    lambda: _segment(probe, state, m, world, split))
        first = (1, 0) if m == 0 else (int(edits[m - 1]["epoch"]), int(edits[m - 1].get("batch", 0)))
        if m < len(edits) and "saved_at_step" in edits[m]:  # (babelfeed 0.1's: the saved window finished first)
            saved = edits[m]["saved"]
            e = int(saved["epoch"])
            last = (e, it.planner.window_end(e, int(saved["consumed"])))
        elif m < len(edits):
            last = (int(edits[m]["epoch"]), int(edits[m]["batch"]))
        else:
            last = (int(state["epoch"]), int(state["consumed"]))
        out.append((it, first, last))
    return out


def translation_ledger(probe, state: dict, progress: bool = True) -> dict:
    """The consumption report of a translation run whose latest state is ``state`` (``probe``: an iterator of
    the run's config and data)."""
    from tqdm.auto import tqdm  # loaded when a bar is drawn (tqdm.auto probes for notebooks)

    state = upgrade(state)
    check_trace_state(probe, state)  # a state of this data and these settings (else the counts would be another run's)
    views = _views(state)
    skips = Skips(views.skips)
    counts: dict = {}  # (stream, shard) -> [samples, src tokens, tgt tokens, skipped, skipped tokens]
    facts: dict = {}  # (stream, shard) -> (task, corpus, rows)
    per_event = np.zeros((len(skips.events), 2), np.int64)
    segments = _segment_ranges(probe, state, views)
    epochs = sum(last[0] - first[0] + 1 for _, first, last in segments)
    if epochs > MAX_EPOCHS_AHEAD:
        raise UsageError(f"the ledger report re-plans every epoch of the run, here {epochs:,}, and more than "
                         f"{MAX_EPOCHS_AHEAD:,} are refused (hours on real data); it.ledger() in the run gives its "
                         f"totals at once")
    bar = tqdm(desc="counting the run's batches", unit="window", disable=None if progress else True, leave=False)
    for it, first, last in segments:
        planner = it.planner
        sources = planner.sources
        specs = {s.name: s for s in sources.streams}
        comps = sources.components
        for c in comps:
            facts.setdefault((c.key, int(c.shard)), (specs[c.key].task, specs[c.key].key, len(c)))
        saved_skips = it.skips
        it.skips = skips
        try:  # (a segment begins where the edit before it took effect, which the segment before it ends at)
            for epoch in range(first[0], last[0] + 1):
                stop = last[1] if epoch == last[0] else None
                _count_epoch(it, epoch, first[1] if epoch == first[0] else 0, stop, counts, per_event, bar)
        finally:
            it.skips = saved_skips
    bar.close()
    rows = []
    for (stream, shard), c in sorted(counts.items()):
        task, corpus, n = facts[(stream, shard)]
        rows.append({"stream": stream, "task": task, "corpus": corpus, "shard": shard, "rows": n,
                     "samples": int(c[0]), "src_tokens": int(c[1]), "tgt_tokens": int(c[2]),
                     "passes": int(c[0] // n) if n else 0, "skipped": int(c[3]), "skipped_tokens": int(c[4])})
    totals = {k: sum(r[k] for r in rows) for k in ("samples", "src_tokens", "tgt_tokens", "skipped",
                                                     "skipped_tokens")}
    return {"kind": "translation", "name": state.get("name"), "step": int(state["total_steps"]),
            "epoch": int(state["epoch"]), "batch": int(state["consumed"]), "rows": rows, "totals": totals,
            "skips": [_event_row(i, e, *per_event[i]) for i, e in enumerate(skips.events)],
            "edits": Edits(views.edits).timeline()}


def _count_epoch(it, epoch: int, start: int, stop: int | None, counts: dict, per_event: np.ndarray, bar) -> None:
    """Add the global batches ``[start, stop)`` of ``epoch`` (``stop`` None: to its end) of ``it``'s plan: per
    component, planned samples and tokens, and the rows the skips drop (``it.skips``), by skip."""
    planner = it.planner
    comps = planner.sources.components
    setup = planner.setup(epoch)
    w, g0 = 0, planner.first_batch(epoch)
    # per component: planned samples, source tokens, target tokens; skipped samples, source, target tokens
    acc = np.zeros((6, len(comps)), np.int64)

    def add(row: int, comp, weights=None) -> None:
        acc[row] += np.round(np.bincount(comp, weights=weights, minlength=len(comps))).astype(np.int64)

    while planner._exists(setup, w) and (stop is None or g0 < stop):
        win = planner.window(epoch, w)
        n = len(win)
        a, b = max(start - g0, 0), n if stop is None else min(stop - g0, n)
        if a < b:
            s = win.samples
            rows = win.batch_rows(np.arange(a, b))
            comp = s.comp[rows].astype(np.int64)
            add(0, comp)
            add(1, comp, s.src_len[rows].astype(np.float64))
            add(2, comp, s.tgt_len[rows].astype(np.float64))
            if it.skips:
                gone, which = it.dropped_rows(win, g0, a, b)
                if len(gone):
                    gc = s.comp[gone].astype(np.int64)
                    src, tgt = s.src_len[gone].astype(np.int64), s.tgt_len[gone].astype(np.int64)
                    add(3, gc)
                    add(4, gc, src.astype(np.float64))
                    add(5, gc, tgt.astype(np.float64))
                    np.add.at(per_event, (which, 0), 1)
                    np.add.at(per_event, (which, 1), src + tgt)
        g0 += n
        w += 1
        bar.update(1)
    for j, c in enumerate(comps):
        if acc[0, j]:
            got = counts.setdefault((c.key, int(c.shard)), np.zeros(5, np.int64))
            got += [acc[0, j] - acc[3, j], acc[1, j] - acc[4, j], acc[2, j] - acc[5, j], acc[3, j],
                    acc[4, j] + acc[5, j]]


def lm_ledger(it, state: dict | None) -> dict:
    """The consumption report of an LM run (``it``: an iterator of its config) at ``state`` (None: ``it``'s)."""
    if state is not None:
        it = it.run_of(state)
    batches = it.consumed // it.global_batch
    totals = it.ledger_totals(batches)
    skipped = it.skipped_totals(batches)
    per_event = np.zeros((len(it.skips.events), 2), np.int64)
    if it.skips:
        step = 1 << 16
        for lo in range(0, it.consumed, step):
            g = np.arange(lo, min(lo + step, it.consumed))
            which = it.skips.which_samples(g, it._where)
            hit = which >= 0
            if hit.any():
                tokens = it.real_tokens_of(g[hit])
                np.add.at(per_event, (which[hit], 0), 1)
                np.add.at(per_event, (which[hit], 1), tokens)
    rows = []
    for d, name in enumerate(it.dataset_names()):
        rows.append({"dataset": name, "prefix": it.sources[d].prefix, "samples": int(totals[0, d]),
                     "tokens": int(totals[1, d]), "passes": int(totals[2, d]),
                     "skipped": int(skipped[0, d]) if skipped is not None else 0,
                     "skipped_tokens": int(skipped[1, d]) if skipped is not None else 0})
    names = set(it.dataset_names())
    for name, kept in it.record.ledger.dormant.items():  # datasets an edit removed: as the edit left them
        if name in names:  # (the config read names it again: counted above, from the plan, as the run blended it)
            continue
        rows.append({"dataset": name, "prefix": "(removed by an edit)", "samples": int(kept["samples"]),
                     "tokens": int(kept["tokens"]), "passes": int(kept["passes"]),
                     "skipped": int(kept.get("skipped", 0)), "skipped_tokens": int(kept.get("skipped_tokens", 0))})
    sums = {k: sum(r[k] for r in rows) for k in ("samples", "tokens", "skipped", "skipped_tokens")}
    return {"kind": "lm", "name": it.name, "step": batches, "sample": int(it.consumed), "rows": rows,
            "totals": sums, "skips": [_event_row(i, e, *per_event[i]) for i, e in enumerate(it.skips.events)],
            "edits": it.record.edits.timeline()}


def _n(x: int) -> str:
    return f"{x:,}"


def format_report(report: dict, source: str = "") -> str:
    """The report as text: a table per corpus and shard (per dataset), the totals, then the skips."""
    lines = []
    at = (f"step {_n(report['step'])} (epoch {report['epoch']}, global batch {_n(report['batch'])} of it)"
          if report["kind"] == "translation" else f"step {_n(report['step'])} (global sample {_n(report['sample'])})")
    lines.append(f"what run {report['name']!r} trained on, up to {at}{', from ' + source if source else ''}")
    rows = report["rows"]
    if report["kind"] == "translation":
        w = {k: max([len(k)] + [len(str(r[k])) for r in rows]) for k in ("corpus", "task")}
        head = (f"{'corpus':<{w['corpus']}} {'task':<{w['task']}} {'shard':>5} {'samples':>11} {'src tokens':>12} "
                f"{'tgt tokens':>12} {'passes':>6} {'skipped':>9} {'skip tok':>10}")
        lines.append(head)
        for r in rows:
            lines.append(f"{r['corpus']:<{w['corpus']}} {r['task']:<{w['task']}} {r['shard']:>5} "
                         f"{_n(r['samples']):>11} {_n(r['src_tokens']):>12} {_n(r['tgt_tokens']):>12} "
                         f"{r['passes']:>6} {_n(r['skipped']):>9} {_n(r['skipped_tokens']):>10}")
        t = report["totals"]
        lines.append(f"{'total':<{w['corpus'] + w['task'] + 7}} {_n(t['samples']):>11} {_n(t['src_tokens']):>12} "
                     f"{_n(t['tgt_tokens']):>12} {'':>6} {_n(t['skipped']):>9} {_n(t['skipped_tokens']):>10}")
    else:
        width = max([len("dataset")] + [len(r["dataset"]) for r in rows])
        lines.append(f"{'dataset':<{width}} {'samples':>11} {'tokens':>14} {'passes':>6} {'skipped':>9} "
                     f"{'skip tok':>10}")
        for r in rows:
            lines.append(f"{r['dataset']:<{width}} {_n(r['samples']):>11} {_n(r['tokens']):>14} {r['passes']:>6} "
                         f"{_n(r['skipped']):>9} {_n(r['skipped_tokens']):>10}")
        t = report["totals"]
        lines.append(f"{'total':<{width}} {_n(t['samples']):>11} {_n(t['tokens']):>14} {'':>6} {_n(t['skipped']):>9} "
                     f"{_n(t['skipped_tokens']):>10}")
    edits = report.get("edits") or []
    if edits:  # the run's timeline: where its mixture changed
        lines.append(f"mixture edits ({len(edits)}), in the order made:")
        for e in edits:
            what = "; ".join(f"{k} {json.dumps(old)} -> {json.dumps(new)}" for k, (old, new) in
                             list(e["changes"].items())[:4]) or "(no config value: the weights)"
            more = f"; and {len(e['changes']) - 4} more" if len(e["changes"]) > 4 else ""
            lines.append(f"  {e['edit']}. from step {_n(e['from_step'])} (epoch {e['epoch']}, global batch "
                         f"{_n(e['batch'])}): {what}{more}")
    skips = report["skips"]
    if not skips:
        lines.append("no skips: every planned sample was served")
    else:
        lines.append(f"skips ({len(skips)}), in the order made:")
        for s in skips:
            where = f"epoch {s['epoch']}, global batch {_n(s['batch'])}" if "epoch" in s else \
                f"global sample {_n(s['sample'])}"
            lines.append(f"  {s['skip']}. after step {_n(s['after_step'])} ({where}): {s['what']}: "
                         f"{_n(s['samples'])} sample{'' if s['samples'] == 1 else 's'}, {_n(s['tokens'])} tokens "
                         f"dropped")
            if s["reason"]:
                lines.append(f"     why: {s['reason']}")
    return "\n".join(lines)


def ledger_figures(report: dict, out_dir: str) -> list[str]:
    """``ledger --plot``: ``ledger.png`` (served and skipped samples per corpus; dropped per skip) and
    ``ledger.json`` (the report) in ``out_dir``; the paths written."""
    return plots.save({"ledger.png": _ledger_figure(report)}, report, out_dir, "ledger.json")


def _ledger_figure(report: dict):
    name = "corpus" if report["kind"] == "translation" else "dataset"
    by: dict = {}
    for r in report["rows"]:
        got = by.setdefault(r[name], [0, 0])
        got[0] += r["samples"]
        got[1] += r["skipped"]
    items = sorted(by.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    top = items[:25]
    if len(items) > 25:
        rest = [sum(v[0] for _, v in items[25:]), sum(v[1] for _, v in items[25:])]
        top.append((f"+{len(items) - 25} others", rest))
    skips = report["skips"]
    fig = _figure(13.0, max(3.0, 0.28 * len(top) + 1.5, 0.45 * len(skips) + 1.5))
    axes = fig.subplots(1, 2, width_ratios=[3, 2]) if skips else [fig.subplots(1, 1)]
    ax = axes[0]
    y = np.arange(len(top))[::-1]
    served = np.array([v[0] for _, v in top], float)
    dropped = np.array([v[1] for _, v in top], float)
    ax.barh(y, served, color="#4c72b0", label="served")
    ax.barh(y, dropped, left=served, color="#c44e52", label="skipped")
    ax.set_yticks(y, [k for k, _ in top], fontsize=8)
    ax.set_xlabel("samples")
    ax.set_title(f"samples per {name} up to step {report['step']:,}", fontsize=9)
    ax.legend(loc="lower right", fontsize=7, frameon=False)
    if skips:
        ax2 = axes[1]
        ys = np.arange(len(skips))[::-1]
        values = [max(s["samples"], 0) for s in skips]
        bars = ax2.barh(ys, values, color="#c44e52")
        labels = ["\n".join(textwrap.wrap(f"{s['skip']}. after step {s['after_step']:,}: {s['what']}", 34)[:2])
                  for s in skips]
        ax2.set_yticks(ys, labels, fontsize=8)
        top = max(values) or 1
        ax2.set_xlim(0, top * 1.25)
        for bar, v in zip(bars, values):  # the number beside each bar: a small skip's bar is hard to see
            ax2.annotate(f"{v:,}", (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(3, 0),
                         textcoords="offset points", va="center", fontsize=8)
        ax2.set_xlabel("samples dropped")
        ax2.set_title("what each skip dropped (reasons: ledger.json)", fontsize=9)
    return fig
