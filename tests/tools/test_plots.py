"""``inspect --plot`` and ``plan --plot``: the pictures hold a drawing, stay legible from 5 to 1,000 directions
(bounded size, no text over another or off the figure, legends off the data, percentages within 100%), and the
numbers they draw are written beside them and printed by ``plan --json``."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from synthetic import config_for, make_data_bin, plan_dict, stats_rows

pytest.importorskip("matplotlib", reason="matplotlib (the plot extra) is part of the test extra: make test has it")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_PIXELS = 1950  # a side, whatever the count of directions
MAX_BYTES = 400_000  # a PNG


def _drawn(path) -> None:
    from matplotlib.image import imread

    assert 10_000 < os.path.getsize(path) < MAX_BYTES, (path, os.path.getsize(path))
    img = imread(path)
    assert 250 <= img.shape[0] <= MAX_PIXELS and 500 <= img.shape[1] <= MAX_PIXELS, (path, img.shape)
    rgb = img[..., :3].reshape(-1, 3)
    assert rgb.std() > 0.05, f"{path} is nearly one colour"
    # coloured marks (bars, boxes, points), not only black text and axes on white
    coloured = rgb.max(axis=1) - rgb.min(axis=1) > 0.2
    assert coloured.sum() > 200, f"{path}: {coloured.mean():.2%} of the pixels coloured"


def _cli(*argv, cwd=REPO):
    out = subprocess.run([sys.executable, "-m", "babelfeed.cli", *argv], capture_output=True, text=True, cwd=cwd,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _drawn_texts(fig, monkeypatch):
    """Every text the figure draws (tick labels, legend entries, titles, annotations), with its extent in
    pixels: recorded as it is drawn, so a tick label outside the view (never drawn) is not counted."""
    import matplotlib.text
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    drawn = []
    draw = matplotlib.text.Text.draw

    def recording(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)

    monkeypatch.setattr(matplotlib.text.Text, "draw", recording)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    monkeypatch.undo()
    renderer = canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in drawn], renderer


def _legibility_faults(fig, monkeypatch, tolerance=1.0) -> list:
    """Texts over one another, texts (partly) off the figure, and legends over an axes' data area."""
    texts, renderer = _drawn_texts(fig, monkeypatch)
    faults = []
    W, H = fig.bbox.width, fig.bbox.height
    boxes = np.array([[b.x0, b.y0, b.x1, b.y1] for _, b in texts]).reshape(-1, 4)
    for i, (text, b) in enumerate(texts):
        if b.x0 < -tolerance or b.y0 < -tolerance or b.x1 > W + tolerance or b.y1 > H + tolerance:
            faults.append(f"off the figure: {text!r}")
        dx = np.minimum(b.x1, boxes[i + 1:, 2]) - np.maximum(b.x0, boxes[i + 1:, 0])
        dy = np.minimum(b.y1, boxes[i + 1:, 3]) - np.maximum(b.y0, boxes[i + 1:, 1])
        for j in np.flatnonzero((dx > tolerance) & (dy > tolerance)):
            faults.append(f"overlap: {text!r} and {texts[i + 1 + j][0]!r}")
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for legend in legends:
        b = legend.get_window_extent(renderer)
        for ax in axes:
            a = ax.bbox
            if min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance:
                faults.append(f"a legend over the data of {ax.get_title()!r}")
    return faults


def _check_pictures(figures, tmp_path, monkeypatch):
    for name, fig in figures.items():
        faults = _legibility_faults(fig, monkeypatch)
        assert not faults, (name, faults[:10])
        fig.savefig(tmp_path / name)
        _drawn(tmp_path / name)


def test_the_legibility_check_sees_overlaps_texts_off_the_figure_and_legends_over_data(monkeypatch):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3), dpi=100)
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="a line")
    ax.legend(loc="center")
    assert _legibility_faults(fig, monkeypatch) == ["a legend over the data of ''"]
    ax.get_legend().remove()
    ax.text(0.5, 0.5, "one text")
    ax.text(0.52, 0.51, "another text")
    ax.text(1.4, 0.5, "past the right edge")
    faults = _legibility_faults(fig, monkeypatch)
    assert "overlap: 'one text' and 'another text'" in faults and "off the figure: 'past the right edge'" in faults
    fig = Figure(figsize=(4, 3), dpi=100)  # tick labels of 60 directions in 3 inches: they overlap
    fig.subplots().set_yticks(range(60), [f"d{i}" for i in range(60)])
    assert any(f.startswith("overlap: 'd") for f in _legibility_faults(fig, monkeypatch))


