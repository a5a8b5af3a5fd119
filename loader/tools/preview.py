"""``babelfeed preview``: samples of a direction before and after each transform, decoded to text."""

from __future__ import annotations

import os

import numpy as np

from babelfeed.checks import at_least
from babelfeed.config.spec import parse
from babelfeed.errors import ConfigError, DataError, FormatError
from babelfeed.gather.transforms import NoiseContext, Ragged, apply, parse_steps
from babelfeed.sources.corpus import ShardedCorpus
from babelfeed.sources.sources import resolve_prefix
from babelfeed.storage.remote.client import resolve


def _decoder(root: str, dictionary):
    path = os.path.join(resolve(root), "spm.model")  # (a store's folder: its shadow)
    sp = None
    if os.path.exists(path):
        import sentencepiece as spm  # loaded when text is encoded (tens of ms at import)

        try:
            sp = spm.SentencePieceProcessor(model_file=path)
        except (RuntimeError, OSError) as e:  # (SentencePiece's own words for a file it cannot parse)
            raise FormatError(path, f"not a SentencePiece model ({' '.join(str(e).split())[:200]})") from None
    specials = set(dictionary.symbols[: dictionary.nspecial]) | {f"__{k}__" for k in dictionary.language_tokens}

    def text(ids) -> str:
        out, run = [], []
        for i in ids:
            sym = dictionary[int(i)]
            if sym in specials or sp is None or sp.piece_to_id(sym) == sp.unk_id():
                if run:
                    out.append(sp.decode_pieces(run) if sp else " ".join(run))
                    run = []
                out.append(sym)
            else:
                run.append(sym)
        if run:
            out.append(sp.decode_pieces(run) if sp else " ".join(run))
        return " ".join(out)

    return text


def preview(config, task: str | None, transforms: str, n: int = 5, epoch: int = 1, side: str = "source") -> str:
    """``n`` samples of ``task`` (a task of the config, ``TASK/CORPUS``, a direction or a monolingual language;
    None: the config's first task, else the data's first direction) decoded to text, as the data holds them and
    after each transform (``transforms``, else the task's own; none: the samples as they are)."""
    parse(config)
    at_least("n", n, 1)
    at_least("epoch", epoch, 1)
    corpus = ShardedCorpus(config.data.path)
    dictionary = corpus.dictionary()
    split = config.data.train_split
    source_prefix, target_prefix = config.data.source_prefix, config.data.target_prefix
    tasks = dict(config.tasks) if "tasks" in config and config.tasks else {}
    if task is None:
        task = next(iter(tasks), None) or next(iter(corpus.directions(split) + corpus.monolingual(split)), None)
        if task is None:
            raise DataError(f"{config.data.path} holds no {split} data to preview")
    name, _, key = task.partition("/")
    if name in tasks:  # a task of the config: its corpus, prefixes and (unless given) transforms
        t = tasks[name]
        if str(t.get("text", "")).strip():
            raise ConfigError(f"task {name!r} reads raw text; preview shows binarized corpora")
        corpora = [c.strip() for c in str(t.corpora).split(",") if c.strip()]
        key = key or corpora[0]
        transforms = transforms or t.transforms
        source_prefix = source_prefix if t.source_prefix == "inherit" else t.source_prefix
        target_prefix = target_prefix if t.target_prefix == "inherit" else t.target_prefix
        task = key
    elif tasks:
        raise ConfigError(f"no task {name!r} in the config; tasks: {sorted(tasks)}")
    shard = corpus.shard_ids(split, task)
    if not shard:
        raise DataError(f"no {split} data for {task!r}; available: {corpus.directions(split) + corpus.monolingual(split)}")
    src_lang, tgt_lang = task.split("-") if "-" in task else (task, task)
    lang = src_lang if side == "source" else tgt_lang
    ds = corpus.open(split, task, lang if "-" in task else None, shard[0])
    template = source_prefix if side == "source" else target_prefix
    prefix = resolve_prefix(template, dictionary, task, src=src_lang, tgt=tgt_lang, lang=src_lang)
    steps = parse_steps(transforms, dictionary) if str(transforms or "").strip() else []
    rows = np.arange(min(n, len(ds)))
    batch = Ragged.from_lists([prefix.tolist() + ds[int(r)].astype(np.int64).tolist() for r in rows])
    ctx = NoiseContext(config.seed, epoch, rows, protect_prefix=len(prefix))
    text = _decoder(config.data.path, dictionary)
    stages = [("original", batch)]
    for name, params in steps:
        batch = apply(batch, ctx, [(name, params)])
        stages.append((f"{name} {params}", batch))
    lines = [f"{task} ({side}), shard {shard[0]}, epoch {epoch}, seed {config.seed}: {len(steps)} transform(s)"]
    for i, r in enumerate(rows.tolist()):
        lines.append(f"\n[{r}]")
        for label, b in stages:
            lines.append(f"  {label:<32} {text(b.to_lists()[i])}")
    return "\n".join(lines)
