"""The ``babelfeed`` command: ``binarize``, ``inspect``, ``plan``, ``preview``, ``trace``, ``demo``.

Every error is one line on stderr (``babelfeed COMMAND: error: ...``) and a non-zero exit status: 2 for what the
user can fix (arguments, config values, input files), 1 for an internal error. ``--debug`` (or
``BABELFEED_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations


HELP = """babelfeed: prepare, inspect and plan the data of multilingual and language-model training.

  babelfeed binarize RAW -o data_bin --train-spm 8000   raw text -> SentencePiece -> sharded .idx/.bin
  babelfeed inspect data_bin                           sentences, tokens and lengths per direction
  babelfeed plan nllb_like --set data.path=data_bin    the static batch shapes a config gets
  babelfeed preview --config CONFIG --task TASK        samples before and after a task's noise
  babelfeed trace CONFIG --state STATE --step N        the samples of a training step, and their files
  babelfeed replay CONFIG --state STATE --step N --out B.npz   the exact batch a rank received at a step
  babelfeed ledger CONFIG --state STATE                what a run trained on, its skips and mixture edits
  babelfeed edit EDITED_CONFIG --state STATE --out NEW what an edited config changes from the next step
  babelfeed demo                                       the whole pipeline on an embedded corpus

Configs are files or the names of shipped ones (demo, nllb_like, lm_packing, tpu_static). An error is one
line on stderr and exit status 2 for what you can fix (arguments, config values, input files), 1 for an
internal error; --debug (or BABELFEED_DEBUG=1) shows the traceback instead.
"""

import argparse
import faulthandler
import io
import json
import os
import re
import sys
import warnings

import numpy as np

from babelfeed.build import build_lm_iterator, build_train_iterator
from babelfeed.checks import MAX_WORLD_SIZE
from babelfeed.config.files import apply_overrides, load_config, split_config_args, translation_section
from babelfeed.config.spec import parse
from babelfeed.errors import (BabelfeedError, FormatError, Notice, StateError, Terminated,
                              UsageError, terminate_as_interrupt)
from babelfeed.fileio import atomic_open, atomic_write
from babelfeed.iterators.ledger import trace
from babelfeed.iterators.protocol import EDIT_HINT
from babelfeed.iterators.state import find_state, resolve
from babelfeed.preprocess.binarize import BinarizeOptions, binarize, format_report
from babelfeed.run.edits import config_changes
from babelfeed.run.history import ran_on, split_of, upgrade
from babelfeed.sources.corpus import ShardedCorpus
from babelfeed.storage.remote.client import remote_names
from babelfeed.storage.remote.objects import is_remote
from babelfeed.tools import ledger_report, plan_report
from babelfeed.tools.demo import check_demo_config, run_demo
from babelfeed.tools.plots import inspect_figures, require_matplotlib
from babelfeed.tools.preview import _decoder, preview
from babelfeed.tools.stats import corpus_stats, document_stats, format_document_stats, format_stats


def is_user_error(e: BaseException) -> bool:
    """Whether ``e`` says what the user can fix, rather than a bug to report, by its type alone: babelfeed's own
    errors (:class:`~babelfeed.errors.BabelfeedError`: a config, data, a state, an argument, a store, a missing
    extra) and ``OSError`` (a file missing or unreadable, named by its path) are the user's. Any other error, a
    ``ValueError`` or ``KeyError`` included, is a bug of babelfeed's."""
    return isinstance(e, (BabelfeedError, OSError))


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line, like every other error of the command."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def count(low: int, high: int | None = None):
    """An argparse type: an integer >= ``low`` (and <= ``high``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            within = f"in [{low}, {high:,}]" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be an integer {within}, got {text!r}")
        return value

    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


DEFAULT_CONFIGS = {"plan": "nllb_like", "demo": "demo", "inspect": "nllb_like"}


def _config_of(args) -> str:
    """The config a command was given: the first argument or --config FILE, the same thing either way. Both at
    once is an error (one of them would be ignored); neither is the command's default, where it has one."""
    given = [c for c in (args.config, args.config_file) if c is not None]
    if len(given) == 2:
        raise UsageError(f"two configs given: {args.config!r} (the first argument) and --config "
                         f"{args.config_file!r}; give one")
    if given:
        return given[0]
    if args.command in DEFAULT_CONFIGS:
        return DEFAULT_CONFIGS[args.command]
    example = {"trace": "trace my_config.py --state state.json --step 10",
               "preview": "preview nllb_like --set data.path=data_bin --task eng_Latn-deu_Latn"}.get(args.command, "")
    raise UsageError(f"name the config: a file or a shipped config's name (nllb_like, tpu_static, lm_packing, "
                     f"demo){', e.g. babelfeed ' + example if example else ''}")


def _load(path, overrides):
    """A config file with its overrides applied (read once; then taken as an LM or a translation config)."""
    return apply_overrides(load_config(path), overrides)


def _translation_config(path, overrides, loaded=None):
    """The translation pipeline of a config file (its ``train`` section for configs/demo.py), checked.
    ``loaded``: the file as :func:`_load` read it already."""
    config, where = translation_section(_load(path, overrides) if loaded is None else loaded, os.fspath(path))
    parse(config, "translation", where)

    if not is_remote(config.data.path) and not os.path.isdir(config.data.path):
        key = f"{where}.data.path" if where else "data.path"
        raise FileNotFoundError(2, f"data_bin directory not found (the config's {key}; --config.{key}=DIR sets it)",
                                config.data.path)
    return config


def _lm_config(config):
    """``config`` when it is a language-model config (configs/lm_packing.py: data_path, seq_len, ...), its keys
    checked; None for a translation config."""
    if "data_path" not in config:
        return None
    parse(config, "lm")
    return config