@pytest.mark.parametrize("directions", [5, 60, 1000])
def test_inspect_pictures_stay_legible(directions, tmp_path, monkeypatch):
    from babelfeed.tools import plots

    data = plots.inspect_data(stats_rows(directions))
    _check_pictures(plots.inspect_pictures(data), tmp_path, monkeypatch)
    json.dumps(data)
    assert len(data["directions"]) == directions
    named = data["sentences"]["largest"] + data["sentences"]["smallest"]
    others = data["sentences"]["others"]["directions"]
    assert len(named) + others == directions and len(set(named)) == len(named)
    assert (others == 0) == (directions <= 2 * plots.TOP + 1)


@pytest.mark.parametrize("directions", [5, 60, 1000])
def test_plan_pictures_stay_legible(directions, tmp_path, monkeypatch):
    from babelfeed.tools import plots

    data = plan_dict(directions)
    _check_pictures(plots.plan_pictures(data), tmp_path, monkeypatch)
    json.dumps(data)


def test_many_shapes_stay_legible(tmp_path, monkeypatch):
    """More shapes than one bar each can hold: the most used are drawn, the title says how many."""
    from babelfeed.tools import plots

    data = plan_dict(60, shapes=80)
    assert len(data["shapes"]) > plots.MAX_SHAPES
    fig = plots.plan_pictures(data)["shapes.png"]
    faults = _legibility_faults(fig, monkeypatch)
    assert not faults, faults[:10]
    assert any(f"most used of {len(data['shapes'])}" in ax.get_title() for ax in fig.axes)


def test_shapes_keep_the_two_measures_apart_and_name_the_boxes_past_the_axes():
    """The 1-D bucketings (one length per sample, no masked rows) and the 2-D lines (what a batch pays) on axes of
    their own, each headed by its measure, so no bar is read against one of the other measure; a shape whose box
    lies past the axes' cut is named on the histogram with its share of the batches, not left invisible."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from babelfeed.tools import plots

    data = plan_dict(60)
    fig = plots.plan_pictures(data)["shapes.png"]
    FigureCanvasAgg(fig).draw()
    by_measure = {}
    for ax in fig.axes:
        title = ax.get_title(loc="right")
        for m in ("1-D", "2-D"):
            if f"{m}: " in title:
                by_measure.setdefault(m, []).extend(t.get_text() for t in ax.get_yticklabels())
    one_d = [a["name"].removesuffix(", 1-D") for a in data["alternatives"] if a["measure"] == "1-D"]
    assert by_measure == {"1-D": one_d, "2-D": [a["name"] for a in data["alternatives"] if a["measure"] == "2-D"]}
    cs, ct = data["lengths"]["clip"]
    past = [s for s in data["shapes"] if s["source"] > cs or s["target"] > ct]
    assert past  # (the synthetic plan's widest shape, 11 x 346 x 347)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for s in past:
        assert any(f"{s['batch']} x {s['source']} x {s['target']}: {plots._pct(s['share_of_batches'])} of batches"
                   in t for t in texts), texts


def test_sentences_add_the_others_up_in_text_and_the_tier_swatches_are_the_fills_colours():
    """sentences.png: the others' sum is a row of text, not a bar on the directions' log axis (40 directions added
    up outgrow the largest one; 980 of them stretched the axis to 1M against 82k), and the tiers' legend swatches
    are the fills' colours, alpha included (they were saturated beside pastel fills)."""
    from babelfeed.tools import plots

    data = plots.inspect_data(stats_rows(60))
    ax, ax_rank = plots.inspect_pictures(data)["sentences.png"].axes[:2]
    largest = max(d["sentences"] for d in data["directions"])
    others = data["sentences"]["others"]
    assert others["splits"]["train"] > largest
    assert max(bar.get_width() for bar in ax.patches) == largest  # the axis fitted to single directions
    assert any(f"the {others['directions']} directions between, added up: {plots._num(others['splits']['train'])} "
               "train" in t.get_text() for t in ax.texts)
    fills = {tuple(np.round(c.get_facecolor()[0], 3)) for c in ax_rank.collections if len(c.get_facecolor())}
    swatches = [h for h in ax_rank.get_legend().legend_handles if type(h).__name__ == "Rectangle"]
    assert len(swatches) == 3 and all(tuple(np.round(h.get_facecolor(), 3)) in fills for h in swatches)


