"""Hugging Face: the HF view of a batch feeds a seq2seq model (a tiny BART built from a config, no download),
masked rows and epoch-padding batches add nothing to the loss, and Seq2SeqTrainer trains on babelfeed batches."""

import numpy as np
import pytest

import babelfeed
from babelfeed.adapters.hf_view import IGNORE, HFView
from synthetic import config_for, make_data_bin
from babelfeed.errors import ConfigError, UsageError

transformers = pytest.importorskip("transformers", reason="transformers is in the test extra: make test has it")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("hfbin")
    make_data_bin(r)
    return r


def _batches(root, **overrides):
    cfg = config_for(root, **overrides)
    # world size 3: the epoch's last step is completed with fully masked (epoch-padding) batches
    out = []
    for rank in range(3):
        out += list(babelfeed.build_train_iterator(cfg, rank=rank, world_size=3))
    return out


def _tiny_bart(vocab: int):
    config = transformers.BartConfig(vocab_size=vocab, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=256, pad_token_id=1,
                                     bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    torch.manual_seed(0)
    return transformers.BartForConditionalGeneration(config)


def test_the_view_moves_padding_right_and_masks_what_must_not_count(root):
    pad = babelfeed.ShardedCorpus(root).dictionary().pad()
    view = HFView(pad, loss_scale=True)
    batches = _batches(root, batching__num_shapes=2)  # static shapes: masked rows inside real batches too
    kinds = set()
    for b in batches:
        v = view(b)
        assert set(v) == {"input_ids", "attention_mask", "decoder_input_ids", "labels", "loss_scale"}
        src, weight = b["net_input"]["src_tokens"], b["weight"]
        for row, ids, mask in zip(src, v["input_ids"], v["attention_mask"]):
            tokens = row[row != pad]
            assert ids[:len(tokens)].tolist() == tokens.tolist() and (ids[len(tokens):] == pad).all()
            assert mask.tolist() == [1] * len(tokens) + [0] * (len(row) - len(tokens))
        assert (v["decoder_input_ids"] == b["net_input"]["prev_output_tokens"]).all()
        tgt = b["target"]
        if (weight > 0).any():
            kinds.add("masked rows" if (weight == 0).any() else "real")
            want = np.where((tgt == pad) | (weight[:, None] <= 0), IGNORE, tgt)
            assert v["loss_scale"] == 1.0
        else:  # an epoch-padding batch: labels kept (a loss over no token is NaN), scaled to nothing
            kinds.add("padding batch")
            want = np.where(tgt == pad, IGNORE, tgt)
            assert v["loss_scale"] == 0.0
        assert (v["labels"] == want).all()
        assert all(v[k].dtype == np.int64 for k in ("input_ids", "attention_mask", "decoder_input_ids", "labels"))
    assert kinds == {"real", "masked rows", "padding batch"}, kinds


def test_a_seq2seq_model_takes_the_view_and_masked_rows_change_nothing(root):
    d = babelfeed.ShardedCorpus(root).dictionary()
    model = _tiny_bart(len(d)).eval()
    b = next(iter(babelfeed.build_train_iterator(config_for(root))))
    v = {k: torch.from_numpy(x) for k, x in HFView(d.pad())(b).items()}
    with torch.no_grad():
        loss = model(**v).loss
        assert torch.isfinite(loss) and 0.5 * np.log(len(d)) < loss < 2 * np.log(len(d))
        # a copy of the batch with a masked duplicate row: the same loss
        dup = dict(b, weight=np.concatenate([b["weight"], [0.0]]), target=np.concatenate([b["target"], b["target"][:1]]))
        dup["net_input"] = {k: np.concatenate([x, x[:1]]) for k, x in b["net_input"].items()}
        v2 = {k: torch.from_numpy(x) for k, x in HFView(d.pad())(dup).items()}
        assert torch.allclose(model(**v2).loss, loss, atol=1e-6)


def test_seq2seq_trainer_trains_on_babelfeed_batches(root, tmp_path):
    from babelfeed.adapters.hf import Seq2SeqTrainer

    d = babelfeed.ShardedCorpus(root).dictionary()
    args = transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), max_steps=12, learning_rate=3e-3,
                                                 logging_steps=1, report_to=[], use_cpu=True, save_strategy="no")
    model = _tiny_bart(len(d))
    trainer = Seq2SeqTrainer(model=model, args=args, babelfeed_config=config_for(root))
    loader = trainer.get_train_dataloader()
    assert len(loader) == len(babelfeed.build_train_iterator(config_for(root)))
    probe = [{k: torch.from_numpy(x) for k, x in HFView(d.pad())(b).items()}  # the loss on fixed batches
             for b in list(babelfeed.build_train_iterator(config_for(root)))[:12]]

    def probe_loss():
        model.eval()
        with torch.no_grad():
            out = float(np.mean([model(**v).loss.item() for v in probe]))
        model.train()
        return out

    before = probe_loss()
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert trainer.state.global_step == 12 and len(losses) == 12 and np.isfinite(losses).all()
    # (a logged loss depends on its batch's direction and lengths; the same batches before and after do not)
    assert probe_loss() < before - 0.05, (before, losses)
    assert np.isfinite(result.training_loss)
    # the speed metrics count the rows and target tokens the model got, not the Trainer's batch size of 8 a batch
    served = list(babelfeed.build_train_iterator(config_for(root)))[:12]
    rows = sum(int((b["weight"] > 0).sum()) for b in served)
    tokens = sum(int(b["ntokens"]) for b in served)
    runtime = result.metrics["train_runtime"]
    assert rows > 12 * 8 * 1.5, "the batches hold more rows than the Trainer's batch size would say"
    assert result.metrics["train_samples_per_second"] * runtime == pytest.approx(rows, rel=0.02, abs=1)
    assert result.metrics["train_tokens_per_second"] * runtime == pytest.approx(tokens, rel=0.02, abs=1)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["samples_per_second"] > 0 and h["tokens_per_second"] > h["samples_per_second"] for h in logged)
    # an epoch-padding batch adds nothing: the loss the Trainer gets is 0, not NaN
    b = next(iter(babelfeed.build_train_iterator(config_for(root))))
    v = HFView(d.pad(), loss_scale=True)(dict(b, weight=np.zeros_like(b["weight"])))
    inputs = {k: torch.as_tensor(x) for k, x in v.items()}
    assert trainer.compute_loss(trainer.model, inputs).item() == 0.0


