"""How many samples each corpus contributes to an epoch, and which ones.

Probabilities (fairseq ``sampling_method.py`` semantics)::

    temperature T:   p_i = n_i^(1/T) / sum_j n_j^(1/T)      (T = 1: proportional; T -> inf: uniform)
    uniform:         p_i = 1 / k
    weights:         p_i = w_i / sum_j w_j

The default sampler computes the temperature probabilities in log space (no underflow for any T or size). The
``fairseq`` sampler computes them as fairseq does (``fairseq_ratios``, ``fairseq_virtual_size``): in float64,
unnormalised ``(n_i / N) ** (1 / T)``, normalised once by the draw. The two agree to the last bit or two, but a
last bit matters there: at T = 1 (Open-NLLB's default) ``V p_i`` is an integer, and a hair below it moves a
sample from the floor into the drawn remainder, which changes every later draw of the epoch.

Virtual epoch size (fairseq ``default_virtual_size_func``): with ``j = argmax n``,
``V = int(min(sum_i p_i / p_j * n_j, max_scale_up * sum_i n_i))``: the largest corpus keeps its size, the others
scale with their probability, and the total is capped at 1.5x the real data. Per-corpus counts are
``c_i = floor(V p_i)`` plus the remainder ``V - sum_i c_i``.

Which rows, per corpus, given its count ``c`` and size ``n``:

* ``stratified`` (default): ``c = q n + r`` takes every row ``q`` times and ``r`` distinct rows once more, so
  every row appears ``floor(c/n)`` or ``ceil(c/n)`` times; a down-sampled corpus (``c < n``) is drawn without
  replacement. The remainder of the counts goes to the largest fractional parts (no randomness).
* ``fairseq``: fairseq's exact draw: ``RandomState([sha1(class name) % 2**32, seed, epoch])``, the remainder
  drawn by ``rng.choice(k, V - sum c, p=p)``, then ``rng.choice(n_i, c_i, replace=c_i > n_i)`` per corpus.
  Once ``c > n`` the whole draw is with replacement, so an up-sampled epoch misses about a third of the rows
  (1 - 1/e at c = n): the defect ``stratified`` removes.
* ``stream``: every corpus is an endless stream that cycles its own data (a fresh keyed permutation per pass,
  so each pass sees every row once) and keeps its own position across epochs. The mix is decided per window
  (``task_probabilities``, possibly from a schedule that changes during training), so a corpus whose weight
  rises simply reads further ahead in its own stream. ``StreamDraw`` maps stream positions to rows.
"""

from __future__ import annotations

import hashlib

import numpy as np

from babelfeed._native import plan_kernel
from babelfeed.permute import derive_key, permute, permute_many
from babelfeed.errors import DataError, UsageError


def sampling_probabilities(sizes, temperature: float = 1.0) -> np.ndarray:
    """Per-corpus sampling probabilities ``p_i ~ n_i^(1/T)`` (float64, sums to 1)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    if sizes.ndim != 1 or sizes.size == 0:
        raise UsageError(f"sizes must be a non-empty 1-D array, got shape {sizes.shape}")
    if (sizes < 0).any():
        raise UsageError(f"sizes must be >= 0, got {sizes.tolist()}")
    if not temperature > 0:
        raise UsageError(f"temperature must be > 0, got {temperature}")
    if sizes.sum() == 0:
        raise DataError("every corpus is empty")
    # fairseq normalises first ((n_i / sum n)^(1/T)), which is the same after renormalising; do it in log space
    # so that a large T or huge sizes cannot underflow.
    with np.errstate(divide="ignore"):
        logits = np.log(sizes / sizes.sum()) / temperature
    logits[sizes == 0] = -np.inf
    w = np.exp(logits - logits.max())
    return w / w.sum()


def capped_probabilities(probs, sizes, total: float, max_upsample: float) -> np.ndarray:
    """``probs`` with no corpus expected more than ``max_upsample`` times its size in an epoch of ``total``
    samples: each corpus over the cap is held at it and the excess goes to the others in proportion to their
    probabilities, repeated until none is over (at most one pass per corpus). When every corpus with data is
    capped the probabilities are the caps' (the epoch then holds fewer than ``total``: see the sampler)."""
    p = np.asarray(probs, dtype=np.float64) / np.sum(probs)
    cap = np.asarray(sizes, dtype=np.float64) * max_upsample / total
    held = np.zeros(len(p), bool)
    for _ in range(len(p)):
        over = ~held & (p > cap * (1 + 1e-12))
        if not over.any():
            break
        held |= over
        free = ~held & (p > 0)
        rest = 1.0 - cap[held].sum()
        p = np.where(held, cap, p)
        if not free.any() or rest <= 0:
            break
        p[free] *= rest / p[free].sum()
    return p / p.sum()