def test_tier_lengths_in_bins_of_a_few_tokens_the_noisiest_tier_first():
    """lengths.png above DETAIL directions: six 1-token step lines could not be told apart; the tiers' histograms
    in about LENGTH_BINS bins up to the cut, the low tier (fewest sentences, noisiest) drawn first, under."""
    from matplotlib.colors import to_rgba

    from babelfeed.tools import plots

    data = plots.inspect_data(stats_rows(60))
    lines = plots.inspect_pictures(data)["lengths.png"].axes[0].get_lines()
    assert len(lines) == 6 and all(len(line.get_xdata()) <= plots.LENGTH_BINS for line in lines)
    assert to_rgba(lines[0].get_color()) == to_rgba(plots.TIER_COLOURS[2])
    assert max(lines[0].get_xdata()) <= data["lengths"]["clip"]


def test_mixing_tier_markers_are_as_faint_as_the_points():
    from babelfeed.tools import plots

    ax = plots.plan_pictures(plan_dict(60))["mixing.png"].axes[0]
    points = [c for c in ax.collections if len({tuple(f) for f in c.get_facecolor()}) == 3]  # in the tiers' colours
    markers = [h for h in ax.get_legend().legend_handles if "directions of" in h.get_label()]
    assert len(points) == 1 and len(markers) == 3 and all(h.get_alpha() == points[0].get_alpha() for h in markers)


def test_inspect_data_tiers_and_the_length_axis():
    """Tiers hold a third of the directions each by size; the length axis stops where 4 in 5 directions hold
    99.5% of their train sentences (one long-tailed direction in 5 does not move it), and the share beyond is
    the share of all sentences longer."""
    from babelfeed.tools import plots

    rows = stats_rows(30, seed=3)
    data = plots.inspect_data(rows)
    sizes = {d["key"]: d["sentences"] for d in data["directions"]}
    tiers = {t: [k for k, d in zip(sizes, data["directions"]) if d["tier"] == t] for t in plots.TIERS}
    assert [len(tiers[t]) for t in plots.TIERS] == [10, 10, 10]
    assert min(sizes[k] for k in tiers["high"]) >= max(sizes[k] for k in tiers["mid"])
    assert min(sizes[k] for k in tiers["mid"]) >= max(sizes[k] for k in tiers["low"])
    assert sum(t["sentences"] for t in data["tiers"]) == sum(sizes.values())
    train = [r for r in rows if r["split"] == "train"]
    lengths = {}
    for r in train:
        lengths.setdefault(r["key"], []).append(np.repeat(np.arange(len(r["histogram"])), r["histogram"]))
    own = sorted(max(np.sort(x)[int(np.ceil(0.995 * len(x))) - 1] for x in sides) for sides in lengths.values())
    clip = data["lengths"]["clip"]
    assert clip == own[23]  # the 24th of 30 directions: 4 in 5 hold 99.5% of their sentences within the cut
    everything = np.concatenate([x for sides in lengths.values() for x in sides])
    assert data["lengths"]["longer"] == pytest.approx(np.mean(everything > clip))
    assert data["lengths"]["longest"] == everything.max()
    high = data["tiers"][0]["source"]
    assert sum(high["histogram"]) == sum(sizes[k] for k in tiers["high"])  # the source side of each direction


def test_length_cells_cut_at_the_weighted_percentile():
    from babelfeed.tools import plots

    rng = np.random.default_rng(0)
    lengths = np.stack([rng.integers(1, 100, 5000), rng.integers(1, 50, 5000)], axis=1)
    lengths[:10] = [900, 2]  # a few very long sources
    weights = np.where(np.arange(5000) < 10, 0.001, 1.0)  # drawn rarely: inside the top 0.5% by weight
    cells = plots.length_cells(lengths, weights, (1024, 1024))
    assert cells["clip"][0] < 100 and cells["longest"][0] == 900
    assert cells["longer"][0] < 0.005
    drawn = sum(c[2] for c in cells["cells"])
    inside = weights[(lengths[:, 0] <= cells["clip"][0]) & (lengths[:, 1] <= cells["clip"][1])].sum()
    assert drawn == pytest.approx(inside)


def test_inspect_plot_draws_lengths_and_sentence_counts(tmp_path):
    make_data_bin(tmp_path / "bin")
    out = _cli("inspect", str(tmp_path / "bin"), "--plot", str(tmp_path / "plots"))
    p = tmp_path / "plots"
    assert f"wrote {p / 'lengths.png'}, {p / 'sentences.png'}, {p / 'inspect.json'}" in out
    for name in ("lengths.png", "sentences.png"):
        _drawn(p / name)
    data = json.loads((p / "inspect.json").read_text())
    by_key = {d["key"]: d for d in data["directions"]}
    assert by_key["aaa-bbb"]["splits"] == {"train": 1100, "valid": 60}
    assert [s["lang"] for s in by_key["aaa-bbb"]["sides"]] == ["aaa", "bbb"]
    assert sum(by_key["aaa-bbb"]["sides"][1]["histogram"]) == 1100
    assert "histogram" not in _cli("inspect", str(tmp_path / "bin"), "--json", "--plot", str(tmp_path / "p2"))


