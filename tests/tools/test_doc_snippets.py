"""The code of README.md and of every page of docs/ runs as written: every ```python block, and every ```bash block
tagged to run, in a fresh process, in a folder holding what the pages' names refer to (a data_bin made by the
README's own `babelfeed binarize` command, Megatron datasets data/web and data/books).

A block preceded by ``<!-- doc-test: skip: REASON -->`` is not run (say why: a placeholder path, a GPU);
``<!-- doc-test: run -->`` runs a bash block; ``<!-- doc-test: run after the bash block above -->`` runs the page's
nearest bash block above first, in the same folder, where a block reads what a command just made (a reader runs
them in turn), and ``<!-- doc-test: run after the python block above -->`` its nearest python block. An untagged bash block fails this test, so every command is
either run or given a reason. The Python blocks share PRELUDE, the names a reader would have in hand at that
point (``rank``, ``lengths``, a ``ds``...), so a block must not depend on another block.
"""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import babelfeed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
PAGES = [README] + sorted(os.path.join(d, f) for d, _, files in os.walk(os.path.join(REPO, "docs")) for f in files
                          if f.endswith(".md"))
BIN = os.path.dirname(sys.executable)

PRELUDE = '''
import numpy as np
import babelfeed
rank, world_size, world, r, w = 0, 1, 1, 0, 1
config = babelfeed.load_config("nllb_like")
config.data.path = "data_bin"
ds = babelfeed.IndexedDataset("data/web")
lengths = ds.sizes
src_len, tgt_len = lengths, np.maximum(lengths * 9 // 10, 2)
flat_tokens = np.random.default_rng(1).integers(4, 200, int(lengths.sum()))
sizes, document_order = ds.sizes, np.random.default_rng(2).permutation(len(ds.doc_idx) - 1)
size, train_iters = 10_000, 8
state = None
def train_step(state, batch):
    return state
'''

WORDS = [f"{a}{b}" for a in "bdfgklmnprstvz" for b in ("a", "e", "i", "o", "u", "an", "el", "ir", "os", "um")]


