"""DP-SGD benchmark: dpkit.torch against Opacus 1.6 — noise, throughput on CPU, accuracy at equal ε.

Not a test. Run it from the benchmark environment (Opacus is installed only there; the
transformer row needs ``transformers``, which ``pip install transformers`` adds to it):

    .venv-bench/bin/python benchmarks/bench_dpsgd.py [--rounds 25] [--round-seconds 0.2] [--only KEYS]
    .venv-bench/bin/python benchmarks/bench_dpsgd.py --accuracy            # = --only digits,adult

``--only`` takes a comma-separated subset of the groups ``noise, mlp, cnn, transformer`` (the
throughput rows; alias ``throughput``) and ``digits, adult`` (accuracy; alias ``accuracy``). The
results file keeps the rows of the groups not run this time, so one group can be re-measured alone.

(a) Noise throughput: values per second of the noise dpkit's DP-SGD adds to the clipped gradient
    sum, through the public entry point ``dpkit.torch.noise.make_noise(kind, ...).release(flat,
    src)`` with ``src = resolve_rng(None)`` (the CSPRNG) — so the row measures whatever sampler
    make_private uses when it runs — on a flat tensor of 203,530 values (the MLP's parameter
    count) and of 10,000,000 values, in the dtype make_private hands it (the plan's ``dtype``):
    'lattice' (exact discrete Gaussian on a 2^k lattice, make_private's default) and
    'continuous' (Box–Muller on CSPRNG words), against float32 ``torch.randn`` of the same size
    (what Opacus adds); where the lattice plan has a ``sampler`` field, its other samplers get a
    row too (e.g. the numpy "host" sampler beside the torch "device" one). Goal: the default at
    least 0.5× torch.randn.
(b) Training throughput, samples (tokens) per second of *compute only* (forward, backward,
    per-example clipping, noise, optimizer step on one fixed batch of random inputs; no data
    loading, no accounting queries), torch.set_num_threads(2):
    - MLP 784-256-10 and the CNN of Opacus's MNIST example (conv 16@8x8/2 → maxpool → conv
      32@4x4/2 → maxpool → fc 32 → fc 10), batch 256: non-private torch; Opacus in every
      grad-sample mode (hooks, functorch, ew = expanded weights, ghost = fast gradient
      clipping; its default non-secure torch.normal noise); dpkit fast path (ghost clipping /
      book-keeping) and vmap path, each with exact lattice noise (dpkit's default) and with
      continuous noise;
    - a 2-layer GPT-2 from Hugging Face transformers (n_embd 128, 4 heads, vocabulary 1,000),
      random tokens, sequence 64, batch 32, next-token loss, tokens per second: non-private,
      Opacus ghost clipping (its best mode; HF's Conv1D has no Opacus norm sampler and falls
      back to functorch per-example gradients) and dpkit fast path with both noises, on the
      configuration Opacus runs — untied input/output embeddings (its ghost clipping refuses
      tied weights) and position ids passed per example (shape [batch, 64]; with GPT-2's
      [1, 64] ids it fails) — plus Opacus ghost and dpkit (exact noise) on the stock model
      (tied, default position ids), each measured or recording its refusal.
    Configurations run interleaved, ``--rounds`` rounds of about ``--round-seconds`` each, after
    waiting (up to ``--max-wait`` s) for a 1-minute load average below ``--max-load``; the table
    shows the best round (the machine is shared: with 2 intra-op threads a descheduled thread
    stalls every small op, so the best round is the least disturbed one) and the median round.
    Each configuration is built in a try/except: one that is refused or fails reports its
    error text instead of a number, and the run goes on.
(c) Accuracy, median test accuracy of ``--seeds`` seeds at ε ∈ ``--epsilons``, δ = 1e-5, the same
    model and hyperparameters for dpkit (default exact noise) and Opacus, each calibrating σ
    with its own RDP accountant, plus the non-private baseline:
    - scikit-learn's bundled digits (8x8 images, 1,797 examples; 1,297 train / 500 test, fixed
      split), MLP 64-64-10 (tanh), 20 epochs, batch 64, C = 1, SGD lr 1.0 momentum 0.5;
    - UCI Adult (``adult.data`` train / ``adult.test`` test from ``$DPKIT_ADULT`` or
      ``../shared/data/adult``; skipped with a note when absent), encoded by
      ``dpkit.datasets.adult_features`` (public schema only), logistic regression, batch 256,
      C = 1, SGD lr 0.2 momentum 0.9, ``--adult-epochs`` (10) epochs.

Results: ``benchmarks/results/dpsgd.json``, rich tables on stderr and Markdown on stdout.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import inspect
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _report
import _smoke
import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "dpsgd.json"
BATCH = 256
NOISE_SIZES = (203_530, 10_000_000)
THROUGHPUT_GROUPS = ("noise", "mlp", "cnn", "transformer")
ACCURACY_GROUPS = ("digits", "adult")
ALIASES = {"throughput": THROUGHPUT_GROUPS, "accuracy": ACCURACY_GROUPS, "all": THROUGHPUT_GROUPS + ACCURACY_GROUPS}
OPACUS_MODES = ("hooks", "functorch", "ew", "ghost")


def _torch():
    import torch

    return torch


def _err(exc: BaseException, limit: int = 400) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


# ------------------------------------------------------------------------------------------------
# models and training tasks (shared with bench_dpsgd_gpu.py)
# ------------------------------------------------------------------------------------------------


def mlp():
    from torch import nn

    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def mnist_cnn():
    """The model of Opacus's examples/mnist.py (SampleConvNet)."""
    import torch
    from torch import nn

    class SampleConvNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 8, 2, padding=3)
            self.conv2 = nn.Conv2d(16, 32, 4, 2)
            self.fc1 = nn.Linear(32 * 4 * 4, 32)
            self.fc2 = nn.Linear(32, 10)

        def forward(self, x):
            x = torch.relu(self.conv1(x))
            x = torch.max_pool2d(x, 2, 1)
            x = torch.relu(self.conv2(x))
            x = torch.max_pool2d(x, 2, 1)
            x = x.view(-1, 32 * 4 * 4)
            x = torch.relu(self.fc1(x))
            return self.fc2(x)

    return SampleConvNet()


