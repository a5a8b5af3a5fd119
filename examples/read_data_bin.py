"""Read a data_bin back to text: the storage API end to end.

    python examples/read_data_bin.py build/demo/data_bin [-n 3]

Lists what the data_bin holds, opens one shard of every direction with ShardedCorpus, and decodes the first
pairs through dict.txt and spm.model, the way a training loop will see them before mixing and batching.
"""

import argparse
import os

import sentencepiece as spm

import babelfeed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data_bin")
    p.add_argument("-n", type=int, default=3, help="pairs to show per direction")
    a = p.parse_args()
    corpus = babelfeed.ShardedCorpus(a.data_bin)
    print(corpus)
    d = corpus.dictionary()
    sp = spm.SentencePieceProcessor(model_file=os.path.join(a.data_bin, "spm.model"))

    def text(tokens) -> str:
        pieces = [d[int(t)] for t in tokens if int(t) != d.eos()]
        return sp.decode_pieces(pieces)

    for direction in corpus.directions("train"):
        src, tgt = corpus.open_pair("train", direction, shard=corpus.shard_ids("train", direction)[0])
        print(f"\n{direction}: {corpus.num_sentences('train', direction):,} pairs in "
              f"{corpus.num_shards('train', direction)} shard(s), {src.dtype} {src.format} files")
        for i in range(min(a.n, len(src))):
            print(f"  [{i}] {text(src[i])}\n      {text(tgt[i])}   ({len(src[i])} -> {len(tgt[i])} tokens)")


if __name__ == "__main__":
    main()
