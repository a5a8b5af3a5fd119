import numpy as np
import pytest

from babelfeed.plan.schedule import MixingSchedule, update_of
from babelfeed.errors import ConfigError


def test_step_schedule_is_piecewise_constant():
    s = MixingSchedule(boundaries=(100, 300), weights=((1, 0), (1, 1), (0, 1)))
    assert s.weights_at(0).tolist() == [1.0, 0.0] and s.weights_at(99.9).tolist() == [1.0, 0.0]
    assert s.weights_at(100).tolist() == [0.5, 0.5] and s.weights_at(299).tolist() == [0.5, 0.5]
    assert s.weights_at(300).tolist() == [0.0, 1.0] and s.weights_at(10**9).tolist() == [0.0, 1.0]


def test_linear_schedule_interpolates_between_anchors():
    s = MixingSchedule(boundaries=(100, 300), weights=((1, 0), (1, 1), (0, 1)), mode="linear")
    assert s.weights_at(0).tolist() == [1.0, 0.0]
    assert np.allclose(s.weights_at(50), np.array([1, 0.5]) / 1.5)
    assert np.allclose(s.weights_at(100), [0.5, 0.5]) and np.allclose(s.weights_at(200), np.array([0.5, 1]) / 1.5)
    assert np.allclose(s.weights_at(300), [0, 1]) and np.allclose(s.weights_at(5000), [0, 1])


def test_updates_account_for_ranks_and_accumulation():
    # 8 ranks x 4 accumulation steps: one update per 32 global batches (one batch per rank per pass)
    assert update_of(32 * 10, world_size=8, accumulation=4) == 10
    assert update_of(40, world_size=8, accumulation=4, split="rows") == 10  # rows: one global batch per pass
    s = MixingSchedule((40_000,), ((1, 0), (0, 1)))
    for world, accum in ((1, 1), (8, 2), (64, 1)):  # the boundary is the same point of training for any split
        assert s.weights_at(update_of(40_000 * world * accum - 1, world, accum))[0] == 1.0
        assert s.weights_at(update_of(40_000 * world * accum, world, accum))[1] == 1.0


@pytest.mark.parametrize("kw,match", [
    (dict(boundaries=(10, 5), weights=((1,), (1,), (1,))), "strictly increasing"),
    (dict(boundaries=(10,), weights=((1, 1),)), "needs 2 weight lists"),
    (dict(boundaries=(10,), weights=((1, 1), (1,))), "same tasks"),
    (dict(boundaries=(), weights=((0, 0),)), "not all 0"),
    (dict(boundaries=(), weights=((1,),), mode="cosine"), "mode"),
])
def test_invalid_schedules(kw, match):
    with pytest.raises(ConfigError, match=match):
        MixingSchedule(**kw)