@pytest.mark.parametrize("config", ["nllb_like", "configs/demo.py"])
def test_plan_plot_draws_the_shapes_and_the_mixture(tmp_path, config):
    make_data_bin(tmp_path / "bin")
    key = "train.data.path" if "demo" in config else "data.path"
    out = _cli("plan", config, f"--config.{key}={tmp_path / 'bin'}", "--shapes", "4", "--plot", str(tmp_path / "p"),
               "--json")
    for name in ("shapes.png", "mixing.png"):
        _drawn(tmp_path / "p" / name)
    printed = json.loads(out)
    assert printed == json.loads((tmp_path / "p" / "plan.json").read_text())
    assert len(printed["shapes"]) == 4
    assert [d["key"] for d in printed["mixing"]["directions"]] == ["aaa-bbb", "aaa-ccc", "aaa-ddd"]
    assert type(printed["lengths"]["samples"]) is int  # a count (epoch 1's expected draws), not 93771.0
    assert "size_label" not in printed["mixing"]  # the picture's axis label is not data
    assert printed["mixing"]["size_is"] == "epoch 1's shard"  # both configs read a shard an epoch
    measures = [(a["measure"], a["name"].endswith(", 1-D")) for a in printed["alternatives"]]
    assert measures == [("1-D", True)] * 4 + [("2-D", False)] * 4  # the bucketings of one length, then both sides


def test_padding_efficiency_is_real_over_padded_tokens_never_past_100_percent(tmp_path):
    """Each shape's efficiency is its batches' real tokens over their rows times its widths: a sample never
    outgrows its shape, so it stays within 100% (the picture's axis stops there), and the shapes' batches add
    up to the epoch's. Long samples (every 7th of 200 tokens) make shapes of few rows and much padding."""
    from babelfeed.tools.plan_report import plan_data

    make_data_bin(tmp_path / "bin", long_every=7)
    for window in (0, 50):
        data = plan_data(config_for(tmp_path / "bin", batching__window=window, filter__max_source_positions=256,
                                    filter__max_target_positions=256), 6)
        shapes = data["shapes"]
        for s in shapes:
            assert s["real_tokens"] <= s["padded_tokens"] == s["batches"] * s["batch"] * (s["source"] + s["target"])
            assert 0 <= s["efficiency"] <= 1
        static = data["epoch1"]["static"]
        assert sum(s["batches"] for s in shapes) == static["batches"]
        assert sum(s["real_tokens"] for s in shapes) / sum(s["padded_tokens"] for s in shapes) == \
            pytest.approx(static["efficiency"])
        assert all(0 < a["efficiency"] <= 1 for a in data["alternatives"])


BLOCK_MATPLOTLIB = ("import sys; sys.modules.update(dict.fromkeys(['matplotlib', 'matplotlib.colors', "
                    "'matplotlib.figure', 'matplotlib.lines', 'matplotlib.patches', 'matplotlib.ticker'])); ")


@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_without_matplotlib_the_plot_flag_says_what_to_install(tmp_path, command):
    """Before any reading or planning: one line with the pip command and exit 2, not an internal error (plan's
    drawing imported matplotlib.colors before the check) and not a report printed for nothing."""
    make_data_bin(tmp_path / "bin")
    argv = ([command, str(tmp_path / "bin")] if command == "inspect" else
            [command, "--set", f"data.path={tmp_path / 'bin'}", "--shapes", "2"]) + ["--plot", str(tmp_path / "p")]
    code = BLOCK_MATPLOTLIB + f"from babelfeed.cli import main; sys.exit(main({argv!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 2, out.stderr
    assert "--plot needs matplotlib: pip install 'babelfeed[plot]'" in out.stderr
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "p").exists()


def test_without_matplotlib_plan_json_needs_none(tmp_path):
    make_data_bin(tmp_path / "bin")
    code = BLOCK_MATPLOTLIB + ("from babelfeed.cli import main; "
                               f"sys.exit(main(['plan', '--set', 'data.path={tmp_path / 'bin'}', '--shapes', '2', "
                               "'--json']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr  # the numbers need numpy only
    assert len(json.loads(out.stdout)["shapes"]) == 2