@dataclass
class Task:
    """One model on one fixed batch: ``forward(model)`` gives the output, ``loss(out, crit,
    ghost)`` the loss (``ghost``: ``crit`` is Opacus's ghost-clipping criterion wrapper, which
    needs the [batch, positions, classes] shape of a sequence loss)."""

    key: str
    name: str
    make: Callable[[], Any]
    forward: Callable[[Any], Any]
    loss: Callable[[Any, Any, bool], Any]
    batch: int
    items: int  # samples or tokens per step
    unit: str  # "samples/s" or "tokens/s"
    note: str = ""


def classifier_task(
    key: str,
    name: str,
    make: Callable[[], Any],
    shape: tuple[int, ...],
    batch: int = BATCH,
    classes: int = 10,
    device: str = "cpu",
    note: str = "",
) -> Task:
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *shape, generator=g).to(device)
    y = torch.randint(0, classes, (batch,), generator=g).to(device)
    return Task(
        key,
        name,
        lambda: make().to(device),
        lambda m: m(x),
        lambda out, crit, ghost: crit(out, y),
        batch,
        batch,
        "samples/s",
        note,
    )


def gpt2_task(
    key: str,
    name: str,
    *,
    n_layer: int,
    n_embd: int,
    n_head: int,
    vocab: int,
    seq: int,
    batch: int,
    device: str = "cpu",
    note: str = "",
    stock: bool = False,
) -> Task:
    """A randomly initialised GPT-2 LM on random tokens: untied embeddings and per-example
    position ids (what both libraries run), or with ``stock`` GPT-2 as it comes (tied input and
    output embeddings, the model's own [1, seq] position ids)."""
    torch = _torch()
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        vocab_size=vocab,
        n_positions=seq,
        tie_word_embeddings=stock,
        bos_token_id=0,
        eos_token_id=0,
    )

    def make():
        torch.manual_seed(0)
        return GPT2LMHeadModel(cfg).to(device)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    pos = torch.arange(seq).repeat(batch, 1).to(device)  # contiguous [batch, seq]: Opacus's embedding norm needs it
    target = ids[:, 1:].reshape(-1)

    def loss(out, crit, ghost):
        logits = out.logits[:, :-1].reshape(-1, vocab)
        return crit(logits, target, shape=(batch, seq - 1, vocab)) if ghost else crit(logits, target)

    def forward(m):
        return m(input_ids=ids) if stock else m(input_ids=ids, position_ids=pos)

    return Task(key, name, make, forward, loss, batch, batch * seq, "tokens/s", note)


STOCK = "stock GPT-2 (tied embeddings, default position ids)"


def stock_gpt2_configs(libs: set[str], **kw: Any) -> list[Config]:
    """Opacus ghost and dpkit (exact noise) on GPT-2 as it comes: each row measures it or records
    the library's refusal."""
    out = []
    if "opacus" in libs:
        out.append(
            Config(
                "Opacus 1.6", f"ghost, {STOCK}", lambda: step_opacus(gpt2_task("stock", "", stock=True, **kw), "ghost")
            )
            if _have("opacus")
            else Config("Opacus 1.6", f"ghost, {STOCK}", None, "skipped: opacus not installed")
        )
    if "dpkit" in libs:
        out.append(
            Config(
                "dpkit",
                f"fast path, lattice noise, {STOCK}",
                lambda: step_dpkit(gpt2_task("stock", "", stock=True, **kw), "fast", "lattice"),
            )
        )
    return out


def _trainable(model) -> list[Any]:
    return [p for p in model.parameters() if p.requires_grad]


def _loader(batch: int, n: int = 60_000):
    torch = _torch()
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.zeros(n, 1), torch.zeros(n, dtype=torch.long)), batch_size=batch)


def step_nonprivate(task: Task) -> Callable[[], None]:
    torch = _torch()
    model = task.make()
    opt = torch.optim.SGD(_trainable(model), lr=0.01)
    crit = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        task.loss(task.forward(model), crit, False).backward()
        opt.step()

    return step


def step_opacus(task: Task, mode: str) -> Callable[[], None]:
    torch = _torch()
    from opacus import PrivacyEngine

    model = task.make()
    opt = torch.optim.SGD(_trainable(model), lr=0.01)
    crit = torch.nn.CrossEntropyLoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Secure RNG turned off": the benchmark measures Opacus's default
        engine = PrivacyEngine(accountant="rdp")
        out = engine.make_private(
            module=model,
            optimizer=opt,
            data_loader=_loader(task.batch),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            grad_sample_mode=mode,
            criterion=crit,
            poisson_sampling=True,
        )
    ghost = mode == "ghost"
    if ghost:
        model, opt, crit, _ = out
    else:
        model, opt, _ = out

    def step() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Opacus's full-backward-hook warning on every ghost step
            opt.zero_grad()
            task.loss(task.forward(model), crit, ghost).backward()
            opt.step()

    return step


