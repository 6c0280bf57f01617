"""DP-SGD's noise, exact and where the gradient lives: dpkit's lattice noise against torch.randn.

DP-SGD adds Gaussian noise σ·C to every coordinate of the clipped gradient sum. The noise most
libraries add is float32 ``torch.randn`` (``torch.normal``): Box–Muller on 24-bit uniforms, whose
tail stops at √(2·ln 2^24) ≈ 5.77σ. A Gaussian cut at 5.77σ is not the Gaussian mechanism: an
output beyond one neighbour's cut-off but inside the other's has infinite privacy loss, an event no
accountant counts. Floating-point noise is also open to Mironov's (2012) attack on the low bits.

dpkit's default (``noise="lattice"``) releases g·(round(S/g) + Y): the clipped sum snapped to a
2^k lattice plus *exact* discrete Gaussian integers Y, drawn with ChaCha20 words keyed from the
operating system — on the gradient's own device, so the sum never leaves it (on CPU tensors, one
compiled loop; on accelerators, torch operations). This script:

1. draws the release of a 203,530-coordinate gradient (an MLP 784-256-10) with the torch
   operations accelerators run and with the numpy path from one seeded ChaCha20 stream, and
   checks they are identical draw for draw;
2. checks the release lies on the lattice and its noise has standard deviation σ·C;
3. shows the float32 ``torch.randn`` cut-off: the largest |z| in 10^9 draws and how many lie
   beyond 5.77σ, against the number a true Gaussian puts there (about 8);
4. times the exact release (the default: the compiled CPU loop here) against float32
   ``torch.randn`` of the same size.

Run:  .venv/bin/python examples/dpsgd_exact_noise.py [--seed N]   (about twenty seconds on 2 cores)
"""

import argparse
import dataclasses
import math
import time

import numpy as np
import torch
from scipy import stats

from dpkit.noise.bernoulli_exp import CHUNK
from dpkit.torch.chacha import ChaChaStream
from dpkit.torch.noise import LatticeNoise

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0, help="seed of the ChaCha20 stream (reproducible, NOT secure)")
args = parser.parse_args()

SIZE, SIGMA, CLIP = 203_530, 1.0, 1.0
flat = torch.zeros(SIZE, dtype=torch.float64)  # a clipped sum of 0: what is released is the noise

# 1. The torch-operation path (what accelerators run) and the numpy path read one stream and
#    release the same values.
device = dataclasses.replace(
    LatticeNoise.plan(noise_multiplier=SIGMA, max_grad_norm=CLIP, size=SIZE, max_batch=256),
    sampler="torch",
    chunk=CHUNK,
)
host = LatticeNoise.plan(noise_multiplier=SIGMA, max_grad_norm=CLIP, size=SIZE, max_batch=256, sampler="host")
on_device = device.release(flat.clone(), ChaChaStream.keyed(np.random.default_rng(args.seed)))
on_host = host.release(flat.clone(), ChaChaStream.keyed(np.random.default_rng(args.seed)))
assert torch.equal(on_device, on_host), "the two samplers must agree draw for draw"
print(f"1. torch-operation and numpy samplers, one ChaCha20 stream: {SIZE:,} identical values")

# 2. On the lattice, with the calibrated standard deviation.
g = device.lattice.granularity
steps = on_device / g
assert torch.equal(steps, steps.round()), "every released value is a lattice point"
sd = float(on_device.std())
print(f"2. lattice g = 2^{int(math.log2(g))}; noise std {sd:.4f} (σ·C = {SIGMA * CLIP}, plan {device.std:.6f})")

# 3. float32 torch.randn stops at 5.77σ.
gen = torch.Generator().manual_seed(args.seed)
DRAWS, BLOCK = 1_000_000_000, 20_000_000
largest, beyond = 0.0, 0
for _ in range(DRAWS // BLOCK):
    z = torch.randn(BLOCK, generator=gen).abs_()
    largest = max(largest, float(z.max()))
    beyond += int((z > 5.77).sum())
expected = DRAWS * 2 * stats.norm.sf(5.77)
print(
    f"3. float32 torch.randn, 10^9 draws: largest |z| = {largest:.3f}, {beyond} beyond 5.77σ "
    f"(a Gaussian puts {expected:.1f} there: none is a {math.exp(-expected):.0e} event)"
)


# 4. Speed, best of five.
def best(f, n=5):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


secure = LatticeNoise.plan(noise_multiplier=SIGMA, max_grad_norm=CLIP, size=SIZE, max_batch=256)
t_exact = best(lambda: secure.release(flat.clone(), None))  # keyed from the operating system
t_randn = best(lambda: torch.randn(SIZE))
print(
    f"4. {SIZE:,} values: exact lattice release {t_exact * 1e3:.1f} ms, float32 torch.randn {t_randn * 1e3:.2f} ms "
    f"({t_randn / t_exact:.2f}× its throughput)"
)