def _read_state(path) -> dict:
    """A state file, or a checkpoint folder holding one: the Hugging Face Trainer's checkpoint-N/ (its
    babelfeed_state.json) or an orbax step folder (its data item)."""
    if os.path.isdir(path):
        inside = [os.path.join(path, *p) for p in (("babelfeed_state.json",), ("data", "metadata"), ("metadata",))]
        found = next((p for p in inside if os.path.isfile(p)), None)
        if found is None:
            raise FileNotFoundError(2, "a folder holding no babelfeed state (babelfeed_state.json of a Hugging Face "
                                       "checkpoint, or an orbax step's data/metadata): name the state file", path)
        path = found
    with open(path, "rb") as f:
        data = f.read()  # read once: a pipe (--state <(cat s.json), /dev/stdin) cannot be read again
    if data[:2] == b"PK" or data[:1] == b"\x80":  # torch.save's zip file, or a pickle: a torch checkpoint
        return _torch_checkpoint(path, data)
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise StateError(f"{path}: not a JSON iterator state ({e}); a checkpoint of torch.save is read too") from None


def _torch_checkpoint(path: str, data: bytes) -> dict:
    """A ``torch.save`` checkpoint holding a babelfeed state (``{"data": loader.state_dict(), "model": ...}``), read
    with ``weights_only=True``: tensors and plain containers, no code of the file run."""
    try:
        import torch  # optional: babelfeed[torch]
    except ImportError:
        raise StateError(f"{path}: a torch.save checkpoint; reading it needs torch (pip install 'babelfeed[torch]'), "
                         f"or save the state as JSON: json.dump(loader.state_dict(), f)") from None
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # a pickle of other objects, or a file cut short
        raise StateError(f"{path}: not a torch checkpoint torch.load reads with weights_only=True "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def _lm_trace(args, config) -> int:
    it = build_lm_iterator(config, world_size=args.world_size or 1)
    rows = it.trace(args.step, _read_state(args.state) if args.state else None)
    if args.json:
        print(json.dumps(rows))
        return 0
    gone = sum(r["skipped"] for r in rows)
    print(f"step {args.step}: global batch {args.step - 1}, {len(rows)} samples of {it.seq_len + 1} tokens "
          f"(seq_len {it.seq_len}, + 1 for the shifted labels; world size {it.world_size}, mode {it.mode})"
          + (f"; {gone} of them skipped, never served" if gone else ""))
    width = max([len("dataset")] + [len(r["dataset"]) for r in rows])
    print(f"{'rank':>4} {'row':>4} {'dataset':<{width}} {'epoch':>5} {'sample':>8} {'tokens':>6}  "
          + ("skipped  " if gone else "") + "documents")
    for r in rows:
        docs = r["documents"]
        shown = ", ".join(map(str, docs[:6])) + (f" ... ({len(docs)})" if len(docs) > 6 else "")
        mark = ("yes      " if r["skipped"] else "-        ") if gone else ""
        print(f"{r['rank']:>4} {r['row']:>4} {r['dataset']:<{width}} {r['epoch']:>5} {r['index']:>8} "
              f"{r['tokens']:>6}  {mark}{shown}")
    return 0


def _lm_plan(config) -> str:
    """What an LM config's run draws: per blended dataset, its weight, samples, tokens and passes over its split."""
    it = build_lm_iterator(config)
    totals = it.ledger_totals(len(it)) if len(it) * it.global_batch <= 4_000_000 else None
    counts = np.bincount(it.dataset_index.astype(np.int64), minlength=len(it.sources))
    names = it.dataset_names()
    width = max([len("dataset")] + [len(n) for n in names])
    lines = [f"LM run: {len(it):,} global batches of {it.global_batch} samples x {it.seq_len + 1} tokens "
             f"(seq_len + 1; {it.num_samples:,} samples), mode {it.mode}, split {it.sources[0].split} "
             f"({it.sources[0].split_name})",
             f"{'dataset':<{width}} {'weight':>7} {'samples':>11} {'share':>7} {'passes':>7} {'epochs':>8} "
             f"{'real tokens':>13}"]
    passes = it.passes(counts)
    # epochs of its tokens the run serves (samples x seq_len over the split's tokens; passes counts whole ones)
    epochs = np.array([counts[d] * it.seq_len / max(src.epoch_tokens(), 1) for d, src in enumerate(it.sources)])
    for d, name in enumerate(names):
        real = f"{int(totals[1, d]):,}" if totals is not None else "-"
        lines.append(f"{name:<{width}} {it.weights[d] / sum(it.weights):>7.3f} {int(counts[d]):>11,} "
                     f"{counts[d] / max(counts.sum(), 1):>7.1%} {passes[d]:>7} {epochs[d]:>7.2f}x {real:>13}")
    if totals is not None:
        slots = int(counts.sum()) * it.seq_len
        lines.append(f"real tokens fill {totals[1].sum() / max(slots, 1):.1%} of the input positions")
    else:
        lines.append("real tokens: not counted past 4M samples (babelfeed.LMIterator.ledger_totals counts them)")
    threshold = float(config.get("warn_upsample", 10.0))
    over = [d for d in np.argsort(-epochs, kind="stable").tolist() if threshold > 0 and epochs[d] > threshold]
    if over:
        named = ", ".join(f"{names[d]} {epochs[d]:.1f}x" for d in over[:8])
        lines.append(f"warning: the run serves {len(over)} of {len(names)} datasets more than {threshold:g} times "
                     f"their tokens: {named}. To serve them less: a lower weight in data_path, max_upsample=N (each "
                     f"at most N epochs, the excess to the others) or blend='unimax' with it (warn_upsample sets this "
                     f"threshold; 0: off)")
    return "\n".join(lines)


def _binarize(args) -> int:
    opts = BinarizeOptions(
        input_dir=args.input_dir, output_dir=args.output, spm_model=args.spm, train_spm=args.train_spm,
        dict_path=args.dict, shards=args.shards, workers=args.workers, format=args.format, max_len=args.max_len,
        empty=args.on_empty, overlong=args.on_overlong, bad_utf8=args.on_bad_utf8, spm_sample=args.spm_sample,
        seed=args.seed, overwrite=args.overwrite, progress=False if args.no_progress else None,
        chunk_lines=args.chunk_lines, inputs=tuple(args.input or ()), engine=args.engine,
        ray_address=args.ray_address, documents=args.documents,
        json_keys=tuple(k for spec in (args.json_keys or ["text"]) for k in re.split(r"[,\s]+", spec) if k),
        split_sentences=args.split_sentences, append_eod=not args.no_append_eod, bad_record=args.on_bad_record,
        max_dropped=args.max_dropped, spm_character_coverage=args.character_coverage,
        source_lang=args.source_lang, target_lang=args.target_lang, trainpref=args.trainpref,
        validpref=args.validpref, testpref=args.testpref, command=("babelfeed", *getattr(args, "argv", ())),
    )
    report = binarize(opts, log=lambda m: print(m, file=sys.stderr))
    print(format_report(report))
    return 0


def _inspect(args) -> int:
    if args.plot:  # before the data_bin is read: a missing extra says so at once
        require_matplotlib()

    try:
        with warnings.catch_warnings():  # (a documents folder's names are not a data_bin's: no warning for that)
            warnings.simplefilter("ignore")
            ShardedCorpus(args.data_bin)
    except FormatError as e:  # no translation files: a binarize --documents output (Megatron prefixes)?
        if "no .idx files found" not in str(e):
            raise

        if args.plot:
            raise UsageError(f"{args.data_bin}: --plot draws a data_bin's directions; this folder holds documents "
                             f"(its table and --json say what they hold)") from None
        rows = document_stats(args.data_bin)
        print(json.dumps(rows, indent=2) if args.json else format_document_stats(rows))
        return 0
    rows = corpus_stats(args.data_bin, check_tokens=args.verify, histograms=bool(args.plot))
    files = []
    if args.plot:
        files = inspect_figures(rows, args.plot)
        for row in rows:
            del row["histogram"]
    if args.json and any(r["split"] == "train" for r in rows):
        _upsampling_fields(args, rows)
    print(json.dumps(rows, indent=2) if args.json else format_stats(rows))
    if files and not args.json:
        print("wrote " + ", ".join(files))
    if not args.json and any(r["split"] == "train" for r in rows):
        print("\n" + "\n".join(_inspect_mixture(args)))
    return 0


def _mixture_config(args):
    config, _ = translation_section(_load(_config_of(args), (args.set or []) + args.overrides))
    with config.unlocked():
        config.data.path = args.data_bin
    return config


def _upsampling_fields(args, rows: list) -> None:
    """--json: each train row gets ``epoch1_upsampling`` (the epochs of its direction's data that epoch 1 of
    ``--config``'s mixture serves), and the warning goes to stderr; a mixture the data cannot give leaves the
    rows as they are and says why on stderr."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, notice = plan_report.upsampling(_mixture_config(args))
    except (BabelfeedError, OSError) as e:
        print(f"epoch 1's up-sampling: not given ({e})", file=sys.stderr)
        return
    for row in rows:
        if row["split"] == "train" and row["key"] in got:
            row["epoch1_upsampling"] = round(got[row["key"]][1], 4)
    if notice:
        print(f"warning: {notice}", file=sys.stderr)


def _inspect_mixture(args) -> list[str]:
    """The up-sampling of the data_bin's train directions under ``--config`` (default: nllb_like's mixture); a
    mixture the data cannot give is said in a line, not raised: inspect describes the data."""
    try:
        config = _mixture_config(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return plan_report.upsampling_lines(config)
    except (BabelfeedError, OSError) as e:  # (a data_bin without dict.txt, a mixture this data cannot give)
        return [f"epoch 1's up-sampling: not shown ({e})"]


def _plan(args) -> int:
    if args.plot:  # before the planning (minutes for many directions): a missing extra says so at once
        require_matplotlib()

    path, overrides = _config_of(args), (args.set or []) + args.overrides
    loaded = _load(path, overrides)
    lm = _lm_config(loaded)
    if lm is not None:
        if args.plot or args.json:
            raise UsageError("--plot and --json give a translation plan's shapes and mixture; an LM run's plan is "
                             "printed")
        print(_lm_plan(lm))
        return 0
    config = _translation_config(path, overrides, loaded)
    print(plan_report.plan_report(config, args.shapes, plot_dir=args.plot, as_json=args.json))
    return 0


def _preview(args) -> int:
    config = _translation_config(_config_of(args), (args.set or []) + args.overrides)
    print(preview(config, args.task, args.transforms, n=args.n, epoch=args.epoch, side=args.side))
    return 0


def _translation_run(args, config, step: int | None):
    """An iterator of a translation run (on the world size that took ``step``, as ``--state`` records it, or
    ``--world-size``) and the run's state from ``--state`` (any adapter's checkpoint; None without one)."""
    state = None
    if args.state:
        state = _read_state(args.state)

        # any adapter's checkpoint: the iterator's state, a loader's, a StatefulDataLoader's, {"data": state}
        state = find_state(state, f"--state {args.state}")

    world_size = args.world_size
    took = ran_on(state, step) if state is not None else None  # the world size that took the step, as recorded
    if world_size is None:
        if took is None and isinstance(state, dict) and "version" not in state:
            raise UsageError(f"--state {args.state} is a loader position that does not say which world size ran it "
                             f"(an older babelfeed's): pass --world-size, the number of ranks of the run")
        world_size = took or 1
    elif took is not None and took != world_size and step is not None:
        raise UsageError(f"--world-size {world_size}: the state records that step {step} was taken on {took} rank(s); "
                         f"leave --world-size out (it is read from the state)")
    args.world_size = world_size
    split = getattr(args, "split", None)
    recorded = split_of(state, step) if state is not None and step is not None else None
    if split is not None and recorded is not None and split != recorded:
        raise UsageError(f"--split {split}: the state records that step {step} was taken with split {recorded!r}; "
                         f"leave --split out (it is read from the state)")
    args.split = split or recorded or "batches"
    it = build_train_iterator(config, world_size=world_size, split=args.split)
    if state is not None:
        state = resolve(state, it, f"--state {args.state}")  # a bare loader position: counted on this world size
        _note_recorded_config(args, it, state)
    return it, state


def _note_recorded_config(args, it, state: dict) -> None:
    """Say so when a stream-sampler run's state, which carries the config the run streamed with (and the
    commands follow), differs from the config given (``--set`` included): that config's values are not used."""
    recorded, given = state.get("config"), getattr(it, "config_snapshot", None)
    edited = any(isinstance(e, dict) and e.get("event") == "edit" for e in state.get("history") or [])
    if not (isinstance(recorded, dict) and isinstance(given, dict)) or not (edited or it.planner.sampler.streams):
        return  # (the commands check a state of an unedited run against the config given)

    changes = {k: v for k, v in config_changes(recorded, given).items() if k != "data.path"}
    if changes:
        shown = "; ".join(f"{k} {json.dumps(new)} (the run's: {json.dumps(old)})"
                          for k, (old, new) in list(changes.items())[:4])
        more = f"; and {len(changes) - 4} more" if len(changes) > 4 else ""
        what = "an edited run" if edited else "a mixing.sampler='stream' run"
        print(f"note: --state {args.state} is a state of {what}, which carries the config it ran with, and "
              f"babelfeed {args.command} follows it; not used from this config: {shown}{more}", file=sys.stderr)