def fairseq_ratios(sizes, temperature: float) -> np.ndarray:
    """fairseq's ``temperature_sampling``, operation for operation: ``(n_i / N) ** (1 / T)`` in Python floats
    (float64), unnormalised. Only for the fairseq sampler: it underflows to 0 where the log-space path does not."""
    sizes = [int(n) for n in np.asarray(sizes).reshape(-1).tolist()]
    if not sizes or min(sizes) < 0 or sum(sizes) == 0:
        raise UsageError(f"sizes must be a non-empty list of counts >= 0, not all 0, got {sizes}")
    if not temperature > 0:
        raise UsageError(f"temperature must be > 0, got {temperature}")
    total = sum(sizes)
    ratios = np.array([(n / total) ** (1.0 / temperature) for n in sizes], dtype=np.float64)
    if not ratios.sum() > 0:
        raise UsageError(f"temperature {temperature} underflows every sampling ratio of sizes {sizes} to 0")
    return ratios


def fairseq_virtual_size(sizes, ratios, max_scale_up: float = 1.5) -> int:
    """fairseq's ``default_virtual_size_func`` operation for operation, on the *unnormalised* ratios: per corpus
    ``(r_i / r_j) * n_j`` (j the first largest corpus), summed left to right, capped at ``max_scale_up * sum n``."""
    sizes = [int(n) for n in np.asarray(sizes).reshape(-1).tolist()]
    ratios = np.asarray(ratios, dtype=np.float64)
    j = int(np.argmax(sizes))
    if ratios[j] == 0:
        raise UsageError("the largest corpus has sampling ratio 0; give an explicit virtual size")
    vsize = sum([(r / ratios[j]) * sizes[j] for r in ratios])
    max_size = sum(sizes) * max_scale_up
    return int(vsize if vsize < max_size else max_size)


def weight_probabilities(weights) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise UsageError(f"weights must be finite, >= 0 and not all 0, got {np.asarray(weights).tolist()}")
    return w / w.sum()


def virtual_size(sizes, probs, max_scale_up: float = 1.5) -> int:
    """fairseq's ``default_virtual_size_func``: the largest corpus keeps its size, capped at max_scale_up x total.

    When the largest corpus is not sampled at all (a weight or schedule phase of 0; fairseq divides by zero
    there), the largest corpus that is sampled keeps its size."""
    sizes = np.asarray(sizes, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    if not (probs > 0).any():
        raise UsageError("no corpus has a probability above 0")
    j = int(np.argmax(np.where(probs > 0, sizes, -1.0)))
    scaled = float(np.sum(probs / probs[j] * sizes[j]))
    return int(min(scaled, max_scale_up * float(sizes.sum())))


def fairseq_estimated_total(shard_sizes, epoch: int) -> int:
    """A direction's size as fairseq's ``MultilingualDatasetManager.get_train_dataset_sizes`` sees it in ``epoch``
    of an uninterrupted run: shard ``(e - 1) % k`` is loaded in epoch e and its size remembered; a shard not loaded
    yet counts as the largest loaded so far. So epoch 1 uses ``k * size(shard 0)``, and the totals are exact only
    from epoch k on. (fairseq keeps what it has seen in memory: a fairseq run restarted from a checkpoint at epoch
    e knows only shard ``(e - 1) % k`` then; our plan, a pure function of the epoch, is the uninterrupted run's.)"""
    sizes = [int(n) for n in shard_sizes]
    k = len(sizes)
    if not k or epoch < 1:
        raise UsageError(f"need at least one shard size and an epoch >= 1, got {sizes} and epoch {epoch}")
    known = {(e - 1) % k for e in range(1, min(epoch, k) + 1)}
    largest = max(sizes[i] for i in known)
    return sum(sizes[i] if i in known else largest for i in range(k))


def stratified_counts(probs, total: int, most: np.ndarray | None = None) -> np.ndarray:
    """``floor(total p_i)`` plus the remainder by largest fractional part (ties to the lower index). ``most``: per
    entry, a count it never exceeds (a cap, ``floor(max_upsample x size)``): the remainder goes to the others, and
    what none can take is left out (the epoch holds fewer)."""
    probs = np.asarray(probs, dtype=np.float64)
    exact = probs * total
    counts = np.floor(exact).astype(np.int64)
    if most is not None:
        counts = np.minimum(counts, most)
    rest = int(total - counts.sum())
    if rest > 0:
        order = np.lexsort((np.arange(len(probs)), -(exact - counts)))
        if most is not None:
            order = order[counts[order] < most[order]]
        counts[order[:rest]] += 1
    return counts


# ------------------------------------------------------------------------------------------- stratified
class StratifiedDraw:
    """The rows one corpus contributes to one epoch, in a pseudorandom order, addressable by position.

    ``rows(positions)`` maps positions ``[0, count)`` of the corpus's epoch sequence to row numbers in
    ``[0, n)``, without materialising the sequence: a keyed permutation orders the ``count`` draws, the first
    ``q n`` of them cover every row ``q`` times, and the last ``r`` are the first ``r`` rows of another keyed
    permutation of ``[0, n)`` (distinct rows: drawn without replacement).
    """

    def __init__(self, n: int, count: int, key_parts: tuple):
        if n <= 0 and count > 0:
            raise DataError("cannot draw from an empty corpus")
        self.n, self.count = int(n), int(count)
        self.q, self.r = divmod(self.count, self.n) if self.n else (0, 0)
        self.order_key = derive_key(*key_parts, "order")
        self.extra_key = derive_key(*key_parts, "extra")

    def rows(self, positions) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64)
        compiled = plan_kernel.stratified(pos, None, np.array([[self.n, self.count, self.q * self.n]], np.int64),
                                          self.order_key, self.extra_key)
        if compiled is not None:
            return compiled
        slot = permute(pos, self.count, self.order_key)
        full = self.q * self.n
        out = np.empty_like(slot)
        base = slot < full
        out[base] = slot[base] % self.n
        extra = ~base
        if extra.any():
            out[extra] = permute(slot[extra] - full, self.n, self.extra_key)
        return out