def _sentences(rng, n):
    return [" ".join(rng.choice(WORDS, int(rng.integers(3, 25)))) for _ in range(n)]


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    raw = root / "raw"
    raw.mkdir()
    rng = np.random.default_rng(0)
    for key, n in (("eng_Latn-tur_Latn", 600), ("eng_Latn-deu_Latn", 300), ("eng_Latn-fra_Latn", 200)):
        for split, m in (("train", n), ("valid", 30)):
            lines = _sentences(rng, m)
            for lang in key.split("-"):
                (raw / f"{split}.{key}.{lang}").write_text("\n".join(lines) + "\n")
    (raw / "train.swh_Latn").write_text("\n".join(_sentences(rng, 300)) + "\n")
    out = subprocess.run([os.path.join(BIN, "babelfeed"), "binarize", "raw", "-o", "data_bin", "--train-spm", "300",
                          "--shards", "2", "--no-progress"], cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    with open(root / "data_bin" / "dict.txt", "a") as f:
        f.write("__bt__ 1\n")  # the tag the tasks section's back-translation prefix uses
    shutil.copytree(raw, root / "data_bin" / "raw")  # the raw-text task reads it relative to data.path
    (root / "data").mkdir()
    for name, docs in (("web", 60), ("books", 20)):
        with babelfeed.IndexedDatasetBuilder(str(root / "data" / name), np.uint16, format="megatron") as b:
            for _ in range(docs):
                for _ in range(int(rng.integers(1, 6))):
                    b.add_item(rng.integers(4, 300, int(rng.integers(20, 250))))
                b.end_document()
            b.finalize()
    return root


AFTER = "run after the bash block above"
AFTER_PY = "run after the python block above"
OUTPUT = "output of the block above"  # a ```text block: what the block above prints (check_output)
OUTPUTS: dict = {}  # where a block is -> the output its page shows


def blocks(path: str) -> list:
    """(where, language, tag, code) of every fenced block of one page, ``where`` as ``docs/x.md:LINE``."""
    name = os.path.relpath(path, REPO)
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while not lines[j].startswith("```"):
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        tag = re.match(r"^<!-- doc-test: (.*?) -->$", lines[k].strip()) if k >= 0 else None
        code = "\n".join(lines[i + 1:j])
        if tag and tag.group(1) in (AFTER, AFTER_PY):
            want = "bash" if tag.group(1) == AFTER else "python"
            above = [c for _, language, _, c in out if language == want]
            assert above, f"{name}:{start + 1}: no {want} block above to run first"
            code = (above[-1], code)
        if tag and tag.group(1) == OUTPUT:
            assert out and out[-1][1] in ("python", "bash"), f"{name}:{start + 1}: no block above whose output it is"
            OUTPUTS[out[-1][0]] = code
        out.append((f"{name}:{start + 1}", lang, tag.group(1) if tag else None, code))
        i = j + 1
    return out


def check_output(line: str, printed: str, shown: str) -> None:
    """The output a page shows is what its block printed: every line, in order; a line ``...`` stands for any
    number of printed lines, and a line ending in ``...`` for any printed line that starts with what precedes it."""
    got = printed.rstrip("\n").split("\n")
    i = 0
    skipping = False
    for want in shown.split("\n"):
        if want.strip() == "...":
            skipping = True
            continue
        prefix = want[:-3] if want.endswith("...") else None
        while i < len(got) and not (got[i] == want or prefix is not None and got[i].startswith(prefix)):
            assert skipping, f"{line}: the page shows\n{want}\nwhere the block printed\n{got[i]}\n--- all:\n{printed}"
            i += 1
        assert i < len(got), f"{line}: the page shows\n{want}\nwhich the block never printed:\n{printed}"
        i += 1
        skipping = False


BLOCKS = [b for page in PAGES for b in blocks(page) if b[1] in ("python", "bash")]


def test_the_pages_have_blocks_to_run():
    assert len(PAGES) >= 15, PAGES
    assert sum(lang == "python" and tag is None for _, lang, tag, _ in BLOCKS) >= 15
    assert sum(tag == "run" for _, _, tag, _ in BLOCKS) >= 5
    readme = blocks(README)
    assert sum(lang == "python" and tag in (None, AFTER) for _, lang, tag, _ in readme) >= 3, \
        "the README's own-data snippets"


@pytest.mark.parametrize("line,lang,tag,code", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_block_runs_as_written(readme_dir, tmp_path, line, lang, tag, code):
    if tag is not None and tag.startswith("skip:"):
        assert len(tag) > len("skip: ") + 5, f"{line}: say why the block is not run"
        pytest.skip(f"{line}: {tag}")
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    if tag in (AFTER, AFTER_PY):  # the block whose output this one reads, run first (as the reader did)
        first, code = code
        if tag == AFTER:
            cmd = ["bash", "-euo", "pipefail", "-c", first]
        else:
            script = tmp_path / "first.py"
            script.write_text(PRELUDE + "\n" + first + "\n")
            cmd = [sys.executable, str(script)]
        out = subprocess.run(cmd, cwd=readme_dir, capture_output=True, text=True, env=env, timeout=600)
        assert out.returncode == 0, f"{line}: the block above failed:\n{first}\n--- {out.stderr[-4000:]}"
        tag = "run"
    if lang == "bash":
        assert tag == "run", (f"{line}: a bash block must be tagged <!-- doc-test: run --> or "
                              f"<!-- doc-test: skip: REASON -->")
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    else:
        assert tag in (None, "run"), f"{line}: unknown tag {tag!r}"
        script = tmp_path / "block.py"
        script.write_text(PRELUDE + "\n# " + line + "\n" + code + "\n")
        cmd = [sys.executable, str(script)]
    out = subprocess.run(cmd, cwd=readme_dir, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, f"{line} failed:\n{code}\n--- stderr:\n{out.stderr[-4000:]}"
    if line in OUTPUTS:
        check_output(line, out.stdout, OUTPUTS[line])
