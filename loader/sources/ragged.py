"""Ragged token batches: every sentence's tokens back to back, with their lengths (what raw-text segmentation
and the source transforms hand to the collater)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass
class Ragged:
    tokens: np.ndarray  # int64, every sentence back to back
    lengths: np.ndarray  # int64

    @classmethod
    def from_lists(cls, seqs) -> "Ragged":
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        tokens = np.concatenate([np.asarray(s, np.int64) for s in seqs]) if len(seqs) else np.zeros(0, np.int64)
        return cls(tokens, lengths)

    def to_lists(self) -> list[list[int]]:
        return [a.tolist() for a in np.split(self.tokens, np.cumsum(self.lengths)[:-1])] if len(self.lengths) else []

    @functools.cached_property
    def sentence(self) -> np.ndarray:
        """Sentence index of every token (computed once per batch: transforms return new batches)."""
        return np.repeat(np.arange(len(self.lengths)), self.lengths)

    @functools.cached_property
    def position(self) -> np.ndarray:
        """Position of every token within its sentence."""
        starts = np.cumsum(self.lengths) - self.lengths
        return np.arange(int(self.lengths.sum()), dtype=np.int64) - np.repeat(starts, self.lengths)