def test_gradient_accumulation_gives_the_mean_of_the_micro_batches_losses(root, tmp_path):
    """With gradient_accumulation_steps=2 the loss of a step (what is logged and what gradients come from) is the
    mean of its two micro-batches' losses, as with one batch a step, not their sum (the Trainer divides only
    when it believes the model normalised the loss itself)."""
    from babelfeed.adapters.hf import Seq2SeqTrainer

    d = babelfeed.ShardedCorpus(root).dictionary()

    def losses(ga, steps):
        args = transformers.Seq2SeqTrainingArguments(
            output_dir=str(tmp_path / f"ga{ga}"), max_steps=steps, learning_rate=0.0, logging_steps=1,
            report_to=[], use_cpu=True, save_strategy="no", gradient_accumulation_steps=ga)
        trainer = Seq2SeqTrainer(model=_tiny_bart(len(d)), args=args, babelfeed_config=config_for(root))
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    one = losses(1, 4)  # learning rate 0: the model does not move, so each batch's loss is fixed
    two = losses(2, 2)
    assert len(one) == 4 and len(two) == 2
    assert two == pytest.approx([(one[0] + one[1]) / 2, (one[2] + one[3]) / 2], rel=1e-4), (one, two)


def test_the_trainer_takes_the_demo_config_and_refuses_an_lm_config_by_name(root, tmp_path):
    import os

    from babelfeed.adapters.hf import Seq2SeqTrainer

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    d = babelfeed.ShardedCorpus(root).dictionary()
    args = transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "o"), max_steps=1, report_to=[],
                                                 use_cpu=True, save_strategy="no")
    demo = babelfeed.load_config(os.path.join(here, "configs", "demo.py"))
    demo.unlock()
    demo.train = config_for(root)
    trainer = Seq2SeqTrainer(model=_tiny_bart(len(d)), args=args, babelfeed_config=demo)
    assert len(trainer.get_train_dataloader()) == len(babelfeed.build_train_iterator(config_for(root)))
    lm = babelfeed.load_config(os.path.join(here, "configs", "lm_packing.py"))
    with pytest.raises(ConfigError, match="language-model config"):
        Seq2SeqTrainer(model=_tiny_bart(len(d)), args=args, babelfeed_config=lm)
    with pytest.raises(UsageError, match="an LM batch"):
        HFView(1)({"tokens": np.zeros((2, 3)), "labels": np.zeros((2, 3))})


