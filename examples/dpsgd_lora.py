"""Private LoRA fine-tuning: a tiny GPT-2 pretrained on public text adapts to private text with DP-SGD.

The usual recipe for DP on language models (Yu et al. 2022, "Differentially private fine-tuning
of language models"; Li et al. 2022): pretrain without privacy on public data, then fine-tune
on the private data with DP-SGD, training only a few parameters — here LoRA adapters from
``peft`` (Hu et al. 2022) on GPT-2's attention and MLP projections. Only the adapters are
trainable (requires_grad=True), so only they are clipped and noised: the frozen base weights
get no gradient, no noise and no optimizer state, and stay bit-identical; the noise, and hence
the error it adds, grows with the number of trained parameters, not the model's size. The
accounting is as for any model: ε depends on σ, the steps and the sample rate only.

Data: generated token sequences from two Markov chains over 64 tokens in which each token has 4
successors (best possible next-token loss ln 4 ≈ 1.39 nats). The public chain and the private
one share half of their transitions; the base model is pretrained on 3,000 public sequences,
then fine-tuned at ε = 4, δ = 1e-5 on 2,000 private ones. Held-out loss on private-style text
before and after.

Run:  .venv/bin/python examples/dpsgd_lora.py [--seed N]   (about 20 s on 2 cores)
"""

import argparse
import math
import time
import warnings

import numpy as np
import peft
import torch
import transformers
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpkit as dp

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--seed", type=int, help="seed model, batches and DP noise: reproducible, NOT secure (default: OS CSPRNG)"
)
args = parser.parse_args()
torch.set_num_threads(1)  # a 100k-parameter model: one thread is fastest
transformers.logging.set_verbosity_error()
if args.seed is not None:
    torch.manual_seed(args.seed)
rng = None if args.seed is None else np.random.default_rng(args.seed)
t_start = time.perf_counter()

# -- generated data (a fixed public generator: the data are the same for every seed) --------------
VOCAB, SUCCESSORS, LENGTH = 64, 4, 16
gen = np.random.default_rng(0)
public_next = np.stack([gen.choice(VOCAB, SUCCESSORS, replace=False) for _ in range(VOCAB)])
private_next = public_next.copy()
changed = gen.choice(VOCAB, VOCAB // 2, replace=False)  # half the tokens get new successors
private_next[changed] = np.stack([gen.choice(VOCAB, SUCCESSORS, replace=False) for _ in changed])


def sequences(successors: np.ndarray, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = np.zeros((n, LENGTH), dtype=np.int64)
    ids[:, 0] = gen.integers(VOCAB, size=n)
    for t in range(1, LENGTH):
        ids[:, t] = successors[ids[:, t - 1], gen.integers(SUCCESSORS, size=n)]
    return torch.tensor(ids), torch.ones(n, LENGTH, dtype=torch.long)


public = sequences(public_next, 3000)
private_train = sequences(private_next, 2000)
private_test = sequences(private_next, 500)


def per_example_loss(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    per_token = nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    valid = mask[:, 1:].to(per_token.dtype)
    return (per_token * valid).sum(1) / valid.sum(1)


def held_out_loss(model: nn.Module) -> float:
    model.eval()
    with torch.no_grad():
        loss = float(per_example_loss(model, *private_test).mean())
    model.train()
    return loss


# -- non-private pretraining on the public text -----------------------------------------------------
config = transformers.GPT2Config(
    vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
)
base = transformers.GPT2LMHeadModel(config)
opt = torch.optim.Adam(base.parameters(), lr=1e-2)
for _ in range(2):
    for ids, mask in DataLoader(TensorDataset(*public), batch_size=100, shuffle=True):
        opt.zero_grad()
        per_example_loss(base, ids, mask).mean().backward()
        opt.step()
print(
    f"pretrained on public text; held-out loss on private-style text: {held_out_loss(base):.3f} nats "
    f"(best possible ln {SUCCESSORS} = {math.log(SUCCESSORS):.2f}; context ignored ln {VOCAB} = {math.log(VOCAB):.2f})"
)

# -- private LoRA fine-tuning -----------------------------------------------------------------------
lora = peft.LoraConfig(
    r=4, lora_alpha=16, lora_dropout=0.0, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True
)  # fan_in_fan_out: GPT-2's Conv1D stores its weight (in, out)
with warnings.catch_warnings():  # peft asks transformers 5 a question it has renamed
    warnings.simplefilter("ignore", FutureWarning)
    model = peft.get_peft_model(base, lora)
frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
n_total = sum(p.numel() for p in model.parameters())
print(f"LoRA r=4: {n_trainable:,} trainable of {n_total:,} parameters ({100 * n_trainable / n_total:.1f} %)")

EPSILON, DELTA, EPOCHS, BATCH, CLIP = 4.0, 1e-5, 4, 100, 1.0
private = dp.torch.make_private(
    model, torch.optim.Adam(model.parameters(), lr=2e-2), DataLoader(TensorDataset(*private_train), batch_size=BATCH),
    epsilon=EPSILON, delta=DELTA, epochs=EPOCHS, max_grad_norm=CLIP, rng=rng,
)  # fmt: skip
model, optimizer, loader = private
print(
    f"DP-SGD: σ = {optimizer.noise_multiplier:.3f}, q = {optimizer.sample_rate:g}, {EPOCHS} epochs of {len(loader)} "
    f"steps; noise drawn for {optimizer.noise.size:,} values (the trainable ones)"
)
for epoch in range(1, EPOCHS + 1):
    for ids, mask in loader:
        optimizer.zero_grad()
        if len(ids):  # a Poisson batch may be empty; step() then releases noise only
            per_example_loss(model, ids, mask).mean().backward()
        optimizer.step()
    print(f"  epoch {epoch}: held-out loss {held_out_loss(model):.3f}, ε = {optimizer.epsilon:.3f} (δ = {DELTA:g})")

unchanged = all(torch.equal(p, frozen_before[n]) for n, p in model.named_parameters() if n in frozen_before)
print(
    f"\nspent ε = {optimizer.epsilon:.3f} of the target {EPSILON:g} in {optimizer.steps} steps; "
    f"frozen base weights bit-identical: {unchanged}  ({time.perf_counter() - t_start:.0f} s)"
)
