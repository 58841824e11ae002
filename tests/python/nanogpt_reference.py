"""nanoGPT's GPT and training loop (karpathy/nanoGPT's model.py and train.py, their semantics
written again here), the reference the GPT example is compared with.

  nanogpt_reference.py init OUT SEED CONFIG_JSON
      torch.manual_seed(SEED), GPT(config): its state_dict saved to OUT/init.pt
  nanogpt_reference.py train OUT SEED CONFIG_JSON DATA_DIR WINDOW_SEED ITERS
      the same model, then ITERS iterations of train.py's loop on DATA_DIR/train.bin: OUT/losses.json
  nanogpt_reference.py bench OUT SEED CONFIG_JSON DATA_DIR WINDOW_SEED ITERS [compile]
      the same loop timed (bench/gpt.sh): one JSON line of tokens per second over the iterations
      after the first 10% (and, with `compile`, the model under torch.compile, its compilation in
      those first ones)

CONFIG_JSON: the model's and the recipe's settings (block_size, vocab_size, n_layer, n_head,
n_embd, dropout, bias, batch_size, learning_rate, min_lr, warmup_iters, lr_decay_iters,
weight_decay, beta1, beta2, grad_clip). The batches are nanoGPT's get_batch (windows of
block_size + 1 tokens at random offsets) with the example's draws in place of torch.randint's:
record r of epoch e of a loader seeded s starts at splitmix64(key + (r + 1) g) * (n - block_size)
>> 64, key = splitmix64(s ^ splitmix64((e + 1) g)), g = 0x9E3779B97F4A7C15 (dettrial's
TokenWindows). The learning rate is train.py's get_lr(it), applied as a LambdaLR applies its
factor (learning_rate * (get_lr(it) / learning_rate)), as the example's scheduler computes it.
Exits 77 (skipped) without torch or NumPy.
"""
import json
import math
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn as nn
    from torch.nn import functional as F
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


class LayerNorm(nn.Module):
    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        self.attn_dropout = nn.Dropout(c["dropout"])
        self.resid_dropout = nn.Dropout(c["dropout"])
        self.n_head, self.n_embd, self.dropout = c["n_head"], c["n_embd"], c["dropout"]
        self.flash = hasattr(F, "scaled_dot_product_attention")
        if not self.flash:
            t = c["block_size"]
            self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = self.attn_dropout(F.softmax(att, dim=-1)) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])
        self.dropout = nn.Dropout(c["dropout"])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["n_embd"], c["bias"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["n_embd"], c["bias"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]), wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            drop=nn.Dropout(c["dropout"]), h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=LayerNorm(c["n_embd"], c["bias"])))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c["n_layer"]))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)  # fused only on CUDA, as nanoGPT


MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def mix64(x):
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def window_offset(record, epoch, seed, tokens, block_size):
    key = mix64(seed ^ mix64(((epoch + 1) * GAMMA) & MASK))
    draw = mix64((key + (record + 1) * GAMMA) & MASK)
    return (draw * (tokens - block_size)) >> 64


def get_lr(it, c):
    if it < c["warmup_iters"]:
        return c["learning_rate"] * (it + 1) / (c["warmup_iters"] + 1)
    if it > c["lr_decay_iters"]:
        return c["min_lr"]
    ratio = (it - c["warmup_iters"]) / (c["lr_decay_iters"] - c["warmup_iters"])
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (c["learning_rate"] - c["min_lr"])


def train(out, seed, c, data_dir, window_seed, iters, bench=False, compiled=False):
    import time
    torch.manual_seed(seed)
    model = GPT(c)
    step_model = torch.compile(model) if compiled else model
    optimizer = model.configure_optimizers(c["weight_decay"], c["learning_rate"], (c["beta1"], c["beta2"]))
    data = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint16, mode="r")
    T, B = c["block_size"], c["batch_size"]
    windows = (len(data) - 1) // T  # an epoch's windows (TokenWindows' default for random windows)
    losses = []
    warmup = max(1, iters // 10)
    for it in range(iters):
        if it == warmup:
            start = time.perf_counter()
        lr = c["learning_rate"] * (get_lr(it, c) / c["learning_rate"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        records = [it * B + i for i in range(B)]
        offsets = [window_offset(r % windows, r // windows, window_seed, len(data), T) for r in records]
        x = torch.stack([torch.from_numpy(data[o:o + T].astype(np.int64)) for o in offsets])
        y = torch.stack([torch.from_numpy(data[o + 1:o + 1 + T].astype(np.int64)) for o in offsets])
        _, loss = step_model(x, y)
        loss.backward()
        if c["grad_clip"] != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    if bench:
        seconds = time.perf_counter() - start
        print(json.dumps({"tokens_per_second": (iters - warmup) * B * T / seconds, "iterations": iters - warmup, "seconds": seconds,
                          "compiled": compiled, "threads": torch.get_num_threads(), "torch": torch.__version__,
                          "last_loss": losses[-1]}))
        return
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump({"losses": losses, "torch": torch.__version__}, f)
    print(f"ok: {iters} iterations of nanoGPT's loop, loss {losses[0]:.4f} to {losses[-1]:.4f}")


if __name__ == "__main__":
    mode, out, seed, config = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    os.makedirs(out, exist_ok=True)
    if mode != "bench":
        torch.set_num_threads(1)  # one thread: the same sums as the example's one-thread test
    if mode == "init":
        torch.manual_seed(seed)
        torch.save(GPT(config).state_dict(), os.path.join(out, "init.pt"))
        print("ok: nanoGPT's GPT after torch.manual_seed")
    elif mode == "bench":
        torch.set_num_threads(int(os.environ.get("NANOGPT_THREADS", torch.get_num_threads())))
        train(out, seed, config, sys.argv[5], int(sys.argv[6]), int(sys.argv[7]), bench=True, compiled=len(sys.argv) > 8 and sys.argv[8] == "compile")
    else:
        train(out, seed, config, sys.argv[5], int(sys.argv[6]), int(sys.argv[7]))