def step_dpkit(task: Task, grad_mode: str, noise: str) -> Callable[[], None]:
    torch = _torch()
    from dpkit.torch import make_private

    model = task.make()
    opt = torch.optim.SGD(_trainable(model), lr=0.01)
    crit = torch.nn.CrossEntropyLoss()
    model, opt, _ = make_private(
        model,
        opt,
        _loader(task.batch),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        delta=1e-5,
        epochs=1,
        grad_mode=grad_mode,
        noise=noise,
    )

    def step() -> None:
        opt.zero_grad()
        task.loss(task.forward(model), crit, False).backward()
        opt.step()

    return step


# ------------------------------------------------------------------------------------------------
# noise: dpkit's DP-SGD noise through its public entry point, against torch.randn
# ------------------------------------------------------------------------------------------------


def noise_plan(kind: str, size: int, device: str = "cpu"):
    """``make_noise(kind, ...)`` as make_private calls it (σ = C = 1, batches of 256); passes
    ``device=`` only if the installed make_noise accepts it (a device sampler may)."""
    from dpkit.torch.noise import make_noise

    kwargs: dict[str, Any] = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "size": size, "max_batch": BATCH}
    if "device" in inspect.signature(make_noise).parameters:
        kwargs["device"] = device
    return make_noise(kind, **kwargs)


