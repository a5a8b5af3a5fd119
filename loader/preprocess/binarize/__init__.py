"""``babelfeed binarize``: raw text -> SentencePiece -> a sharded data_bin of ``.idx``/``.bin`` files.

Output (Open-NLLB's layout, readable by fairseq and by :class:`babelfeed.ShardedCorpus`)::

    DATA_BIN/dict.txt                                 fairseq dictionary, language tokens __xx__ last
    DATA_BIN/spm.model                                the SentencePiece model used
    DATA_BIN/shardNNN/{split}.{src}-{tgt}.{lang}.{bin,idx}   train splits cut into --shards shards
    DATA_BIN/shard000/{split}.{lang}.{bin,idx}        monolingual; valid/test live in shard000 only
    DATA_BIN/binarize_report.json                     kept and dropped counts per split and direction

Every sentence ends with ``</s>`` (id 2). The work is cut into chunks of lines that workers encode in
parallel (an engine of :mod:`babelfeed.preprocess.engines`: local processes or Ray tasks); chunks are merged into their
shard, which is then renamed into place atomically and recorded in ``DATA_BIN/.binarize/`` with a fingerprint
of its inputs and settings. A re-run skips every recorded shard whose fingerprint still matches and redoes the
rest, so a killed run resumes where it stopped. The plan of chunks and the merge order depend only on the
inputs and settings, so every engine and worker count writes the same bytes.

Inputs may be many files per direction and compressed (:mod:`babelfeed.preprocess.rawtext`); they are streamed, never read
whole. A plain file is cut into chunks of ``chunk_lines`` lines that enter it at a byte offset; a compressed
file cannot be entered in the middle, so each shard's part of it is one chunk, read from the file's start
(parallelism then comes from the number of files).

With ``documents=True`` (:mod:`babelfeed.preprocess.documents`) the inputs are JSONL or plain-text documents and the output
is Megatron-LM's ``.bin``/``.idx`` with a document index, as Megatron's ``preprocess_data.py`` writes it.

Bad lines follow an explicit policy, applied to the whole pair so that both sides stay aligned:
``empty`` (blank after stripping), ``overlong`` (more than ``max_len`` tokens with ``</s>``) and
``bad_utf8`` (undecodable bytes). Each is counted and reported at the end; none is dropped silently.

The package, by what each part owns: ``jobs`` (the plan of shards and chunks), ``encode`` (what a worker runs:
a chunk encoded, a shard merged; the chunk loop is shared with documents, ``preprocess.chunks``), ``spm``
(SentencePiece's sample, model and dictionary), ``records`` (what a run leaves to resume from: shard records,
the lock, partial files swept), ``report`` (counts, warnings and the table) and ``run`` (the driver).
"""

from babelfeed.preprocess.binarize.jobs import Chunk, ShardJob, plan_jobs
from babelfeed.preprocess.binarize.report import format_report, megatron_data_path
from babelfeed.preprocess.binarize.run import binarize
from babelfeed.preprocess.binarize.spm import build_dictionary, train_spm
from babelfeed.preprocess.options import BinarizeOptions


__all__ = ["BinarizeOptions", "Chunk", "ShardJob", "binarize", "build_dictionary", "format_report",
           "megatron_data_path", "plan_jobs", "train_spm"]
