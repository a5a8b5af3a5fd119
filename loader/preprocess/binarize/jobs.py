"""The plan of a binarize run: shards, cut into chunks of lines that workers encode (``Chunk``, ``ShardJob``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from babelfeed.preprocess.rawtext import RawInput
from babelfeed.preprocess.textio import RecordReader


@dataclass
class Chunk:
    shard_key: tuple  # (split, key, shard)
    index: int  # chunk number within its shard
    sides: list  # per side: (path, start_byte, start_line, skip, end_byte) -- where the reader enters, records to
    # pass, and where a plain file's next mark after the chunk is (None: read on to the end)
    count: int  # records to read
    langs: list
    format: str = "lines"  # "lines", "jsonl" or "text"

    @property
    def name(self) -> str:
        split, key, shard = self.shard_key
        return f"{split}.{key}.shard{shard:03d}.chunk{self.index}"

    def reader(self, side: int) -> RecordReader:
        path, start_byte, start_line, skip, end_byte = self.sides[side]
        return RecordReader(path, "block" if self.format == "text" else "line", start_byte, start_line, skip,
                            end_byte)


@dataclass
class ShardJob:
    split: str
    key: str
    shard: int
    langs: list
    line_range: tuple
    chunks: list = field(default_factory=list)
    files: list = field(default_factory=list)  # every input file this shard reads
    documents: bool = False
    level: str = "document"

    @property
    def name(self) -> str:
        return f"{self.split}.{self.key}"

    def out_prefix(self, output_dir: str, lang: str) -> str:
        if self.documents:  # Megatron's naming: {corpus}_{json key}_{document|sentence}
            stem = f"{self.key}_{lang}_{self.level}"
        else:
            stem = f"{self.split}.{self.key}.{lang}" if "-" in self.key else f"{self.split}.{self.key}"
        return os.path.join(output_dir, f"shard{self.shard:03d}", stem)


def plan_jobs(inputs: list[RawInput], shards: int, chunk_lines: int, level: str = "document") -> list[ShardJob]:
    """Shards and their chunks. Shard ``s`` of an input holds its records ``[round(s n / S), round((s+1) n / S))``
    across its parts; a plain part is cut at its marks (every ``chunk_lines`` records), a compressed one is one
    chunk per shard it overlaps. The cut does not change the bytes written, only how the work is spread."""
    jobs = []
    for inp in inputs:
        n_shards = shards if inp.split.startswith("train") else 1
        total = sum(p.records for p in inp.parts)
        bounds = [round(k * total / n_shards) for k in range(n_shards + 1)]
        part_start = np.concatenate([[0], np.cumsum([p.records for p in inp.parts])]).tolist()
        for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            job = ShardJob(inp.split, inp.key, s, inp.langs, (lo, hi), documents=inp.documents, level=level)
            for part, p0 in zip(inp.parts, part_start):
                a, b = max(lo, p0) - p0, min(hi, p0 + part.records) - p0
                if a >= b:
                    continue
                job.files.extend(part.paths)
                seekable = part.marks and all(m is not None for m in part.marks)
                starts = [a] + ([c for c in range(-(-(a + 1) // chunk_lines) * chunk_lines, b, chunk_lines)]
                                if seekable else [])
                for i, c in enumerate(starts):
                    end = starts[i + 1] if i + 1 < len(starts) else b
                    if seekable:
                        m, m_end = c // chunk_lines, -(-end // chunk_lines)
                        sides = [(path, marks[m][0], marks[m][1], c - m * chunk_lines,
                                  marks[m_end][0] if m_end < len(marks) else None)
                                 for path, marks in zip(part.paths, part.marks)]
                    else:
                        sides = [(path, 0, 0, c, None) for path in part.paths]
                    job.chunks.append(Chunk((inp.split, inp.key, s), len(job.chunks), sides, end - c, inp.langs,
                                            part.format))
            jobs.append(job)
    return jobs