def stratified_rows(draws: list, which: np.ndarray, positions: np.ndarray, used=None) -> np.ndarray:
    """``draws[which[i]].rows([positions[i]])`` for every i in one vectorised pass (many corpora at once).
    ``used``: the distinct values of ``which`` when the caller knows them."""
    which = np.asarray(which, dtype=np.int64)
    pos = np.asarray(positions, dtype=np.int64)
    if not len(pos):
        return np.zeros(0, np.int64)
    table, okeys, ekeys = _draw_tables(draws, np.unique(which) if used is None else np.asarray(used, np.int64))
    compiled = plan_kernel.stratified(pos, which, table, okeys, ekeys)
    if compiled is not None:
        return compiled
    slot = permute_many(pos, table[:, 1], okeys, which)
    n, full = table[which, 0], table[which, 2]
    out = np.empty_like(slot)
    base = slot < full
    out[base] = slot[base] % n[base]
    extra = np.flatnonzero(~base)
    if len(extra):
        out[extra] = permute_many(slot[extra] - full[extra], table[:, 0], ekeys, which[extra])
    return out


def stratified_span_rows(draws: list, spans) -> np.ndarray:
    """``stratified_rows`` over runs: per (corpus, first position, count) in ``spans``, the rows of those
    consecutive positions, one run after another (a window's slice of each direction). The kernel walks the
    positions itself; numpy spells them out."""
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
    spans = spans[spans[:, 2] > 0]
    if not len(spans):
        return np.zeros(0, np.int64)
    table, okeys, ekeys = _draw_tables(draws, np.unique(spans[:, 0]))
    compiled = plan_kernel.stratified_spans(spans, table, okeys, ekeys)
    if compiled is not None:
        return compiled
    which = np.repeat(spans[:, 0], spans[:, 2])
    pos = np.concatenate([np.arange(lo, lo + c, dtype=np.int64) for _, lo, c in spans.tolist()])
    return stratified_rows(draws, which, pos, used=np.unique(spans[:, 0]))


