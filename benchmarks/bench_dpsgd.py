"""DP-SGD benchmark: dpkit.torch against Opacus 1.6 — throughput on CPU and accuracy at equal ε.

Not a test. Run it from the benchmark environment (Opacus is installed only there):

    .venv-bench/bin/python benchmarks/bench_dpsgd.py [--rounds 25] [--round-seconds 0.2] [--skip-accuracy]

(a) Throughput, samples per second of *compute only* (forward, backward, per-example clipping,
    noise, optimizer step on one fixed batch of 256 random inputs; no data loading, no
    accounting queries), torch.set_num_threads(2), for an MLP 784-256-10 and the CNN of Opacus's
    MNIST example (conv 16@8x8/2 → maxpool → conv 32@4x4/2 → maxpool → fc 32 → fc 10):
    non-private torch; Opacus in every grad-sample mode (hooks, functorch, ew = expanded
    weights, ghost = fast gradient clipping; its default non-secure torch.normal noise); dpkit
    fast path (ghost clipping / book-keeping) and vmap path, each with exact lattice noise
    (dpkit's default: CSPRNG + exact discrete Gaussian, float64 release) and with continuous
    noise (Box–Muller on CSPRNG words; the closer match to Opacus's noise). The
    configurations run interleaved, ``--rounds`` rounds of about ``--round-seconds`` each, after
    waiting (up to ``--max-wait`` s) for a 1-minute load average below ``--max-load``; the table
    shows the best round (the machine is shared: with 2 intra-op threads a descheduled thread
    stalls every small op, so the best round is the least disturbed one) and the median round.
(b) Accuracy: DP-SGD on scikit-learn's bundled digits (8x8 images, 1,797 examples; 1,297 train
    / 500 test, fixed split), MLP 64-64-10 (tanh), the same (ε, δ = 1e-5, epochs, batch 64,
    C = 1.0, SGD lr 1.0 momentum 0.5) for dpkit and Opacus, each calibrating σ with its own RDP
    accountant; mean ± standard deviation of test accuracy over ``--seeds`` seeds.

Results: ``benchmarks/results/dpsgd.json``, a rich table on stderr and Markdown on stdout.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

import _report

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "dpsgd.json"
BATCH = 256


def _torch():
    import torch

    return torch


# ------------------------------------------------------------------------------------------------
# models
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


MODELS = {"MLP 784-256-10": (mlp, (784,)), "CNN (Opacus MNIST)": (mnist_cnn, (1, 28, 28))}


# ------------------------------------------------------------------------------------------------
# (a) throughput
# ------------------------------------------------------------------------------------------------


def _loader(n: int = 60_000):
    torch = _torch()
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.zeros(n, 1), torch.zeros(n, dtype=torch.long)), batch_size=BATCH)


def step_nonprivate(make: Callable[[], Any], x, y) -> Callable[[], None]:
    torch = _torch()
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()

    return step


def step_opacus(make: Callable[[], Any], x, y, mode: str) -> Callable[[], None]:
    torch = _torch()
    from opacus import PrivacyEngine

    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = torch.nn.CrossEntropyLoss()
    engine = PrivacyEngine(accountant="rdp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = engine.make_private(
            module=model, optimizer=opt, data_loader=_loader(), noise_multiplier=1.0, max_grad_norm=1.0,
            grad_sample_mode=mode, criterion=crit, poisson_sampling=True,
        )
    if mode == "ghost":
        model, opt, crit, _ = out
    else:
        model, opt, _ = out

    def step() -> None:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()

    return step


def step_dpkit(make: Callable[[], Any], x, y, grad_mode: str, noise: str) -> Callable[[], None]:
    torch = _torch()
    from dpkit.torch import make_private

    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = torch.nn.CrossEntropyLoss()
    model, opt, _ = make_private(
        model, opt, _loader(), noise_multiplier=1.0, max_grad_norm=1.0, target_delta=1e-5, epochs=1,
        grad_mode=grad_mode, noise=noise,
    )

    def step() -> None:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()

    return step


def throughput_configs(make, x, y, libs: set[str]) -> list[tuple[str, str, Callable[[], Callable[[], None]]]]:
    """(library, configuration, builder of a one-step function)."""
    out: list[tuple[str, str, Callable[[], Callable[[], None]]]] = [("torch", "non-private", lambda: step_nonprivate(make, x, y))]
    if "opacus" in libs:
        for mode in ("hooks", "functorch", "ew", "ghost"):
            out.append(("Opacus 1.6", mode, lambda mode=mode: step_opacus(make, x, y, mode)))
    if "dpkit" in libs:
        for gm in ("fast", "vmap"):
            for noise in ("lattice", "continuous"):
                label = f"{'fast path (ghost/book-keeping)' if gm == 'fast' else 'vmap path'}, {noise} noise"
                out.append(("dpkit", label, lambda gm=gm, noise=noise: step_dpkit(make, x, y, gm, noise)))
    return out


def wait_for_quiet(max_load: float, max_wait: float) -> float:
    """Sleep until the 1-minute load average is below ``max_load`` (at most ``max_wait`` s)."""
    t0 = time.monotonic()
    while os.getloadavg()[0] > max_load and time.monotonic() - t0 < max_wait:
        time.sleep(5)
    return os.getloadavg()[0]


def measure_throughput(round_seconds: float, rounds: int, libs: set[str], max_load: float, max_wait: float) -> list[dict[str, Any]]:
    """Interleaved rounds: each configuration runs about ``round_seconds`` per round (its step
    count fixed from the warm-up), ``rounds`` times; best and median round are reported."""
    torch = _torch()
    torch.set_num_threads(2)
    rows: list[dict[str, Any]] = []
    for model_name, (make, shape) in MODELS.items():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(BATCH, *shape, generator=g)
        y = torch.randint(0, 10, (BATCH,), generator=g)
        built: list[tuple[str, str, Callable[[], None] | None, str, int]] = []
        for lib, label, build in throughput_configs(make, x, y, libs):
            print(f"[bench] throughput {model_name}: {lib} {label}", file=sys.stderr, flush=True)
            try:
                fn = build()
                fn()  # warm-up (and a failure here means the mode does not run)
                warm = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    fn()
                    warm.append(time.perf_counter() - t0)
                built.append((lib, label, fn, "ok", max(2, int(round_seconds / min(warm)))))
            except Exception as exc:  # noqa: BLE001 - a peer mode that fails is reported, not fatal
                built.append((lib, label, None, f"error: {type(exc).__name__}: {str(exc)[:100]}", 0))
        load = wait_for_quiet(max_load, max_wait)
        print(f"[bench] measuring {model_name} (load average {load:.2f})", file=sys.stderr, flush=True)
        samples: dict[tuple[str, str], list[float]] = {(lib, label): [] for lib, label, *_ in built}
        for _ in range(rounds):
            for lib, label, fn, _status, n in built:
                if fn is None:
                    continue
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                samples[(lib, label)].append(BATCH * n / (time.perf_counter() - t0))
        base = max(samples[("torch", "non-private")])
        for lib, label, fn, status, n in built:
            s = samples[(lib, label)]
            row: dict[str, Any] = {"model": model_name, "library": lib, "config": label, "status": status}
            if s:
                row.update(best=max(s), median=statistics.median(s), rounds=len(s), steps_per_round=n,
                           slowdown_vs_nonprivate=base / max(s))
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------
# (b) accuracy on digits
# ------------------------------------------------------------------------------------------------

ACC = {"delta": 1e-5, "epochs": 20, "batch": 64, "clip": 1.0, "lr": 1.0, "momentum": 0.5}


def digits_split():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(0).permutation(len(y))
    x = (x / 16.0).astype(np.float32)
    test, train = perm[:500], perm[500:]
    return x[train], y[train], x[test], y[test]


def digits_model(seed: int):
    torch = _torch()
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))


def _accuracy(model, x, y) -> float:
    torch = _torch()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def _tensors():
    torch = _torch()
    xtr, ytr, xte, yte = digits_split()
    return torch.from_numpy(xtr), torch.from_numpy(ytr).long(), torch.from_numpy(xte), torch.from_numpy(yte).long()


def train_dpkit(eps: float | None, seed: int) -> tuple[float, float | None, float]:
    torch = _torch()
    from torch.utils.data import DataLoader, TensorDataset

    from dpkit.torch import make_private

    xtr, ytr, xte, yte = _tensors()
    model = digits_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=ACC["lr"], momentum=ACC["momentum"])
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=ACC["batch"])
    crit = torch.nn.CrossEntropyLoss()
    sigma = None
    t0 = time.perf_counter()
    if eps is None:
        g = torch.Generator().manual_seed(seed)
        loader = DataLoader(TensorDataset(xtr, ytr), batch_size=ACC["batch"], shuffle=True, generator=g)
        for _ in range(ACC["epochs"]):
            for xb, yb in loader:
                opt.zero_grad()
                crit(model(xb), yb).backward()
                opt.step()
    else:
        private = make_private(model, opt, loader, target_epsilon=eps, target_delta=ACC["delta"], epochs=ACC["epochs"],
                               max_grad_norm=ACC["clip"], rng=np.random.default_rng(seed))
        private.train(crit, progress=False)
        sigma = private.noise_multiplier
        assert private.epsilon <= eps
    return _accuracy(model, xte, yte), sigma, time.perf_counter() - t0


def train_opacus(eps: float, seed: int) -> tuple[float, float, float]:
    torch = _torch()
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    xtr, ytr, xte, yte = _tensors()
    model = digits_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=ACC["lr"], momentum=ACC["momentum"])
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=ACC["batch"])
    crit = torch.nn.CrossEntropyLoss()
    engine = PrivacyEngine(accountant="rdp")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = engine.make_private_with_epsilon(
            module=model, optimizer=opt, data_loader=loader, target_epsilon=eps, target_delta=ACC["delta"],
            epochs=ACC["epochs"], max_grad_norm=ACC["clip"],
        )
        torch.manual_seed(seed)
        for _ in range(ACC["epochs"]):
            for xb, yb in loader:
                if len(xb) == 0:
                    continue
                opt.zero_grad()
                crit(model(xb), yb).backward()
                opt.step()
        spent = engine.get_epsilon(ACC["delta"])
    assert spent <= eps * 1.01, spent
    return _accuracy(model, xte, yte), opt.noise_multiplier, time.perf_counter() - t0


def measure_accuracy(epsilons: list[float], seeds: int, libs: set[str]) -> list[dict[str, Any]]:
    _torch().set_num_threads(1)  # a 5k-parameter model: a second thread only adds contention
    rows: list[dict[str, Any]] = []
    plans: list[tuple[str, float | None, Callable[[float | None, int], tuple[float, float | None, float]]]] = [
        ("torch (non-private)", None, train_dpkit)
    ]
    for eps in epsilons:
        if "dpkit" in libs:
            plans.append(("dpkit", eps, train_dpkit))
        if "opacus" in libs:
            plans.append(("Opacus 1.6", eps, train_opacus))  # type: ignore[arg-type]
    for lib, eps, fn in plans:
        print(f"[bench] accuracy digits: {lib} ε={eps}", file=sys.stderr, flush=True)
        accs, sigmas, secs = [], [], []
        try:
            for seed in range(seeds):
                acc, sigma, sec = fn(eps, seed)
                accs.append(acc)
                sigmas.append(sigma)
                secs.append(sec)
            rows.append({
                "library": lib, "epsilon": eps, "status": "ok", "accuracy_mean": statistics.fmean(accs),
                "accuracy_sd": statistics.stdev(accs) if len(accs) > 1 else 0.0, "accuracies": accs,
                "noise_multiplier": sigmas[0], "seconds_per_run": statistics.fmean(secs), "seeds": seeds,
            })
        except Exception as exc:  # noqa: BLE001
            rows.append({"library": lib, "epsilon": eps, "status": f"error: {type(exc).__name__}: {str(exc)[:100]}"})
    return rows


# ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--round-seconds", type=float, default=0.2, help="time per configuration per round")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--max-load", type=float, default=1.0, help="wait for a 1-minute load average below this before measuring")
    ap.add_argument("--max-wait", type=float, default=180.0, help="seconds to wait for that at most")
    ap.add_argument("--seeds", type=int, default=3, help="training runs per (library, ε) for accuracy")
    ap.add_argument("--epsilons", default="1,3,8")
    ap.add_argument("--libs", default="dpkit,opacus")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    libs = set(args.libs.split(","))
    load_before = os.getloadavg()
    thr = [] if args.skip_throughput else measure_throughput(args.round_seconds, args.rounds, libs, args.max_load, args.max_wait)
    acc = [] if args.skip_accuracy else measure_accuracy([float(e) for e in args.epsilons.split(",")], args.seeds, libs)
    meta = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "torch_threads": {"throughput": 2, "accuracy": 1},
        "machine": platform.machine(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "versions": {d: _report.version(d) for d in ("dpkit", "torch", "opacus", "numpy", "scikit-learn")},
        "batch": BATCH, "accuracy_setup": ACC,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "throughput": thr, "accuracy": acc}, indent=2, ensure_ascii=False) + "\n")

    out = []
    if thr:
        headers = ["model", "library", "configuration", "samples/s (best)", "samples/s (median)", "× slower than non-private"]
        cells = []
        for r in thr:
            ok = "best" in r
            cells.append([r["model"], r["library"], r["config"], f"{r['best']:,.0f}" if ok else r["status"],
                          f"{r['median']:,.0f}" if ok else "—", f"{r['slowdown_vs_nonprivate']:.2f}" if ok else "—"])
        notes = [
            f"batch {BATCH}, random inputs, compute only (forward, backward, clipping, noise, optimizer step); torch.set_num_threads(2)",
            f"best and median of {args.rounds} interleaved rounds of ~{args.round_seconds:g} s on a shared machine (load average "
            f"{load_before[0]:.1f} before, {meta['load_average_after'][0]:.1f} after)",
            "Opacus adds float32 torch.normal noise (its default; not floating-point safe, and its tail stops at 5.77σ); "
            "dpkit 'lattice' is its default exact discrete Gaussian on a 2^k lattice from the CSPRNG (float64 release), "
            "'continuous' is Box–Muller on CSPRNG words with float64 radii (not floating-point safe)",
        ]
        _report.print_table("DP-SGD throughput", headers, headers[:3], [(c, c[0], c[1] == "dpkit") for c in cells], notes, to_stderr=True)
        out.append(_report.markdown(f"DP-SGD throughput on CPU. {meta['date']}, {meta['cpu_count']} CPUs, torch {meta['versions']['torch']}.",
                                    headers, headers[:3], cells, notes))
    if acc:
        headers = ["library", "ε", "test accuracy", "σ", "s / run"]
        cells = []
        for r in acc:
            ok = r["status"] == "ok"
            cells.append([r["library"], "∞" if r["epsilon"] is None else f"{r['epsilon']:g}",
                          f"{r['accuracy_mean']:.3f} ± {r['accuracy_sd']:.3f}" if ok else r["status"],
                          "—" if not ok or r["noise_multiplier"] is None else f"{r['noise_multiplier']:.3f}",
                          f"{r['seconds_per_run']:.1f}" if ok else "—"])
        notes = [
            f"digits (sklearn), 1,297 train / 500 test, MLP 64-64-10 tanh; δ={ACC['delta']}, {ACC['epochs']} epochs, batch "
            f"{ACC['batch']}, C={ACC['clip']}, SGD lr {ACC['lr']} momentum {ACC['momentum']}; mean ± sd over {args.seeds} seeds",
            "each library calibrates σ with its own RDP accountant; Opacus samples at q = 1/len(loader), dpkit at q = b/N",
        ]
        _report.print_table("DP-SGD accuracy on digits", headers, headers[:1], [(c, c[0], c[0] == "dpkit") for c in cells], notes, to_stderr=True)
        out.append(_report.markdown(f"DP-SGD test accuracy on digits. {meta['date']}.", headers, headers[:1], cells, notes))
    print(f"[bench] wrote {args.out}", file=sys.stderr)
    print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