def noise_release_fn(kind: str, size: int, device: str = "cpu", sampler: str | None = None) -> Callable[[], Any]:
    """One call = one release of ``size`` noisy values, on a flat tensor in the plan's dtype (what
    make_private hands it). ``fn.reset()`` restores the input between rounds (a release may
    work in place). ``sampler``: override the plan's sampler field, where it has one."""
    import dataclasses

    torch = _torch()
    from dpkit.noise.source import resolve_rng

    plan = noise_plan(kind, size, device)
    if sampler is not None:
        plan = dataclasses.replace(plan, sampler=sampler)
    src = resolve_rng(None)
    dtype = getattr(plan, "dtype", torch.float32)
    orig = (torch.randn(size, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.1).to(dtype=dtype)
    orig = orig.to(device)
    flat = orig.clone()

    def fn() -> Any:
        return plan.release(flat, src)

    fn.reset = lambda: flat.copy_(orig)  # type: ignore[attr-defined]
    fn.dtype = str(dtype).replace("torch.", "")  # type: ignore[attr-defined]
    fn.sampler = getattr(plan, "sampler", None)  # type: ignore[attr-defined]
    return fn


def lattice_samplers() -> tuple[str, ...]:
    """The lattice plan's ``sampler`` choices other than its default, where it has that field."""
    import dataclasses

    try:
        from dpkit.torch.noise import LatticeNoise

        fields = {f.name: f for f in dataclasses.fields(LatticeNoise)}
        from dpkit.torch import noise as _noise

        choices = tuple(getattr(_noise, "SAMPLERS", ()))
    except Exception:  # noqa: BLE001 - an older or broken dpkit: no extra rows
        return ()
    if "sampler" not in fields:
        return ()
    return tuple(c for c in choices if c != fields["sampler"].default)


def randn_fn(size: int, device: str = "cpu") -> Callable[[], Any]:
    torch = _torch()

    def fn() -> Any:
        return torch.randn(size, device=device)

    return fn


# ------------------------------------------------------------------------------------------------
# the interleaved measurement
# ------------------------------------------------------------------------------------------------


@dataclass
class Config:
    library: str
    config: str
    build: Callable[[], Callable[[], Any]] | None  # None: skipped (see status)
    status: str = "ok"


@dataclass
class Group:
    key: str
    name: str
    unit: str
    per_call: int
    reference: tuple[str, str]  # (library, config) of the row the ratios are taken against
    configs: list[Config] = field(default_factory=list)
    kind: str = "training"  # or "noise"
    note: str = ""


def wait_for_quiet(max_load: float, max_wait: float) -> float:
    """Sleep until the 1-minute load average is below ``max_load`` (at most ``max_wait`` s)."""
    t0 = time.monotonic()
    while os.getloadavg()[0] > max_load and time.monotonic() - t0 < max_wait:
        time.sleep(5)
    return os.getloadavg()[0]


def measure_group(
    group: Group,
    *,
    rounds: int,
    round_seconds: float,
    wait: Callable[[], float] | None = None,
    sync: Callable[[], None] | None = None,
    min_steps: int = 2,
    max_steps: int | None = None,
    warmup: int = 3,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Build every configuration (a failure records its error), then ``rounds`` interleaved rounds:
    each configuration runs a step count fixed from its warm-up (about ``round_seconds``, within
    [min_steps, max_steps]); best and median round are reported."""
    sync = sync or (lambda: None)
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    built: list[tuple[Config, Callable[[], Any] | None, str, int]] = []
    for c in group.configs:
        if c.build is None:
            built.append((c, None, c.status, 0))
            continue
        log(f"[bench] {group.name}: {c.library} {c.config}")
        try:
            fn = c.build()
            reset = getattr(fn, "reset", None)
            fn()  # warm-up (a failure here means the configuration does not run)
            sync()
            warm = []
            for _ in range(warmup):
                if reset:
                    reset()
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                warm.append(time.perf_counter() - t0)
            n = max(min_steps, int(round_seconds / min(warm)))
            if max_steps is not None:
                n = min(n, max_steps)
            built.append((c, fn, "ok", n))
        except Exception as exc:  # noqa: BLE001 - a refused or failing configuration is reported, not fatal
            log(f"[bench]   failed: {_err(exc, 200)}")
            built.append((c, None, f"error: {_err(exc)}", 0))
    load = wait() if wait else None
    log(f"[bench] measuring {group.name}" + (f" (load average {load:.2f})" if load is not None else ""))
    samples: dict[int, list[float]] = {i: [] for i in range(len(built))}
    for _ in range(rounds):
        for i, (_c, fn, _status, n) in enumerate(built):
            if fn is None:
                continue
            reset = getattr(fn, "reset", None)
            if reset:
                reset()
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            samples[i].append(group.per_call * n / (time.perf_counter() - t0))
    ref = next(
        (
            max(samples[i])
            for i, (c, *_x) in enumerate(built)
            if (c.library, c.config) == group.reference and samples[i]
        ),
        None,
    )
    ghost = next(
        (
            max(samples[i])
            for i, (c, *_x) in enumerate(built)
            if c.library.startswith("Opacus") and c.config == "ghost" and samples[i]
        ),
        None,
    )
    rows = []
    for i, (c, fn, status, n) in enumerate(built):
        s = samples[i]
        row: dict[str, Any] = {
            "group": group.key,
            "model": group.name,
            "library": c.library,
            "config": c.config,
            "status": status,
            "unit": group.unit,
            "kind": group.kind,
        }
        if load is not None:
            row["load_at_start"] = load  # 1-minute load average when the timed rounds began
        if getattr(fn, "dtype", None):
            row["dtype"] = fn.dtype  # type: ignore[union-attr]
        if getattr(fn, "sampler", None):
            row["sampler"] = fn.sampler  # type: ignore[union-attr]
        if s:
            row.update(best=max(s), median=statistics.median(s), rounds=len(s), steps_per_round=n)
            if ref:
                row["ratio_to_reference"] = max(s) / ref  # throughput ratio (>1: faster than the reference)
            if ghost:
                row["ratio_to_opacus_ghost"] = max(s) / ghost
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------
# (a)+(b) the CPU groups
# ------------------------------------------------------------------------------------------------


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def training_configs(
    task: Task, libs: set[str], opacus_modes: tuple[str, ...], dpkit_modes: tuple[str, ...]
) -> list[Config]:
    out = [Config("torch", "non-private", lambda: step_nonprivate(task))]
    if "opacus" in libs:
        for mode in opacus_modes:
            if _have("opacus"):
                out.append(Config("Opacus 1.6", mode, lambda mode=mode: step_opacus(task, mode)))
            else:
                out.append(Config("Opacus 1.6", mode, None, "skipped: opacus not installed"))
    if "dpkit" in libs:
        for gm in dpkit_modes:
            for noise in ("lattice", "continuous"):
                label = f"{'fast path' if gm == 'fast' else 'vmap path'}, {noise} noise"
                out.append(Config("dpkit", label, lambda gm=gm, noise=noise: step_dpkit(task, gm, noise)))
    return out


def noise_group(size: int, device: str = "cpu") -> Group:
    g = Group(
        f"noise-{size}", f"noise, {size:,} values", "values/s", size, ("torch", "torch.randn float32"), kind="noise"
    )
    g.configs = [
        Config("torch", "torch.randn float32", lambda: randn_fn(size, device)),
        Config("dpkit", "lattice (exact, make_private's default)", lambda: noise_release_fn("lattice", size, device)),
        Config("dpkit", "continuous", lambda: noise_release_fn("continuous", size, device)),
    ]
    for other in lattice_samplers():  # e.g. the numpy "host" sampler beside a new default
        g.configs.insert(
            2,
            Config(
                "dpkit",
                f"lattice, sampler={other!r}",
                lambda other=other: noise_release_fn("lattice", size, device, other),
            ),
        )
    return g


#: The GPT-2 of the transformer group (the smoke run shrinks it).
GPT2_SIZE = {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab": 1000, "seq": 64, "batch": 32}


def cpu_groups(
    keys: set[str],
    libs: set[str],
    opacus_modes: tuple[str, ...],
    noise_sizes: tuple[int, ...] = NOISE_SIZES,
    batch: int = BATCH,
    gpt2: dict[str, int] = GPT2_SIZE,
) -> list[Group]:
    groups: list[Group] = []
    if "noise" in keys:
        groups += [noise_group(n) for n in noise_sizes]
    gpt2_name = f"GPT-2, {gpt2['n_layer']} layers"
    tasks: list[tuple[str, Callable[[], Task], tuple[str, ...], tuple[str, ...]]] = [
        ("mlp", lambda: classifier_task("mlp", "MLP 784-256-10", mlp, (784,), batch), opacus_modes, ("fast", "vmap")),
        (
            "cnn",
            lambda: classifier_task("cnn", "CNN (Opacus MNIST)", mnist_cnn, (1, 28, 28), batch),
            opacus_modes,
            ("fast", "vmap"),
        ),
        ("transformer", lambda: gpt2_task("transformer", gpt2_name, **gpt2), ("ghost",), ("fast",)),
    ]
    for key, make_task, modes, dmodes in tasks:
        if key not in keys:
            continue
        if key == "transformer" and not _have("transformers"):
            g = Group(key, gpt2_name, "tokens/s", gpt2["batch"] * gpt2["seq"], ("torch", "non-private"))
            g.configs = [Config("all", "all", None, "skipped: transformers not installed (pip install transformers)")]
            groups.append(g)
            continue
        task = make_task()
        g = Group(key, task.name, task.unit, task.items, ("torch", "non-private"), note=task.note)
        g.configs = training_configs(task, libs, modes, dmodes)
        if key == "transformer":
            g.configs += stock_gpt2_configs(libs, **gpt2)
        groups.append(g)
    return groups


# ------------------------------------------------------------------------------------------------
# (c) accuracy
# ------------------------------------------------------------------------------------------------


@dataclass
class AccSetup:
    key: str
    name: str
    load: Callable[[], tuple[Any, Any, Any, Any]]  # float32 x, int64 y tensors: train, test
    model: Callable[[int, int], Any]  # (seed, input width) -> module
    epochs: int
    batch: int
    clip: float = 1.0
    lr: float = 1.0
    momentum: float = 0.5
    delta: float = 1e-5
    describe: str = ""


def digits_split():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(0).permutation(len(y))
    x = (x / 16.0).astype(np.float32)
    test, train = perm[:500], perm[500:]
    return x[train], y[train], x[test], y[test]


def _as_tensors(xtr, ytr, xte, yte):
    torch = _torch()
    f = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
    g = lambda a: torch.from_numpy(np.asarray(a)).long()  # noqa: E731
    return f(xtr), g(ytr), f(xte), g(yte)


def adult_dir() -> Path | None:
    for cand in (os.environ.get("DPKIT_ADULT"), REPO.parent / "shared" / "data" / "adult"):
        if cand and (Path(cand) / "adult.data").exists() and (Path(cand) / "adult.test").exists():
            return Path(cand)
    return None


def adult_split():
    from dpkit.datasets import adult_features

    d = adult_dir()
    assert d is not None
    xtr, ytr = adult_features(d / "adult.data")
    xte, yte = adult_features(d / "adult.test")
    return xtr, ytr, xte, yte


def digits_model(seed: int, d: int = 64):
    torch = _torch()
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))


def logistic_model(seed: int, d: int):
    torch = _torch()
    torch.manual_seed(seed)
    return torch.nn.Linear(d, 2)


ADULT_EPOCHS = 10
ACC_SETUPS = {
    "digits": AccSetup(
        "digits",
        "digits",
        lambda: _as_tensors(*digits_split()),
        digits_model,
        epochs=20,
        batch=64,
        describe="sklearn digits, 1,297 train / 500 test (fixed split), MLP 64-64-10 tanh",
    ),
    # lr 0.2, momentum 0.9: of (1.0, 0.5), (0.5, 0.5), (0.2, 0.9), (0.1, 0.5) the one whose non-private baseline
    # converged (last-iterate SGD at lr 1.0 oscillates to 0.816); the same for both libraries
    "adult": AccSetup(
        "adult",
        "UCI Adult",
        lambda: _as_tensors(*adult_split()),
        logistic_model,
        epochs=ADULT_EPOCHS,
        batch=256,
        lr=0.2,
        momentum=0.9,
        describe="UCI Adult, adult.data (32,561) train / adult.test (16,281) test, "
        "dpkit.datasets.adult_features encoding, logistic regression",
    ),
}


def _accuracy(model, x, y) -> float:
    torch = _torch()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def train_dpkit(s: AccSetup, data, eps: float | None, seed: int) -> tuple[float, float | None, float]:
    torch = _torch()
    from torch.utils.data import DataLoader, TensorDataset

    xtr, ytr, xte, yte = data
    model = s.model(seed, xtr.shape[1])
    opt = torch.optim.SGD(model.parameters(), lr=s.lr, momentum=s.momentum)
    crit = torch.nn.CrossEntropyLoss()
    sigma = None
    t0 = time.perf_counter()
    if eps is None:
        g = torch.Generator().manual_seed(seed)
        loader = DataLoader(TensorDataset(xtr, ytr), batch_size=s.batch, shuffle=True, generator=g)
        for _ in range(s.epochs):
            for xb, yb in loader:
                opt.zero_grad()
                crit(model(xb), yb).backward()
                opt.step()
    else:
        from dpkit.torch import make_private

        loader = DataLoader(TensorDataset(xtr, ytr), batch_size=s.batch)
        private = make_private(
            model,
            opt,
            loader,
            epsilon=eps,
            delta=s.delta,
            epochs=s.epochs,
            max_grad_norm=s.clip,
            rng=np.random.default_rng(seed),
        )
        private.train(crit, progress=False)
        sigma = private.noise_multiplier
        assert private.epsilon <= eps, private.epsilon
    return _accuracy(model, xte, yte), sigma, time.perf_counter() - t0


def train_opacus(s: AccSetup, data, eps: float, seed: int) -> tuple[float, float, float]:
    torch = _torch()
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    xtr, ytr, xte, yte = data
    model = s.model(seed, xtr.shape[1])
    opt = torch.optim.SGD(model.parameters(), lr=s.lr, momentum=s.momentum)
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=s.batch)
    crit = torch.nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="rdp")
        model, opt, loader = engine.make_private_with_epsilon(
            module=model,
            optimizer=opt,
            data_loader=loader,
            target_epsilon=eps,
            target_delta=s.delta,
            epochs=s.epochs,
            max_grad_norm=s.clip,
        )
        torch.manual_seed(seed)
        for _ in range(s.epochs):
            for xb, yb in loader:
                if len(xb) == 0:
                    continue
                opt.zero_grad()
                crit(model(xb), yb).backward()
                opt.step()
        spent = engine.get_epsilon(s.delta)
    assert spent <= eps * 1.01, spent
    return _accuracy(model, xte, yte), opt.noise_multiplier, time.perf_counter() - t0


def measure_accuracy(keys: list[str], epsilons: list[float], seeds: int, libs: set[str]) -> list[dict[str, Any]]:
    _torch().set_num_threads(1)  # small models: a second thread only adds contention
    rows: list[dict[str, Any]] = []
    for key in keys:
        s = ACC_SETUPS[key]
        if key == "adult" and adult_dir() is None:
            rows.append(
                {
                    "group": key,
                    "dataset": s.name,
                    "library": "all",
                    "epsilon": None,
                    "status": "skipped: UCI Adult not found (set DPKIT_ADULT to a folder with adult.data and adult.test)",
                }
            )
            continue
        data = s.load()
        plans: list[tuple[str, float | None, Callable[..., tuple[float, float | None, float]]]] = [
            ("torch (non-private)", None, train_dpkit)
        ]
        for eps in epsilons:
            if "dpkit" in libs:
                plans.append(("dpkit", eps, train_dpkit))
            if "opacus" in libs:
                plans.append(("Opacus 1.6", eps, train_opacus))
        for lib, eps, fn in plans:
            print(f"[bench] accuracy {s.name}: {lib} ε={eps}", file=sys.stderr, flush=True)
            accs, sigmas, secs = [], [], []
            row: dict[str, Any] = {"group": key, "dataset": s.name, "library": lib, "epsilon": eps}
            try:
                for seed in range(seeds):
                    acc, sigma, sec = fn(s, data, eps, seed)
                    accs.append(acc)
                    sigmas.append(sigma)
                    secs.append(sec)
                row.update(
                    status="ok",
                    accuracy_median=statistics.median(accs),
                    accuracy_min=min(accs),
                    accuracy_max=max(accs),
                    accuracies=accs,
                    noise_multiplier=sigmas[0],
                    seconds_per_run=statistics.fmean(secs),
                    seeds=seeds,
                )
            except Exception as exc:  # noqa: BLE001
                row["status"] = f"error: {_err(exc)}"
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------
# reporting
# ------------------------------------------------------------------------------------------------


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.3g}"


def _short(status: str, limit: int = 160) -> str:
    return status if len(status) <= limit else status[: limit - 1] + "…"


def goals(thr: list[dict[str, Any]]) -> list[str]:
    """The issue's goals, checked against the rows at hand."""

    def best(group: str, lib: str, config: str) -> float | None:
        return next(
            (r.get("best") for r in thr if r["group"] == group and r["library"] == lib and r["config"] == config), None
        )

    out = []
    for size in NOISE_SIZES:
        r = next((r for r in thr if r["group"] == f"noise-{size}" and r["config"].startswith("lattice")), None)
        if r and "ratio_to_reference" in r:
            v = r["ratio_to_reference"]
            out.append(
                f"noise, {size:,} values: exact lattice noise at {v:.2f}× torch.randn (goal ≥ 0.5×): "
                f"{'met' if v >= 0.5 else 'not met'}"
            )
    np_mlp, lat_mlp = best("mlp", "torch", "non-private"), best("mlp", "dpkit", "fast path, lattice noise")
    if np_mlp and lat_mlp:
        sl = np_mlp / lat_mlp
        out.append(
            f"MLP: default exact noise {sl:.2f}× slower than non-private (goal ≤ 2.5×): {'met' if sl <= 2.5 else 'not met'}"
        )
    for group, name in (("mlp", "MLP"), ("cnn", "CNN"), ("transformer", "transformer")):
        gh = best(group, "Opacus 1.6", "ghost")
        for noise in ("lattice", "continuous"):
            d = best(group, "dpkit", f"fast path, {noise} noise")
            if gh and d:
                out.append(
                    f"{name}: dpkit {noise} noise {d / gh:.2f}× Opacus ghost's throughput (goal > 1): "
                    f"{'met' if d > gh else 'not met'}"
                )
    return out


def render(thr: list[dict[str, Any]], acc: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = []
    noise = [r for r in thr if r.get("kind") == "noise"]
    train = [r for r in thr if r.get("kind") != "noise"]
    gm = meta.get("groups", {})

    def when(keys: set[str]) -> str:
        ds = sorted({gm[k]["date"] for k in keys if k in gm})
        return ", ".join(ds)

    if noise:
        headers = ["values", "sampler", "dtype", "values/s (best)", "values/s (median)", "× torch.randn"]
        cells = [
            [
                r["model"].split(", ")[1],
                r["config"] if r["library"] == "torch" else f"{r['library']} {r['config']}",
                r.get("dtype", "float32") + (f", sampler {r['sampler']}" if r.get("sampler") else ""),
                _num(r["best"]) if "best" in r else _short(r["status"]),
                _num(r["median"]) if "median" in r else "—",
                f"{r['ratio_to_reference']:.2f}" if "ratio_to_reference" in r else "—",
            ]
            for r in noise
        ]
        notes = [
            "dpkit rows: dpkit.torch.noise.make_noise(kind, σ=1, C=1, size=n, max_batch=256).release(flat, "
            "resolve_rng(None)) — the sampler make_private uses, fed by the CSPRNG; flat in the plan's dtype",
            "torch.randn: float32, torch's default (non-cryptographic) generator — what Opacus adds; its float32 "
            "Box–Muller tail stops at 5.77σ",
        ]
        _report.print_table(
            "DP-SGD noise",
            headers,
            headers[:3],
            [(c, c[0], c[1].startswith("dpkit")) for c in cells],
            notes,
            to_stderr=True,
        )
        out.append(
            _report.markdown(
                f"DP-SGD noise throughput on CPU ({when({r['group'] for r in noise})}).",
                headers,
                headers[:3],
                cells,
                notes,
            )
        )
    if train:
        headers = [
            "model",
            "library",
            "configuration",
            "throughput (best)",
            "(median)",
            "× slower than non-private",
            "÷ Opacus ghost",
        ]
        cells = []
        for r in train:
            ok = "best" in r
            unit = r["unit"].replace("/s", "")
            cells.append(
                [
                    r["model"],
                    r["library"],
                    r["config"],
                    f"{_num(r['best'])} {unit}/s" if ok else _short(r["status"]),
                    _num(r["median"]) if ok else "—",
                    f"{1 / r['ratio_to_reference']:.2f}" if ok and "ratio_to_reference" in r else "—",
                    f"{r['ratio_to_opacus_ghost']:.2f}" if ok and "ratio_to_opacus_ghost" in r else "—",
                ]
            )
        notes = [
            "compute only (forward, backward, clipping, noise, optimizer step on a fixed random batch); torch.set_num_threads(2); "
            "MLP/CNN batch 256; GPT-2 (2 layers, n_embd 128, 4 heads, vocabulary 1,000; untied embeddings and per-example "
            "position ids unless 'stock') batch 32 × 64 tokens",
            "Opacus adds float32 torch.normal noise (its default; not floating-point safe, tail stops at 5.77σ); dpkit "
            "'lattice' is its default exact discrete Gaussian on a 2^k lattice from the CSPRNG, 'continuous' is Box–Muller "
            "on CSPRNG words with float64 radii (not floating-point safe)",
            "÷ Opacus ghost: throughput divided by Opacus ghost clipping's on the same model (> 1: faster)",
        ]
        for k in sorted({r["group"] for r in train}):
            if k in gm:
                m = gm[k]
                notes.append(
                    f"{k}: {m['date']}, best and median of {m['rounds']} interleaved rounds of ~{m['round_seconds']:g} s "
                    f"(1-minute load average {m.get('load_at_start') or m['load_before']:.2f} when they began)"
                )
        _report.print_table(
            "DP-SGD throughput",
            headers,
            headers[:3],
            [(c, c[0], c[1] == "dpkit") for c in cells],
            notes,
            to_stderr=True,
        )
        out.append(
            _report.markdown(
                f"DP-SGD training throughput on CPU, {meta['cpu_count']} CPUs, torch {meta['versions']['torch']}.",
                headers,
                headers[:3],
                cells,
                notes,
            )
        )
    g = goals(thr)
    if g:
        out.append("Against the goals:\n\n" + "\n".join(f"- {line}" for line in g))
    if acc:
        headers = ["data", "library", "ε", "test accuracy (median)", "min – max", "σ", "s / run"]
        cells = []
        for r in acc:
            ok = r["status"] == "ok"
            cells.append(
                [
                    r["dataset"],
                    r["library"],
                    "∞" if r["epsilon"] is None else f"{r['epsilon']:g}",
                    f"{r['accuracy_median']:.4f}" if ok else _short(r["status"]),
                    f"{r['accuracy_min']:.4f} – {r['accuracy_max']:.4f}" if ok else "—",
                    "—" if not ok or r.get("noise_multiplier") is None else f"{r['noise_multiplier']:.3f}",
                    f"{r['seconds_per_run']:.1f}" if ok else "—",
                ]
            )
        notes = []
        for k in sorted({r["group"] for r in acc}):
            s = ACC_SETUPS[k]
            m = gm.get(k, {})
            notes.append(
                f"{s.describe}; δ={s.delta}, {m.get('epochs', s.epochs)} epochs, batch {s.batch}, C={s.clip}, SGD lr {s.lr} "
                f"momentum {s.momentum}; median of {m.get('seeds', '?')} seeds ({m.get('date', '')})"
            )
        notes.append(
            "each library calibrates σ with its own RDP accountant; Opacus samples at q = 1/len(loader), dpkit at q = b/N; "
            "dpkit uses its default exact lattice noise (seeded generator per seed), Opacus its default mode (hooks)"
        )
        _report.print_table(
            "DP-SGD accuracy", headers, headers[:2], [(c, c[0], c[1] == "dpkit") for c in cells], notes, to_stderr=True
        )
        out.append(_report.markdown("DP-SGD test accuracy.", headers, headers[:2], cells, notes))
    return "\n\n".join(out)


def _load_previous(path: Path) -> dict[str, Any]:
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    rows = old.get("throughput", []) + old.get("accuracy", [])
    if not all("group" in r for r in rows):
        return {}  # an older layout: start afresh
    return old


def parse_only(only: str | None) -> list[str]:
    if not only:
        return list(ALIASES["all"])
    keys: list[str] = []
    for k in only.split(","):
        k = k.strip()
        for x in ALIASES.get(k, (k,)):
            if x not in ALIASES["all"]:
                raise SystemExit(
                    f"--only: unknown group {x!r}; choose from {', '.join(ALIASES['all'])} or {', '.join(ALIASES)}"
                )
            if x not in keys:
                keys.append(x)
    return keys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help=f"comma-separated groups: {', '.join(ALIASES['all'])}, or throughput / accuracy")
    ap.add_argument("--accuracy", action="store_true", help="the accuracy groups only (= --only accuracy)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--round-seconds", type=float, default=0.2, help="time per configuration per round")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument(
        "--max-load", type=float, default=1.0, help="wait for a 1-minute load average below this before measuring"
    )
    ap.add_argument("--max-wait", type=float, default=180.0, help="seconds to wait for that at most")
    ap.add_argument(
        "--opacus-modes", default=",".join(OPACUS_MODES), help="Opacus grad-sample modes on the MLP and CNN"
    )
    ap.add_argument("--seeds", type=int, default=3, help="training runs per (library, ε) for accuracy")
    ap.add_argument("--epsilons", default="1,3,8")
    ap.add_argument("--adult-epochs", type=int, default=ADULT_EPOCHS)
    ap.add_argument("--digits-epochs", type=int, default=ACC_SETUPS["digits"].epochs)
    ap.add_argument("--libs", default="dpkit,opacus")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    noise_sizes, steps, sizes, smoke_failures = NOISE_SIZES, {}, {}, []
    if args.smoke:
        args.rounds, args.round_seconds, args.max_wait, args.seeds, args.epsilons = 1, 0.0, 0.0, 1, "8"
        args.adult_epochs, args.digits_epochs, args.out = 1, 1, _smoke.out_path("dpsgd.json")
        args.libs = ",".join(_smoke.present(args.libs.split(",")))
        noise_sizes, steps = (10_000,), {"warmup": 1, "min_steps": 1, "max_steps": 1}
        sizes = {"batch": 8, "gpt2": {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab": 100, "seq": 16, "batch": 4}}
    libs = set(args.libs.split(","))
    keys = parse_only("accuracy" if args.accuracy else args.only)
    if args.smoke:  # each group costs seconds; these two run the code paths of mlp and digits again
        for key, like in (("cnn", "mlp"), ("adult", "digits")):
            if key in keys:
                _smoke.skip(key, f"the code paths of {like}, at seconds more")
                keys.remove(key)
        smoke_failures += _smoke.missing("dpkit.datasets", "adult_features")  # what adult would use
    if args.skip_throughput:
        keys = [k for k in keys if k not in THROUGHPUT_GROUPS]
    if args.skip_accuracy:
        keys = [k for k in keys if k not in ACCURACY_GROUPS]
    ACC_SETUPS["adult"].epochs = args.adult_epochs
    ACC_SETUPS["digits"].epochs = args.digits_epochs

    old = _load_previous(args.out)
    group_meta: dict[str, Any] = dict(old.get("meta", {}).get("groups", {}))
    thr: list[dict[str, Any]] = []
    torch = _torch()
    torch.set_num_threads(2)
    for g in cpu_groups(set(keys), libs, tuple(args.opacus_modes.split(",")), noise_sizes, **sizes):
        before = os.getloadavg()[0]
        got = measure_group(
            g,
            rounds=args.rounds,
            round_seconds=args.round_seconds,
            wait=lambda: wait_for_quiet(args.max_load, args.max_wait),
            **steps,
        )
        thr += got
        group_meta[g.key] = {
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "rounds": args.rounds,
            "round_seconds": args.round_seconds,
            "load_before": before,
            "load_at_start": next((r["load_at_start"] for r in got if "load_at_start" in r), None),
            "load_after": os.getloadavg()[0],
        }
    acc_keys = [k for k in keys if k in ACCURACY_GROUPS]
    acc = measure_accuracy(acc_keys, [float(e) for e in args.epsilons.split(",")], args.seeds, libs) if acc_keys else []
    for k in acc_keys:
        group_meta[k] = {
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "seeds": args.seeds,
            "epochs": ACC_SETUPS[k].epochs,
            "epsilons": args.epsilons,
        }
    ran = {r["group"] for r in thr + acc} | set(keys) | {f"noise-{n}" for n in NOISE_SIZES if "noise" in keys}
    thr = [r for r in old.get("throughput", []) if r["group"] not in ran] + thr
    acc = [r for r in old.get("accuracy", []) if r["group"] not in ran] + acc
    order = [f"noise-{n}" for n in NOISE_SIZES] + list(THROUGHPUT_GROUPS[1:]) + list(ACCURACY_GROUPS)
    thr.sort(key=lambda r: order.index(r["group"]) if r["group"] in order else 99)
    acc.sort(key=lambda r: order.index(r["group"]) if r["group"] in order else 99)
    meta = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": {"throughput": 2, "accuracy": 1},
        "machine": platform.machine(),
        "versions": {
            d: _report.version(d) for d in ("dpkit", "torch", "opacus", "transformers", "numpy", "scikit-learn")
        },
        "groups": group_meta,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"meta": meta, "throughput": thr, "accuracy": acc}, indent=2, ensure_ascii=False) + "\n"
    )
    print(f"[bench] wrote {args.out}", file=sys.stderr)
    print(render(thr, acc, meta))
    if args.smoke:
        return _smoke.finish(
            smoke_failures
            + [
                f"{r['group']}: {r['library']} {r.get('config', r.get('epsilon'))}: {r['status']}"
                for r in thr + acc
                if r["library"] in ("dpkit", "torch (non-private)") and r["status"] != "ok"
            ]
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