def _draw_tables(draws: list, used: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per corpus up to the largest of ``used``: (n, count, full) and both round keys (zero where unused)."""
    table = np.zeros((int(used.max()) + 1, 3), np.int64)
    okeys = np.zeros((len(table), 4), np.uint64)
    ekeys = np.zeros((len(table), 4), np.uint64)
    for d in used.tolist():
        draw = draws[d]
        table[d] = draw.n, draw.count, draw.q * draw.n
        okeys[d], ekeys[d] = draw.order_key, draw.extra_key
    return table, okeys, ekeys


# ------------------------------------------------------------------------------------------- fairseq
def fairseq_class_hash(name: str = "SampledMultiDataset") -> int:
    """``int(hashlib.sha1(name.encode()).hexdigest(), 16) % 2**32``, fairseq's per-class RNG seed component."""
    return int(hashlib.sha1(name.encode("utf-8")).hexdigest(), 16) % 2**32


def fairseq_draw(sizes, ratios, virtual: int, epoch: int, seed: int = 2,
                 class_name: str = "SampledMultiDataset") -> list[np.ndarray]:
    """fairseq's ``SampledMultiDataset.get_virtual_indices``, bit for bit: the row indices drawn per corpus.

    ``ratios``: fairseq's sampling ratios as given to the dataset (``fairseq_ratios``; unnormalised), normalised
    here once, as fairseq does (normalising twice can move the last bit). ``seed`` is 2 in fairseq's
    multilingual task whatever ``--seed`` says (the data manager never passes it).
    """
    rng = np.random.RandomState([fairseq_class_hash(class_name), seed % 2**32, epoch])
    r = np.asarray(ratios, dtype=np.float64)
    p = r / r.sum()
    counts = (virtual * p).astype(np.int64)
    diff = virtual - counts.sum()
    if diff < 0:
        raise UsageError(f"virtual size {virtual} is smaller than the floor of its counts")
    if diff > 0:
        for i in rng.choice(len(p), size=int(diff), p=p):
            counts[i] += 1
    return [rng.choice(int(n), int(c), replace=bool(c > n)) for n, c in zip(sizes, counts)]


# ------------------------------------------------------------------------------------------- streams
def task_probabilities(task_probs, task_of, sizes, temperature: float = 1.0) -> np.ndarray:
    """Per-stream probabilities from per-task ones: a task's probability is split among its streams by
    temperature over their sizes (``p_s = P(task) * n_s^(1/T) / sum_{s' in task} n_s'^(1/T)``)."""
    task_probs = np.asarray(task_probs, dtype=np.float64)
    task_of = np.asarray(task_of, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.float64)
    out = np.zeros(len(sizes))
    for t, pt in enumerate(task_probs):
        members = np.flatnonzero(task_of == t)
        if pt == 0 or not len(members):
            continue
        if sizes[members].sum() == 0:
            raise DataError(f"task {t} has weight {pt} but no data")
        out[members] = pt * sampling_probabilities(sizes[members], temperature)
    return out / out.sum()


class StreamDraw:
    """Rows of an endless stream over ``n`` rows: position p is row ``perm_c(p mod n)`` of pass ``c = p // n``,
    each pass a different keyed permutation (so every pass reads every row exactly once)."""

    def __init__(self, n: int, key_parts: tuple):
        self.n = int(n)
        self.key_parts = tuple(key_parts)

    def rows(self, positions) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64)
        if self.n <= 0:
            if pos.size:
                raise DataError(f"cannot draw from an empty stream {self.key_parts}")
            return pos
        passes, local = np.divmod(pos, self.n)
        out = np.empty_like(pos)
        for c in np.unique(passes).tolist():
            sel = passes == c
            out[sel] = permute(local[sel], self.n, derive_key(*self.key_parts, "pass", int(c)))
        return out


def stream_rows(draws: list, which: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``draws[which[i]].rows([positions[i]])`` for every i in one vectorised pass (many streams at once)."""
    which = np.asarray(which, dtype=np.int64)
    pos = np.asarray(positions, dtype=np.int64)
    if not len(pos):
        return np.zeros(0, np.int64)
    sizes = np.array([d.n for d in draws], dtype=np.int64)
    n = sizes[which]
    if (n <= 0).any():
        raise DataError(f"cannot draw from an empty stream {draws[int(which[np.argmax(n <= 0)])].key_parts}")
    passes, local = np.divmod(pos, n)
    # the (stream, pass) pairs as one int64 each: a 1-D unique is several times faster than a row-wise one
    width = int(passes.max()) + 1
    codes, inverse = np.unique(which * width + passes, return_inverse=True)
    pairs = np.stack([codes // width, codes % width], axis=1)
    keys = np.stack([derive_key(*draws[d].key_parts, "pass", int(c)) for d, c in pairs.tolist()])
    return permute_many(local, sizes[pairs[:, 0]], keys, inverse.reshape(-1))
