"""Train a small decoder-only LM in torch on packed rows in the varlen (THD) form: every document of a packed row
attends only to itself, with no padding in the attention.

    python -m babelfeed.examples.torch_varlen --data-path "1 data/web" --vocab-size 32000 [--steps 50]

Batches come from ``BatchLoader(config, transform=Varlen())``: the loader's workers add ``cu_seqlens``,
``max_seqlen`` and ``indices`` to each packed batch (``babelfeed.adapters.varlen``). The model takes the real tokens
only (``x.reshape(rows * width, d)[indices]``). On a GPU with ``flash_attn`` installed, attention is
``flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)``; otherwise (the CPU)
it is ``scaled_dot_product_attention`` under a mask built from ``cu_seqlens`` alone: causal within a segment,
nothing across.
"""

from __future__ import annotations

import argparse
import sys

NAME = "torch_varlen"


def varlen_mask(cu_seqlens, tokens: int):
    """[tokens, tokens] boolean: token i may attend to token j when both lie in one segment and j <= i."""
    import torch

    seg = torch.zeros(tokens, dtype=torch.long)
    seg[cu_seqlens[1:-1].long()] = 1
    seg = torch.cumsum(seg, 0)
    pos = torch.arange(tokens)
    return (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])


def attention(q, k, v, cu_seqlens, max_seqlen: int):
    """Varlen causal attention over [tokens, heads, dim]: FlashAttention on a GPU where installed, else a mask."""
    import torch

    if q.is_cuda:
        try:
            from flash_attn import flash_attn_varlen_func  # optional: a GPU build of FlashAttention
        except ImportError:
            flash_attn_varlen_func = None
        if flash_attn_varlen_func is not None:
            cu = cu_seqlens.to(q.device, torch.int32)
            return flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True)
    mask = varlen_mask(cu_seqlens.cpu(), q.shape[0]).to(q.device)
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                           attn_mask=mask)
    return out.transpose(0, 1)


def build_model(vocab: int, d: int, heads: int, layers: int, max_len: int):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x, cu_seqlens, max_seqlen):
            q, k, v = self.qkv(self.norm1(x)).view(x.shape[0], 3, heads, d // heads).unbind(1)
            x = x + self.out(attention(q, k, v, cu_seqlens, max_seqlen).reshape(x.shape[0], d))
            return x + self.ff(self.norm2(x))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens, positions, cu_seqlens, max_seqlen):
            """``tokens``/``positions``: [tokens] (the real tokens of the batch, THD); positions restart per
            document."""
            x = self.embed(tokens) + self.pos(positions)
            for block in self.blocks:
                x = block(x, cu_seqlens, max_seqlen)
            return self.head(x)

    torch.manual_seed(0)
    return LM()


def train(config, steps: int, d_model: int = 64, heads: int = 4, layers: int = 2, log=print, device=None) -> dict:
    """Train ``steps`` optimizer steps on ``config``'s packed batches; returns the losses and the tokens seen."""
    import torch

    import babelfeed
    from babelfeed.adapters.torch import BatchLoader
    from babelfeed.adapters.varlen import Varlen

    if not config.vocab_size:
        raise babelfeed.UsageError("set the config's vocab_size (the tokenizer's vocabulary): the model's "
                                   "embedding has one row per token id")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loader = BatchLoader(config, transform=Varlen())
    model = opt = None
    losses, tokens = [], 0
    for step, batch in enumerate(loader):
        if step >= steps:
            break
        idx = batch["indices"]
        flat = batch["tokens"].reshape(-1)[idx].to(device)
        labels = batch["labels"].reshape(-1)[idx].to(device)
        weight = batch["loss_mask"].reshape(-1)[idx].to(device)
        positions = batch["positions"].reshape(-1)[idx].long().to(device)
        if model is None:
            model = build_model(config.vocab_size, d_model, heads, layers, config.seq_len).to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        logits = model(flat, positions, batch["cu_seqlens"], int(batch["max_seqlen"]))
        loss = (torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none") * weight).sum() / \
            weight.sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        tokens += int(idx.numel())
        if step % 10 == 0:
            log(f"step {step}: loss {losses[-1]:.3f}, {int(idx.numel()):,} real tokens "
                f"({len(batch['cu_seqlens']) - 1} documents, the longest {int(batch['max_seqlen'])})")
    return {"losses": losses, "tokens": tokens, "device": str(device)}


def main(argv=None) -> int:
    import babelfeed

    p = argparse.ArgumentParser(prog="python -m babelfeed.examples.torch_varlen", description=__doc__.split("\n")[0])
    p.add_argument("--data-path", required=True, help="Megatron's --data-path: '0.3 PREFIX 0.7 PREFIX'")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--vocab-size", type=int, required=True, help="the tokenizer's vocabulary (ids below it)")
    p.add_argument("--cache-dir", default="build/cache")
    args = p.parse_args(argv)
    config = babelfeed.load_config("lm_packing")
    config.data_path, config.mode, config.split = args.data_path, "pack", "100,0,0"
    config.seq_len, config.global_batch = args.seq_len, args.global_batch
    config.num_samples, config.cache_dir = args.global_batch * args.steps, args.cache_dir
    config.vocab_size = args.vocab_size
    result = train(config, args.steps)
    print(f"trained {len(result['losses'])} steps on {result['device']}: loss {result['losses'][0]:.3f} -> "
          f"{result['losses'][-1]:.3f}, {result['tokens']:,} real tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