def _flat_leaves(batch: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in batch.items():
        if isinstance(v, dict):
            out.update(_flat_leaves(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def _say_if_past(step: int, last: int) -> None:
    """Warn that ``step`` lies after the state's ``last`` step: replay gives the batch the run would serve there."""
    if step > last:
        print(f"warning: step {step} lies after the state's last step, {last}: this is the batch the run would serve "
              f"there, unless a later skip or edit changes it", file=sys.stderr)


def _replay(args) -> int:
    path, overrides = _config_of(args), (args.set or []) + args.overrides
    loaded = _load(path, overrides)
    lm = _lm_config(loaded)
    if lm is not None:
        it = build_lm_iterator(lm, world_size=args.world_size or 1)
        state = _read_state(args.state)
        consumed = state.get("consumed_samples", 0) if isinstance(state, dict) else 0
        if type(consumed) is int:  # (a malformed state is refused by batch_for_step, naming the field)
            _say_if_past(args.step, consumed // it.global_batch)
        batch = it.batch_for_step(args.step, state, rank=args.rank or 0)
        where = f"global batch {args.step - 1}, rank {args.rank or 0} of {it.world_size}"
    else:
        config = _translation_config(path, overrides, loaded)
        it, state = _translation_run(args, config, args.step)
        rank = args.rank if args.rank is not None else 0
        _say_if_past(args.step, int(state.get("total_steps", 0)))
        batch = it.batch_for_step(args.step, state, rank=rank)

        where = f"rank {rank} of {ran_on(state, args.step) or it.world_size} (split {args.split})"
    leaves = _flat_leaves(batch)

    with atomic_open(args.out) as f:
        np.savez(f, **leaves)
    print(f"step {args.step}: {where} -> {args.out}")
    weight = leaves.get("weight", leaves.get("loss_mask"))
    for k, v in leaves.items():
        print(f"  {k:<28} {str(v.dtype):<8} {'x'.join(map(str, v.shape)) or 'scalar'}")
    if "nsentences" in leaves:
        print(f"  {int(leaves['nsentences'])} samples, {int(leaves['ntokens'])} target tokens"
              + (" (every row skipped: an empty batch)" if weight is not None and not weight.any() else ""))
    return 0


def _ledger(args) -> int:
    if args.plot:  # before the recount: a missing extra says so at once
        require_matplotlib()
    path, overrides = _config_of(args), (args.set or []) + args.overrides
    loaded = _load(path, overrides)
    lm = _lm_config(loaded)
    if lm is not None:
        report = ledger_report.lm_ledger(build_lm_iterator(lm), _read_state(args.state))
    else:
        config = _translation_config(path, overrides, loaded)
        it, state = _translation_run(args, config, None)
        report = ledger_report.translation_ledger(it, state)
    if args.plot:
        files = ledger_report.ledger_figures(report, args.plot)
    if args.json:
        print(json.dumps(report))
    else:
        print(ledger_report.format_report(report, args.state))
    if args.plot:
        print("wrote " + ", ".join(files), file=sys.stderr if args.json else sys.stdout)
    return 0


def _edit(args) -> int:
    """``babelfeed edit``: the edited config applied to a saved state, said as a table, and the edited run's state."""
    path, overrides = _config_of(args), (args.set or []) + args.overrides
    loaded = _load(path, overrides)
    state = upgrade(find_state(_read_state(args.state), f"--state {args.state}"))
    lm = _lm_config(loaded)
    world = args.world_size or ran_on(state) or 1
    if lm is not None:
        it = build_lm_iterator(lm, world_size=world)
    else:
        it = build_train_iterator(_translation_config(path, overrides, loaded), world_size=world,
                                  split=split_of(state) or "batches")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)  # (said below, once)
        it.set_state(state, mixture_change="allow")
    report = it.last_edit
    if report is None:
        raise UsageError(f"{path} plans what --state {args.state} was saved with: nothing to edit (give the edited "
                         f"config)")
    if args.out:
        atomic_write(args.out, json.dumps(it.get_state()).encode())
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(report.table(limit=args.limit))
        if args.out:
            print(f"wrote {args.out}: the edited run's state (resume it with this config, no mixture_change)")
    return 0


def _trace(args) -> int:
    path, overrides = _config_of(args), (args.set or []) + args.overrides
    loaded = _load(path, overrides)
    lm = _lm_config(loaded)
    if lm is not None:
        return _lm_trace(args, lm)
    config = _translation_config(path, overrides, loaded)
    it, state = _translation_run(args, config, args.step)
    rows = trace(it, args.step, state)
    if args.json:
        if args.decode:
            text = _decoder(config.data.path, it.planner.sources.dictionary)
            comps = {(c.key, c.shard): c for c in it.planner.sources.components}
            for r in rows:
                c = comps.get((r["stream"], r["shard"]))
                if c is not None:
                    r["source"] = text(np.asarray(c.src[r["row"]]).tolist())
                    if c.tgt is not None and c.tgt is not c.src:
                        r["target"] = text(np.asarray(c.tgt[r["row"]]).tolist())
        print(json.dumps(rows))
        return 0
    text = None
    if args.decode:
        text = _decoder(config.data.path, it.planner.sources.dictionary)
    comps = {(c.key, c.shard): c for c in it.planner.sources.components}

    took = (ran_on(state, args.step) if state is not None else None) or args.world_size  # the run's, where recorded
    gone = sum(r["skipped"] for r in rows)
    print(f"step {args.step}: epoch {rows[0]['epoch'] if rows else '-'}, {len(rows)} samples "
          f"(world size {took}, split {args.split})" + (f"; {gone} of them skipped, never served" if gone else ""))
    width = {k: max([len(k)] + [len(str(r[k])) for r in rows]) for k in ("stream", "task", "corpus", "id")}
    skipped = any(r["skipped"] for r in rows)  # (a column only where a skip dropped some of them)
    print(f"{'rank':>4} {'batch':>6} {'id':>{width['id']}} {'stream':<{width['stream']}} {'task':<{width['task']}} "
          f"{'corpus':<{width['corpus']}} {'shard':>5} {'row':>9} {'src':>4} {'tgt':>4}" + ("  skipped" if skipped else ""))
    for r in rows:  # (the id: what it.skip(ids=...) takes)
        rank = "-" if r["rank"] is None else r["rank"]
        print(f"{rank:>4} {r['batch']:>6} {r['id']:>{width['id']}} {r['stream']:<{width['stream']}} "
              f"{r['task']:<{width['task']}} {r['corpus']:<{width['corpus']}} {r['shard']:>5} {r['row']:>9} "
              f"{r['src_len']:>4} {r['tgt_len']:>4}" + (("  yes" if r["skipped"] else "  -") if skipped else ""))
        c = comps.get((r["stream"], r["shard"])) if text is not None else None
        if c is not None:  # (a stream an edit removed since is not in this config's data: not decoded)
            print(f"       source: {text(np.asarray(c.src[r['row']]).tolist())}")
            if c.tgt is not None and c.tgt is not c.src:
                print(f"       target: {text(np.asarray(c.tgt[r['row']]).tolist())}")
    return 0


def _demo(args) -> int:
    config = load_config(_config_of(args))
    check_demo_config(config)
    config = apply_overrides(config, args.overrides)
    parse(config.train, "translation", "train")
    return run_demo(config, workdir=args.workdir, scale=args.scale, workers=args.workers,
                    train_steps=args.train_steps, trainer=args.trainer)


def _with_parents(add_parser, parents):
    def add(name, **kwargs):
        return add_parser(name, parents=parents, **kwargs)

    return add


def _config_arguments(parser, what: str) -> None:
    """The config of a command, taken alike by every command that reads one: ``CMD CONFIG`` or ``CMD --config
    CONFIG`` (``--config=CONFIG``), with ``--config.KEY=VALUE`` or ``--config.KEY VALUE`` overrides."""
    parser.add_argument("config", nargs="?", default=None, help=what)
    parser.add_argument("--config", dest="config_file", default=None, metavar="CONFIG",
                        help="the same, as a flag (give one or the other); --config.KEY=VALUE or --config.KEY VALUE "
                             "overrides a value")


def _set_argument(parser) -> None:
    """``--set KEY=VALUE``, taken alike by every command that reads a config."""
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (same as "
                        "--config.KEY=VALUE), e.g. data.path=data_bin")


def _split_argument(parser) -> None:
    """``--split``, taken alike by trace and replay: how the run's ranks split their batches."""
    parser.add_argument("--split", choices=("batches", "rows"), default=None,
                        help="batches: a whole batch per rank (torch DDP); rows: every rank its rows of one global "
                             "batch (JAX); default: as --state records it, else batches")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="babelfeed", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="show the traceback of an error (also BABELFEED_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)
    # --debug is taken after the command too; SUPPRESS keeps a subcommand from resetting the flag given before it
    debug = Parser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub.add_parser = _with_parents(sub.add_parser, [debug])

    b = sub.add_parser("binarize", help="raw text -> SentencePiece -> a sharded data_bin of .idx/.bin",
                       description="Encode raw text with SentencePiece (trained here with --train-spm, or given "
                                   "with --spm) into a data_bin: dict.txt, spm.model, shard*/ of .idx/.bin files and "
                                   "binarize_report.json. Inputs may be compressed (.gz .zst .xz .bz2) and many files "
                                   "per direction (a folder, or --input KEY=GLOB). With --documents, JSONL or "
                                   "plain-text documents become Megatron-LM data (a document index, end-of-document "
                                   "tokens). Parallel on this machine or on Ray (--engine ray) with the same bytes, "
                                   "and resumable: a killed run keeps its finished shards and a re-run redoes only "
                                   "the rest.")
    b.add_argument("input_dir", nargs="?",
                   help="folder of {src}-{tgt}.{lang}, {split}.{src}-{tgt}.{lang} and {split}.{lang} files (or "
                        "folders of that name holding many files); with --source-lang/--target-lang, fairseq's "
                        "{split}.SRC and {split}.TGT; with --documents, NAME.jsonl, NAME.json and NAME.txt files "
                        "or NAME/ folders of them")
    b.add_argument("-o", "--output", required=True, help="data_bin folder to write")
    b.add_argument("--input", action="append", metavar="KEY=GLOB",
                   help="an input given by a glob, repeatable: [split.]src-tgt=GLOB with {lang} where each side's "
                        "language goes (train.en-de=/data/en-de/*.{lang}.gz), split.lang=GLOB, or with --documents "
                        "NAME=GLOB (web=/data/web/*.jsonl.zst)")
    g = b.add_mutually_exclusive_group(required=True)
    g.add_argument("--spm", help="an existing SentencePiece model")
    g.add_argument("--train-spm", type=count(1), metavar="VOCAB", help="train a SentencePiece model of this vocabulary size")
    b.add_argument("--dict", help="an existing fairseq dict.txt to map pieces through (default: SentencePiece order)")
    b.add_argument("--shards", type=count(1), default=1, help="shards per train direction or corpus (default 1)")
    b.add_argument("--workers", type=count(0), default=0,
                   help="worker processes (default: every core); with --engine ray and no --ray-address, the CPUs "
                        "of the local Ray instance")
    b.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where the work runs: worker processes here (default) or Ray tasks (pip install "
                        "'babelfeed[ray]'); the output is the same bytes")
    b.add_argument("--ray-address", metavar="ADDR",
                   help="the Ray cluster to run on: auto, HOST:PORT or ray://HOST:PORT (default: start a local Ray "
                        "instance); inputs and output must be on a filesystem every node sees")
    b.add_argument("--format", choices=("fairseq", "megatron"), default=None,
                   help="index layout (default fairseq; megatron with --documents)")
    b.add_argument("--max-dropped", type=float, default=0.05, metavar="SHARE",
                   help="warn loudly about an input that loses more than this share of its lines (default 0.05)")
    b.add_argument("--max-len", type=count(2), default=1024,
                   help="longest sentence in tokens, </s> included (default 1024; not with --documents)")
    b.add_argument("--on-empty", choices=("drop", "keep", "error"), default="drop",
                   help="an empty line, or a pair with an empty side: drop it and count it (default), keep it, or stop "
                        "with an error naming the file and line (with --documents, a document with no text: drop or "
                        "error)")
    b.add_argument("--on-overlong", choices=("drop", "truncate", "keep", "error"), default="drop",
                   help="a sentence over --max-len tokens: drop the pair and count it (default), cut it to "
                        "--max-len (</s> kept), keep it, or stop with an error (not with --documents)")
    b.add_argument("--on-bad-utf8", choices=("drop", "replace", "error"), default="drop",
                   help="a line that is not UTF-8: drop the pair (or document) and count it (default), decode with "
                        "U+FFFD, or stop with an error")
    d = b.add_argument_group("documents (Megatron-LM language-model data)")
    d.add_argument("--documents", action="store_true",
                   help="read documents (JSONL objects, or plain text with blank lines between documents) and write "
                        "Megatron's .bin/.idx: shardNNN/{NAME}_{key}_document, one sequence per document")
    d.add_argument("--json-keys", action="append", metavar="KEYS",
                   help="JSON keys to write, a dataset each, comma-separated or repeated: --json-keys text,title "
                        "(default: text)")
    d.add_argument("--split-sentences", action="store_true",
                   help="one sequence per sentence (a line of the document's text), documents kept in the index "
                        "(files named _sentence)")
    d.add_argument("--no-append-eod", action="store_true",
                   help="do not append the end-of-document token (SentencePiece's </s>) to each document")
    d.add_argument("--on-bad-record", choices=("drop", "error"), default="error",
                   help="a JSONL line that is not an object holding every key as a string: stop with an error "
                        "naming the file and line (default), or drop it and count it")
    b.add_argument("--spm-sample", type=count(1), default=1_000_000, help="sentences sampled to train SentencePiece (default 1000000)")
    b.add_argument("--character-coverage", type=float, metavar="SHARE",
                   help="with --train-spm: the share of the sample's characters that get pieces (SentencePiece's "
                        "character_coverage, default 0.9995: the rarest characters, accented letters of a mostly "
                        "ASCII text, become <unk>); 1.0 keeps every one")
    f = b.add_argument_group("fairseq-preprocess naming (files PREFIX.SRC and PREFIX.TGT are one direction)")
    f.add_argument("--source-lang", metavar="SRC",
                   help="with --target-lang: {split}.SRC and {split}.TGT in the input folder (train.en, train.de, "
                        "valid.en ...) are the direction SRC-TGT of that split, not two monolingual corpora")
    f.add_argument("--target-lang", metavar="TGT", help="the target side's language (see --source-lang)")
    f.add_argument("--trainpref", metavar="PREFIX",
                   help="the train split is PREFIX.SRC and PREFIX.TGT (a path: raw/train.tok), as fairseq-preprocess "
                        "reads it; no input folder needed")
    f.add_argument("--validpref", metavar="PREFIX[,PREFIX]",
                   help="the valid split's prefix; comma-separated prefixes are the splits valid, valid1, ...")
    f.add_argument("--testpref", metavar="PREFIX[,PREFIX]", help="the test split's prefix (test, test1, ...)")
    b.add_argument("--chunk-lines", type=count(1), default=20000, help="lines per unit of parallel work (default 20000)")
    b.add_argument("--seed", type=count(0, 2**31 - 1), default=1, help="seed of the SentencePiece training sample (default 1)")
    b.add_argument("--overwrite", action="store_true", help="delete datasets in the output that this run would not write")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.set_defaults(func=_binarize)

    i = sub.add_parser("inspect", help="sentences, tokens, shards and length percentiles of a data_bin",
                       description="What a data_bin holds: sentences, tokens, shards and length percentiles per "
                                   "direction and split; --verify checks every token against the dictionary.")
    i.add_argument("data_bin", help="a data_bin folder (dict.txt and shard*/ of .idx/.bin files)")
    i.add_argument("--json", action="store_true", help="machine-readable output: one object per split, direction "
                   "and side; train rows also give epoch1_upsampling (the epochs of the direction's data epoch 1 of "
                   "--config's mixture serves), the up-sampling warning goes to stderr")
    i.add_argument("--verify", action="store_true",
                   help="also read every token and refuse ids outside the dictionary (reads all the data)")
    i.add_argument("--plot", metavar="DIR", help="also draw lengths.png (sentence lengths: up to 12 directions "
                   "each direction's histogram per side; more, by resource tier (a third of the directions each, by "
                   "sentences) with each direction's medians and 99th percentiles, the most unusual named) and "
                   "sentences.png (sentences per direction and split, log scale, values printed; more than 12: the "
                   "10 largest and smallest, the others added up, every direction by rank) into DIR, and "
                   "inspect.json, the numbers they draw: per direction its sentences per split, tier, and per side "
                   "its length percentiles and histogram (entry L counts sentences of L tokens); per tier the "
                   "pooled histograms; the axis cut and the directions named; needs matplotlib")
    i.add_argument("--config", dest="config_file", default=None, metavar="CONFIG",
                   help="the mixture whose up-sampling the table is followed by: each train direction's epochs in "
                        "epoch 1 (default: nllb_like's, temperature 5); --config.KEY=VALUE overrides a value")
    _set_argument(i)
    i.set_defaults(func=_inspect, config=None)

    pl = sub.add_parser("plan", help="the static batch shapes a config gets, their padding, the alternatives",
                        description="Plan a translation config's static batch shapes from its data without "
                                    "training: each shape's batch size and padding, epoch 1's mixture, and the "
                                    "plan against the alternatives.")
    _config_arguments(pl, "ml-collections config: a file, or the name of a shipped config (default nllb_like)")
    pl.add_argument("--shapes", type=count(1), default=None, help="number of shapes (default: the config's, else 8)")
    _set_argument(pl)
    pl.add_argument("--plot", metavar="DIR", help="also draw shapes.png (the shapes over the length histogram, "
                    "padding per shape, the alternatives) and mixing.png (probability against size, served "
                    "share; shares of the data, probability and served samples per direction, or per resource "
                    "tier above 12 directions) into DIR, with plan.json, the numbers they draw (as --json "
                    "prints them); needs matplotlib")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON instead of the report: per shape "
                    "its batch and widths, planned share, epoch 1's batches, real and padded tokens and padding "
                    "efficiency; epoch 1 static and dynamic; the alternatives; the mixture's (source, target) "
                    "length histogram (cells of 'bin' tokens up to each side's 99.5th percentile); per direction "
                    "its size, probability, served samples and tier, and per tier their shares")
    pl.set_defaults(func=_plan)

    tr = sub.add_parser("trace", help="the samples of a training step: stream, task, corpus, shard and row",
                        description="Which samples a training step held, on every rank, and where each lies "
                                    "(stream, task, corpus, shard, row of the .idx), so a loss spike can be traced "
                                    "to its data. Steps count from 1 since training began, as loggers number "
                                    "them; --state (an iterator state saved during the run, JSON) anchors the "
                                    "count and checks the data is the run's.")
    _config_arguments(tr, "the run's config: a file or a shipped config's name")
    tr.add_argument("--step", type=count(1), required=True, help="the training step (from 1)")
    tr.add_argument("--state", default=None, help="a JSON file holding an iterator state of the run "
                    "(get_state(), or a dict with it under 'data')")
    tr.add_argument("--world-size", type=count(1, MAX_WORLD_SIZE), default=None,
                    help="the world size that took the step (default: as --state records it, else 1)")
    _split_argument(tr)
    _set_argument(tr)
    tr.add_argument("--decode", action="store_true", help="also print each sample's text")
    tr.add_argument("--json", action="store_true", help="one JSON list of the samples instead of a table")
    tr.set_defaults(func=_trace)

    rp = sub.add_parser("replay", help="rebuild the exact batch a rank received at a training step, as .npz",
                        description="The batch one rank received at a training step, rebuilt from the run's latest "
                                    "state without serving the steps before it (across mixture edits, weight "
                                    "changes, skips and world-size changes), written as an .npz of its leaves "
                                    "(net_input/src_tokens, target, ...) to feed the model again.")
    _config_arguments(rp, "the run's config: a file or a shipped config's name")
    rp.add_argument("--state", required=True, help="the run's latest state (JSON, or any adapter's checkpoint)")
    rp.add_argument("--step", type=count(1), required=True, help="the training step (from 1)")
    rp.add_argument("--rank", type=count(0), default=None, help="the rank whose batch to rebuild (default 0)")
    rp.add_argument("--world-size", type=count(1, MAX_WORLD_SIZE), default=None,
                    help="translation: the world size that took the step (default: as --state records it); LM: the "
                         "ranks the global batch is split into (default 1: the whole global batch)")
    _split_argument(rp)
    rp.add_argument("--out", required=True, help="the .npz file to write")
    _set_argument(rp)
    rp.set_defaults(func=_replay)

    lg = sub.add_parser("ledger", help="what a run trained on: per corpus and shard, served, passes, skipped",
                        description="What a run trained on, from its latest state alone: per corpus and shard (an LM "
                                    "run: per dataset) the samples and tokens served, the passes over its rows and "
                                    "what the run's skips dropped; then every skip: after which step, why, what it "
                                    "named and how much it dropped. A recount of the run's plan across its edits, "
                                    "weight changes, skips and world sizes.")
    _config_arguments(lg, "the run's config: a file or a shipped config's name")
    lg.add_argument("--state", required=True, help="the run's latest state (JSON, or any adapter's checkpoint)")
    lg.add_argument("--json", action="store_true", help="the report as one JSON object instead of tables")
    lg.add_argument("--plot", metavar="DIR", help="also draw ledger.png (served and skipped samples per corpus; "
                    "what each skip dropped) and write ledger.json in DIR; needs matplotlib")
    lg.add_argument("--world-size", type=count(1, MAX_WORLD_SIZE), default=None, help=argparse.SUPPRESS)
    _set_argument(lg)
    lg.set_defaults(func=_ledger)

    ed = sub.add_parser("edit", help="what an edited config changes from a saved state's next step; the edited state",
                        description="A mixture edit, before any GPU: the edited config applied to a run's saved "
                                    "state, from its next step, every stream going on from its position (the rows "
                                    "the planning window in progress had not served back in their streams). Prints "
                                    "what changed, each stream's share before and after and the streams added and "
                                    "removed; --out writes the edited run's state, which a run of the edited config "
                                    "resumes as it is (set_state, load_state_dict).")
    _config_arguments(ed, "the edited config: a file or a shipped config's name")
    ed.add_argument("--state", required=True, help="the run's state to edit (JSON, or any adapter's checkpoint)")
    ed.add_argument("--out", default=None, help="write the edited run's state here (JSON)")
    ed.add_argument("--world-size", type=count(1, MAX_WORLD_SIZE), default=None,
                    help="the world size of the run that goes on (default: as --state records it)")
    ed.add_argument("--limit", type=count(1), default=12, help="streams shown in the table (the most changed)")
    ed.add_argument("--json", action="store_true", help="the edit as one JSON object instead of a table")
    _set_argument(ed)
    ed.set_defaults(func=_edit)

    pv = sub.add_parser("preview", help="samples before and after each transform, decoded to text",
                        description="A task's samples before and after each of its transforms (noise, subword "
                                    "sampling), decoded to text.")
    _config_arguments(pv, "ml-collections config (its data.path, prefixes, seed): a file or a shipped config's name")
    pv.add_argument("--task", default=None, help="a task of the config's tasks section (TASK or TASK/CORPUS), "
                                                 "or a direction (eng_Latn-deu_Latn) or monolingual language "
                                                 "(default: the config's first task, else the first direction)")
    pv.add_argument("--transforms", default="",
                    help='e.g. "token_drop:rate=0.1;local_reorder:k=3;span_mask:ratio=0.3,mask_id=<unk>" '
                         "(default: the task's own transforms; none: the samples as the data holds them)")
    pv.add_argument("-n", type=count(1), default=5, help="samples to show (default 5)")
    pv.add_argument("--epoch", type=count(1), default=1, help="noise changes with the epoch")
    pv.add_argument("--side", choices=("source", "target"), default="source",
                    help="which side of the samples to show (default source)")
    _set_argument(pv)
    pv.set_defaults(func=_preview)

    d = sub.add_parser("demo", help="the whole pipeline on an embedded corpus: write it, binarize, inspect, stream "
                                    "an epoch, train a small model",
                       description="The main job, end to end, on an embedded corpus (~2 min on 2 cores): write a "
                                   "multilingual corpus (4 directions, 120x between the largest and smallest), "
                                   "train SentencePiece and binarize it, inspect it, stream one training epoch "
                                   "(served shares against the temperature's probabilities, padding, speed), "
                                   "then train a small model on the batches. Settings come from the demo config; "
                                   "--config.KEY=VALUE overrides one (e.g. --config.train.mixing.temperature=2).")
    _config_arguments(d, "ml-collections config: a file, or the name of a shipped config (default: demo)")
    d.add_argument("--workdir", default=None, help="where the corpus and data_bin go (default: config.workdir, "
                   "build/demo)")
    d.add_argument("--scale", type=positive_float, default=None,
                   help="multiply the corpus sizes (default: config.corpus.scale, 1.0)")
    d.add_argument("--workers", type=count(0), default=None,
                   help="binarize worker processes (default: config.binarize.workers, 0: every core)")
    d.add_argument("--train-steps", type=count(0), default=None,
                   help="training steps (default: config.model.steps, 300; 0: no training)")
    d.add_argument("--trainer", choices=("flax", "torch"), default="flax",
                   help="the example that trains: flax (jax) or torch (default flax)")
    d.set_defaults(func=_demo)
    return p


def reference_markdown() -> str:
    """docs/reference/cli.md: every command's ``--help``, written from the parser by ``make docs`` (a test holds
    the file to it), at a fixed width so the file does not depend on the terminal that wrote it."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "112"
    try:
        parser = build_parser()
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        out = ["# Command line", "",
               "<!-- Written by `make docs` from babelfeed/tools/cli.py (a test holds this file to the parser). -->",
               "", "Every command, with its `--help` as the installed `babelfeed` prints it.", "",
               "A command that reads a config takes it as its first argument or as `--config CONFIG`, one or the "
               "other. `--config.KEY=VALUE`, `--config.KEY VALUE` (absl's forms) and `--set KEY=VALUE` override a "
               "value; the keys are listed in [config keys](config.md).", "",
               "```text", parser.format_help().rstrip(), "```", ""]
        for name, sub in commands.items():
            out += [f"## `babelfeed {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
        return "\n".join(out)
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def describe(e: BaseException) -> str:
    """One line naming what is wrong."""
    if isinstance(e, OSError) and e.filename is not None:
        where = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else os.fspath(e.filename)
        return f"{where}: {e.strerror or e}"
    if isinstance(e, KeyError) and len(e.args) == 1:
        return f"missing key {e.args[0]!r}" if isinstance(e.args[0], str) and " " not in e.args[0] else str(e.args[0])
    text = " ".join(str(e).split()) or type(e).__name__  # multi-line messages (SentencePiece's) on one line
    if "objects" in text:
        text = remote_names(text)  # (shadow files named as the objects)
    # the Python API's ways round a mismatch have no flag here (the message already says to use the run's config)

    return text.replace(EDIT_HINT, "").replace(
        " set_state(state, mixture_change='keep_position') resumes at its position anyway.",
        " The command reads states that have one.")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --config=FILE is the config file; --config.key.path=value overrides one of its values (config_flags syntax)
    argv = [a.replace("--config=", "--config ", 1) if a.startswith("--config=") else a for a in argv]
    argv = [part for a in argv for part in (a.split(" ", 1) if a.startswith("--config ") else [a])]
    # stdout line by line, so that its lines and stderr's keep their order in one file (`> log 2>&1`)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    try:
        argv, overrides = split_config_args(argv)
        for flag, value in zip(argv, argv[1:]):
            if flag == "--set" and "=" not in value:
                raise UsageError(f"--set takes KEY=VALUE as one argument: --set {value}=..., or --config.{value} "
                                 f"VALUE")
    except ValueError as e:
        print(f"babelfeed: error: {e}", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    args.overrides = overrides
    args.argv = argv  # (binarize quotes its command line in hints)
    debug = args.debug or bool(os.environ.get("BABELFEED_DEBUG"))
    prog = f"babelfeed {args.command}"
    if not debug:  # a warning is one line, as errors are (Python adds the warning's class, file and source line)
        warnings.formatwarning = lambda message, category, *_, **__: f"{prog}: warning: {message}\n"
    if overrides and args.command not in ("plan", "demo", "preview", "trace"):
        print(f"{prog}: error: --config.* overrides apply to plan, preview, trace and demo only", file=sys.stderr)
        return 2

    terminate_as_interrupt()  # SIGTERM cleans up as Ctrl-C does (workers stopped, temporaries removed)

    if not faulthandler.is_enabled():  # a fatal signal (SIGBUS: a mapped file truncated) prints where, not nothing
        faulthandler.enable()
    try:
        return args.func(args)
    except KeyboardInterrupt as e:
        if debug:
            raise
        how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        kept = "; finished shards are kept, re-run to resume" if args.command == "binarize" else ""
        print(f"{prog}: {how}{kept}", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    except BrokenPipeError:  # `babelfeed plan ... | head`: the reader has gone, as with any filter
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141
    except Exception as e:
        if debug:
            raise
        if is_user_error(e):
            print(f"{prog}: error: {describe(e)}", file=sys.stderr)
            return 2
        # a bug: still one line, and the way to the traceback
        print(f"{prog}: internal error: {type(e).__name__}: {describe(e)} (run again with --debug for the "
              f"traceback, and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
