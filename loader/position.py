"""A loader's position in its data, kept in the training process: what the torch ``BatchLoader`` and the grain
``EpochsDataset`` save and restore.

``{"epoch", "consumed", "fingerprint"}``: ``consumed`` counts the global batches of the epoch that every rank
together has taken. Global batches never depend on the world size, the split or the number of workers, so a
position restores on any of them; the fingerprint refuses another data's state.
"""

from __future__ import annotations


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_position(state, what: str) -> tuple[int, int]:
    """``(epoch, consumed)`` of a saved loader position, refusing what is not one (named in the error)."""
    if not isinstance(state, dict) or not {"epoch", "consumed", "fingerprint"} <= set(state):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a {what} state (it has epoch, consumed, fingerprint; this has {keys})"
                         + (": states saved before consumed replaced batches_seen cannot be converted safely"
                            if isinstance(state, dict) and "batches_seen" in state else ""))
    epoch, consumed = state["epoch"], state["consumed"]
    if not (_int(epoch) and 1 <= epoch < 1 << 31 and _int(consumed) and consumed >= 0):
        raise ValueError(f"{what} state: epoch must be an int in [1, 2**31) and consumed an int >= 0, got "
                         f"epoch={epoch!r}, consumed={consumed!r}")
    if not isinstance(state["fingerprint"], str):
        raise ValueError(f"{what} state: fingerprint must be a string, got {state['fingerprint']!r}")
    return epoch, consumed


class Position:
    """Where a rank stands in its data, kept in the training process: ``(epoch, consumed)`` with ``consumed`` the
    global batches of the epoch that every rank together has taken. Global batches never depend on the world size,
    so the position restores on any world size and ``split``, with any number of workers.

    It keeps one iterator (of the current epoch) to check positions and name the finished epoch."""

    def __init__(self, config, rank, world_size, split, what: str):
        self.config, self.rank, self.world_size, self.split, self.what = config, rank, world_size, split, what
        self._it = None

    def iterator(self, epoch: int):
        if self._it is None or self._it.epoch != epoch:
            from babelfeed.build import build_iterator

            self._it = build_iterator(self.config, rank=self.rank, world_size=self.world_size, epoch=epoch,
                                      split=self.split)
        return self._it

    @property
    def is_lm(self) -> bool:
        from babelfeed.build import is_lm_config

        return is_lm_config(self.config)

    def state(self, epoch: int, consumed: int) -> dict:
        """The state of a position, a finished translation epoch written as the start of the next (an LM run is
        one pass: its end stays its end)."""
        it = self.iterator(epoch)
        if consumed and not self.is_lm and not it.has_batch(0, base=consumed):
            epoch, consumed = epoch + 1, 0
        state = {"epoch": epoch, "consumed": int(min(consumed, len(it))) if self.is_lm else int(consumed),
                 "fingerprint": self.iterator(epoch).fingerprint()}
        planner = getattr(it, "planner", None)
        if planner is not None and planner.changing_schedule:  # how many global batches an update was
            state["batches_per_update"] = planner.opts.batches_per_update
        return state

    def load(self, state) -> tuple[int, int]:
        epoch, consumed = check_position(state, self.what)
        if self.is_lm and epoch != 1:
            raise ValueError(f"{self.what} state: an LM run is one pass (epoch 1), this state has epoch {epoch}")
        it = self.iterator(epoch)
        if state["fingerprint"] != it.fingerprint():
            raise ValueError(f"this {self.what} state was saved for other data or settings (fingerprint "
                             f"{state['fingerprint']}, this config's {it.fingerprint()}): resume with the config "
                             f"and data it was saved with")
        planner = getattr(it, "planner", None)
        if planner is not None and planner.changing_schedule:
            per = state.get("batches_per_update", planner.opts.batches_per_update)
            if per != planner.opts.batches_per_update:
                raise ValueError(f"{self.what} state: saved where an optimizer update was {per} global batches (world "
                                 f"size x accumulation), here {planner.opts.batches_per_update}; the mixing schedule "
                                 f"counts updates, so this loader resumes it only with the same count. The core "
                                 f"iterator's get_state()/set_state() resume a schedule on any world size")
        if consumed and not it.has_batch(0, base=consumed - 1):
            raise ValueError(f"{self.what} state: consumed={consumed} is past the end of epoch {epoch}, which has "
                             f"{it.steps_after(0) * it.batches_per_step if self.is_lm else it.planner.num_batches(epoch)}"
                             f" global batches")
        return epoch, consumed

    def ledger(self, epoch: int, consumed: int, prefix: str = "ledger") -> dict:
        """The run's ledger (``babelfeed.ledger``) at this position: what every rank together has consumed, per
        stream, since training began (a translation config; earlier epochs are counted from their plan)."""
        it = self.iterator(epoch)
        if not hasattr(it, "ledger_totals"):
            raise TypeError("an LM iterator keeps no ledger: its consumed_samples and the blend give the counts")
        e, totals, _ = it.ledger_totals(epoch, consumed)
        return it.ledger(prefix, at=(e, totals, None))

