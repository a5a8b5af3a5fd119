import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from babelfeed.gather.transforms import (NoiseContext, Ragged, apply, insert_tokens, local_reorder, span_mask, token_drop,
                               token_replace)
from babelfeed.errors import ConfigError

MASK = 9999
sentences = st.lists(st.lists(st.integers(10, 500), min_size=0, max_size=30), min_size=1, max_size=12)


def batch_of(bodies):
    # [lang token] + body + [</s>=2], as the pipeline builds sentences
    return Ragged.from_lists([[7] + b + [2] for b in bodies])


def ctx_for(n, epoch=1, seed=0):
    return NoiseContext(seed=seed, epoch=epoch, ids=np.arange(100, 100 + n), protect_prefix=1)


ALL = [
    ("token_drop", dict(rate=0.3)),
    ("token_replace", dict(rate=0.3, low=600, high=700)),
    ("insert_tokens", dict(rate=0.3, low=600, high=700)),
    ("local_reorder", dict(k=3)),
    ("span_mask", dict(ratio=0.3, mask_id=MASK)),
    ("span_mask", dict(ratio=0.3, mask_id=MASK, infill=False)),
]


@settings(max_examples=100, deadline=None)
@given(sentences, st.integers(0, len(ALL) - 1))
def test_protected_tokens_survive_and_noise_is_per_sample(bodies, which):
    name, params = ALL[which]
    batch = batch_of(bodies)
    out = apply(batch, ctx_for(len(bodies)), [(name, params)]).to_lists()
    assert all(s[0] == 7 and s[-1] == 2 and 2 not in s[1:-1] for s in out)
    # a sample's noise depends on its id, not on its neighbours in the batch
    alone = apply(batch_of(bodies[-1:]), NoiseContext(0, 1, np.array([100 + len(bodies) - 1])), [(name, params)])
    assert alone.to_lists()[0] == out[-1]
    again = apply(batch, ctx_for(len(bodies)), [(name, params)]).to_lists()
    assert again == out  # deterministic: a resumed run sees the same noise


@settings(max_examples=100, deadline=None)
@given(sentences, st.integers(1, 5))
def test_local_reorder_moves_no_token_more_than_k(bodies, k):
    # distinct tokens so that positions can be traced
    bodies = [[1000 + 100 * i + j for j in range(len(b))] for i, b in enumerate(bodies)]
    out = local_reorder(batch_of(bodies), ctx_for(len(bodies)), k).to_lists()
    for body, s in zip(bodies, out):
        got = s[1:-1]
        assert sorted(got) == sorted(body)
        assert all(abs(got.index(t) - i) <= k for i, t in enumerate(body))


def test_rates_and_invariants_on_a_large_batch():
    rng = np.random.default_rng(0)
    bodies = [rng.integers(10, 500, 40).tolist() for _ in range(500)]
    batch, ctx = batch_of(bodies), ctx_for(500)
    body_tokens = 500 * 40
    dropped = token_drop(batch, ctx, 0.2)
    assert abs((batch.lengths.sum() - dropped.lengths.sum()) / body_tokens - 0.2) < 0.02
    for b, s in zip(bodies, dropped.to_lists()):  # what survives keeps its order
        it = iter(b)
        assert all(t in it for t in s[1:-1])
    replaced = token_replace(batch, ctx, 0.1, 600, 700)
    hits = (replaced.tokens != batch.tokens)
    assert abs(hits.sum() / body_tokens - 0.1) < 0.01 and ((replaced.tokens[hits] >= 600) & (replaced.tokens[hits] < 700)).all()
    inserted = insert_tokens(batch, ctx, 0.1, 600, 700)
    assert abs((inserted.lengths.sum() - batch.lengths.sum()) / body_tokens - 0.1) < 0.01
    masked = span_mask(batch, ctx, 0.3, MASK, infill=False)
    assert abs((masked.tokens == MASK).sum() / body_tokens - 0.3) < 0.06  # BART masks about 30%
    infilled = span_mask(batch, ctx, 0.3, MASK)
    spans = (infilled.tokens == MASK).sum()
    assert spans < (masked.tokens == MASK).sum() and infilled.lengths.sum() < batch.lengths.sum()
    other_epoch = token_drop(batch, ctx_for(500, epoch=2), 0.2)
    assert other_epoch.to_lists() != dropped.to_lists()  # fresh noise every epoch


def test_unknown_transform():
    with pytest.raises(ConfigError, match="unknown transform"):
        apply(batch_of([[5]]), ctx_for(1), [("shuffle_everything", {})])


def test_parse_steps_and_preview_command(tmp_path):
    import subprocess
    import sys

    import babelfeed
    from babelfeed.gather.transforms import parse_steps
    from synthetic import make_data_bin

    d = babelfeed.Dictionary()
    d.add_symbol("<mask>")
    steps = parse_steps("token_drop:rate=0.1; local_reorder:k=3;span_mask:ratio=0.3,mask_id=<mask>", d)
    assert steps == [("token_drop", {"rate": 0.1}), ("local_reorder", {"k": 3}),
                     ("span_mask", {"ratio": 0.3, "mask_id": d.index("<mask>")})]
    for bad, match in (("shuffle:x=1", "unknown transform"), ("token_drop:rate", "name=value"),
                       ("span_mask:mask_id=<nope>", "neither a token id")):
        with pytest.raises(ConfigError, match=match):
            parse_steps(bad, d)
    make_data_bin(tmp_path)
    repo = __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-m", "babelfeed.cli", "preview", "--config=configs/nllb_like.py",
                          f"--config.data.path={tmp_path}", "--task", "aaa-bbb", "-n", "3",
                          "--transforms", "token_drop:rate=0.5;local_reorder:k=2"],
                         capture_output=True, text=True, cwd=repo)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("original") == 3 and "token_drop {'rate': 0.5}" in out.stdout
    assert "__aaa__" in out.stdout and "</s>" in out.stdout
