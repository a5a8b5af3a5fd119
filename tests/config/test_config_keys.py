"""A key a config file sets that babelfeed does not know is refused with the closest keys (``--set`` already
was): a typo such as ``batching.max_token`` left ``max_tokens`` at its default, silently. Sections of the user's
own (``model``) and task names stay free."""

import os

import ml_collections
import pytest

import babelfeed
from babelfeed.config.spec import check_known_keys
from babelfeed.tools.cli import main
from synthetic import config_for, make_data_bin

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("keys")
    make_data_bin(r)
    return r


def unlocked(cfg):
    return ml_collections.ConfigDict(cfg.to_dict())  # what a config file of the user's own builds


@pytest.mark.parametrize("section,key,near", [("batching", "max_token", "batching.max_tokens"),
                                              ("mixing", "temprature", "mixing.temperature"),
                                              ("data", "shard", "data.shards"),
                                              ("filter", "max_source_position", "filter.max_source_positions")])
def test_a_misspelt_key_in_a_config_file_is_refused_with_the_closest(root, section, key, near):
    cfg = unlocked(config_for(root))
    cfg[section][key] = 1
    with pytest.raises(babelfeed.ConfigError, match=f"{section}.{key} is not a babelfeed config key; did you mean "
                                                    f"{near}"):
        babelfeed.build_train_iterator(cfg)


def test_the_schedule_and_the_command_line_are_checked_too(root, tmp_path, capsys):
    cfg = unlocked(config_for(root))
    cfg.mixing.schedule.boundary = "10"
    with pytest.raises(babelfeed.ConfigError, match="mixing.schedule.boundary .*did you mean mixing.schedule.boundaries"):
        babelfeed.build_train_iterator(cfg)
    text = open(os.path.join(REPO, "configs", "nllb_like.py")).read()
    assert "    c.batching.max_tokens = 4096" in text
    path = tmp_path / "mine.py"
    path.write_text(text.replace("    c.batching.max_tokens = 4096", "    c.batching.max_token = 2048")
                    .replace('c.data.path = "build/demo/data_bin"', f'c.data.path = "{root}"'))
    assert main(["plan", str(path)]) == 2
    assert "batching.max_token is not a babelfeed config key; did you mean batching.max_tokens?" in \
        capsys.readouterr().err


def test_sections_of_ones_own_and_task_names_are_free(root):
    cfg = unlocked(config_for(root))
    cfg.model = ml_collections.ConfigDict({"d_model": 512})
    cfg.optimizer_lr = 1e-3
    check_known_keys(cfg)
    babelfeed.build_train_iterator(cfg)
    cfg.sed = 3  # one letter from seed: a typo, not a section of one's own
    with pytest.raises(babelfeed.ConfigError, match="sed is not a babelfeed config key; did you mean seed"):
        check_known_keys(cfg)


def test_an_lm_config_is_checked_against_the_lm_keys():
    cfg = unlocked(babelfeed.load_config("lm_packing"))
    cfg.seq_length = 4096
    with pytest.raises(babelfeed.ConfigError, match="seq_length is not a babelfeed config key; did you mean seq_len"):
        babelfeed.build_iterator(cfg)


def test_a_typo_inside_a_task_entry_is_refused_and_a_plain_entry_takes_the_defaults(root):
    """task() returns an open ConfigDict: `c.tasks.mt.wieght = 0.1` planned with the weight at 1.0, and a plain
    ConfigDict entry without `kind` failed with error "'kind'" (found by a review)."""
    from babelfeed.config import task
    from babelfeed.config.spec import TASK_KEYS

    import inspect
    assert tuple(inspect.signature(task).parameters) == TASK_KEYS and set(task("x").keys()) == set(TASK_KEYS)
    cfg = unlocked(config_for(root))
    cfg.tasks = ml_collections.ConfigDict()
    cfg.tasks.mt = task(corpora="aaa-bbb")
    cfg.tasks.mt.wieght = 0.1
    with pytest.raises(babelfeed.ConfigError, match=r"tasks\.mt\.wieght is not a task key; did you mean tasks\.mt\.weight"):
        babelfeed.build_train_iterator(cfg)
    del cfg.tasks.mt["wieght"]
    cfg.tasks.rest = ml_collections.ConfigDict({"corpora": "aaa-ccc", "weight": 2.0})  # no kind, no prefixes
    it = babelfeed.build_train_iterator(cfg)
    next(it)
    assert {"ledger/mt/aaa-bbb/samples", "ledger/rest/aaa-ccc/samples"} <= set(it.ledger())
    cfg.tasks.bad = ml_collections.ConfigDict({"weight": 1.0})
    with pytest.raises(babelfeed.ConfigError, match=r"tasks\.bad names no corpora"):
        babelfeed.build_train_iterator(cfg)