def test_every_trainer_checkpoint_holds_the_data_state_any_adapter_and_trace_take(root, tmp_path):
    """checkpoint-N/babelfeed_state.json is the state of the run after N optimizer steps (accumulation 2: 2N
    batches): the in-process iterator's state there, which resumes to the batches the Trainer trains on next."""
    import json

    from babelfeed.adapters.hf import STATE_FILE, Seq2SeqTrainer
    from babelfeed.iterators.state import find_state

    d = babelfeed.ShardedCorpus(root).dictionary()
    args = transformers.Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, learning_rate=1e-3, report_to=[], use_cpu=True,
        save_strategy="steps", save_steps=3, gradient_accumulation_steps=2)
    trainer = Seq2SeqTrainer(model=_tiny_bart(len(d)), args=args, babelfeed_config=config_for(root))
    trainer.train()
    for step in (3, 6):
        with open(tmp_path / "out" / f"checkpoint-{step}" / STATE_FILE) as f:
            saved = json.load(f)
        it = babelfeed.build_train_iterator(config_for(root))
        for _ in range(2 * step):
            next(it)
        assert find_state(saved) == saved and saved == json.loads(json.dumps(it.get_state())), step
        fresh = babelfeed.build_train_iterator(config_for(root))
        fresh.set_state(saved)
        assert np.array_equal(next(fresh)["id"], next(it)["id"])


def test_the_trainer_resumes_its_data_from_the_checkpoint_and_takes_an_edited_mixture(root, tmp_path):
    """train(resume_from_checkpoint=...) goes on from the checkpoint's data state (no replay), and with an edited
    config and mixture_change="allow" it trains on the edited run's batches from the next step on."""
    import warnings

    from babelfeed.adapters.hf import Seq2SeqTrainer
    from babelfeed.errors import Notice

    d = babelfeed.ShardedCorpus(root).dictionary()
    first, edited = config_for(root), config_for(root, data__directions="aaa-bbb,aaa-ddd", mixing__temperature=1.0)

    def trainer(config, steps, **kw):
        args = transformers.Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), max_steps=steps,
                                                     learning_rate=1e-3, report_to=[], use_cpu=True,
                                                     save_strategy="steps", save_steps=2)
        t = Seq2SeqTrainer(model=_tiny_bart(len(d)), args=args, babelfeed_config=config, **kw)
        seen = []
        loss = t.compute_loss

        def recording(model, inputs, *a, **k):
            seen.append(inputs["labels"].numpy().copy())
            return loss(model, inputs, *a, **k)

        t.compute_loss = recording
        return t, seen

    t, _ = trainer(first, 2)
    t.train()
    t, seen = trainer(edited, 5, mixture_change="allow")
    with pytest.warns(Notice, match="mixture edit: from step 3"):
        t.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    it = babelfeed.build_train_iterator(first)
    next(it), next(it)
    want = babelfeed.build_train_iterator(edited)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Notice)
        want.set_state(it.get_state(), mixture_change="allow")
    view = HFView(d.pad(), loss_scale=True)
    expected = [view(next(want))["labels"] for _ in range(3)]
    assert len(seen) == 3 and all(np.array_equal(a, b) for a, b in zip(seen, expected))
