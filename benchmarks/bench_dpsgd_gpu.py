"""DP-SGD on one GPU: dpkit.torch against Opacus 1.6 and non-private training, every GPU row in one run.

Not a test. Needs a CUDA device; without one it stops at once with a message (exit status 2).
Run it through ``bash benchmarks/gpu_dpsgd.sh`` (which finds a Python with CUDA torch, adds
``src/`` and any carried wheels to the path), or directly:

    python benchmarks/bench_dpsgd_gpu.py [--out results.json] [--only noise,gpt2,bert,bert-lora,resnet]
    python benchmarks/bench_dpsgd_gpu.py --allow-cpu --tiny    # plumbing check on a CPU, tiny models

Rows (each: non-private torch, Opacus 1.6 ghost clipping — its best mode, its default float32
torch.normal noise — and dpkit's fast path with its default exact lattice noise and with
continuous noise):

- noise: values/s of ``dpkit.torch.noise.make_noise(kind, ...).release(flat, src)`` (the sampler
  make_private uses, CSPRNG source) on a flat tensor on the device, 10 M values and 124,439,808
  (GPT-2 small's parameter count), against float32 ``torch.randn`` on the device (plus a row for
  each other sampler the lattice plan offers, e.g. the numpy "host" one);
- GPT-2 small (12 layers, 768 wide, vocabulary 50,257; random init, *untied* output embedding —
  Opacus ghost clipping refuses tied weights — so 163 M trainable parameters; position ids
  passed per example), random tokens, sequence 256, batch 16, next-token loss: tokens/s; plus
  Opacus ghost and dpkit (exact noise) on the stock model (tied, default position ids), each
  measured or recording its refusal;
- BERT-base (BertForSequenceClassification, random init, 2 labels), sequence 128, batch 32,
  full fine-tuning (109 M parameters) and LoRA (peft, r = 8 on query/value, plus the
  classifier): tokens/s;
- ResNet-18 with GroupNorm (defined here; CIFAR layout: 3x3 stem, 32x32 inputs, 10 classes),
  batch 256: images/s.

Each configuration: one untimed step, ``--warmup`` timed warm-up steps (they fix the step count
of a round), then ``--rounds`` interleaved rounds of 1 to ``--max-steps`` steps (about
``--round-seconds`` each); best and median round reported, torch.cuda.synchronize() around each
round. A configuration that is refused, fails or runs out of memory records its error; one that
needs a package not installed (opacus, transformers, peft) is marked skipped with the reason.
Writes JSON (``--out``) and Markdown (same name, .md) and prints the Markdown with the card's
name. Sized to finish in a few minutes on an H100 (an estimate from the step counts: not yet run
on one).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import _smoke

REPO = Path(__file__).resolve().parent.parent


def _out_default() -> Path:
    out = os.environ.get("OUT")
    return (Path(out) if out else REPO / "benchmarks" / "results") / "dpsgd_gpu.json"


GROUPS = ("noise", "gpt2", "bert", "bert-lora", "resnet")
#: What this benchmark takes from bench_dpsgd.py (checked by a smoke run without a GPU).
SHARED = (
    "Task", "Group", "Config", "measure_group", "noise_group", "classifier_task", "gpt2_task", "stock_gpt2_configs",
    "step_nonprivate", "step_opacus", "step_dpkit", "_err",
)  # fmt: skip


def resnet18_gn(num_classes: int = 10, width: int = 64, groups: int = 32):
    """ResNet-18 (CIFAR layout: 3x3 stem, no max-pool) with GroupNorm instead of BatchNorm."""
    import torch
    from torch import nn

    def gn(c: int) -> nn.GroupNorm:
        return nn.GroupNorm(min(groups, c), c)

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.gn1 = gn(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.gn2 = gn(cout)
            self.short = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), gn(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            y = torch.relu(self.gn1(self.conv1(x)))
            return torch.relu(self.gn2(self.conv2(y)) + self.short(x))

    class ResNet18GN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            w = width
            self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), gn(w), nn.ReLU())
            layers, cin = [], w
            for cout, stride in ((w, 1), (2 * w, 2), (4 * w, 2), (8 * w, 2)):
                layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return ResNet18GN()


def bert_task(key: str, name: str, *, lora: bool, device: str, tiny: bool, seq: int, batch: int):
    import bench_dpsgd as b
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    cfg = (
        BertConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=1000,
            max_position_embeddings=seq,
            num_labels=2,
        )
        if tiny
        else BertConfig(num_labels=2)
    )  # BertConfig() is bert-base-uncased's shape

    def make():
        torch.manual_seed(0)
        m = BertForSequenceClassification(cfg)
        if lora:
            from peft import LoraConfig, get_peft_model

            m = get_peft_model(
                m,
                LoraConfig(
                    r=8,
                    lora_alpha=16,
                    lora_dropout=0.0,
                    target_modules=["query", "value"],
                    modules_to_save=["classifier"],
                ),
            )
        return m.to(device)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
    pos = torch.arange(seq).repeat(batch, 1).to(device)  # per example: every layer sees the batch first
    types = torch.zeros(batch, seq, dtype=torch.long, device=device)
    y = torch.randint(0, 2, (batch,), generator=g).to(device)
    return b.Task(
        key,
        name,
        make,
        lambda m: m(input_ids=ids, position_ids=pos, token_type_ids=types).logits,
        lambda out, crit, ghost: crit(out, y),
        batch,
        batch * seq,
        "tokens/s",
    )


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def build_groups(keys: list[str], device: str, tiny: bool) -> list[Any]:
    import bench_dpsgd as b

    groups = []
    if "noise" in keys:
        for n in (100_000, 1_000_000) if tiny else (10_000_000, 124_439_808):
            groups.append(b.noise_group(n, device))
    skip_opacus = None if _have("opacus") else "skipped: opacus not installed"

    def training(task_fn, key: str, name: str, unit: str, items: int, needs: tuple[str, ...], extra=None) -> Any:
        missing = [m for m in needs if not _have(m)]
        if missing:
            g = b.Group(key, name, unit, items, ("torch", "non-private"))
            g.configs = [b.Config("all", "all", None, f"skipped: {', '.join(missing)} not installed")]
            return g
        task = task_fn()
        g = b.Group(key, task.name, task.unit, task.items, ("torch", "non-private"))
        g.configs = [b.Config("torch", "non-private", lambda: b.step_nonprivate(task))]
        g.configs.append(
            b.Config(
                "Opacus 1.6",
                "ghost",
                (lambda: b.step_opacus(task, "ghost")) if not skip_opacus else None,
                skip_opacus or "ok",
            )
        )
        for noise in ("lattice", "continuous"):
            g.configs.append(
                b.Config("dpkit", f"fast path, {noise} noise", lambda noise=noise: b.step_dpkit(task, "fast", noise))
            )
        if extra is not None:
            g.configs += extra()
        return g

    gpt = (
        dict(n_layer=2, n_embd=64, n_head=4, vocab=1000, seq=32, batch=4)
        if tiny
        else dict(n_layer=12, n_embd=768, n_head=12, vocab=50257, seq=256, batch=16)
    )
    bert = dict(seq=32, batch=4) if tiny else dict(seq=128, batch=32)
    rn = dict(width=8, batch=16) if tiny else dict(width=64, batch=256)
    if "gpt2" in keys:
        groups.append(
            training(
                lambda: b.gpt2_task(
                    "gpt2", "GPT-2 small (untied), seq 256" if not tiny else "GPT-2 tiny", device=device, **gpt
                ),
                "gpt2",
                "GPT-2 small",
                "tokens/s",
                gpt["batch"] * gpt["seq"],
                ("transformers",),
                extra=lambda: b.stock_gpt2_configs({"dpkit", "opacus"}, device=device, **gpt),
            )
        )
    if "bert" in keys:
        groups.append(
            training(
                lambda: bert_task(
                    "bert",
                    "BERT-base, full" if not tiny else "BERT tiny, full",
                    lora=False,
                    device=device,
                    tiny=tiny,
                    **bert,
                ),
                "bert",
                "BERT-base, full",
                "tokens/s",
                bert["batch"] * bert["seq"],
                ("transformers",),
            )
        )
    if "bert-lora" in keys:
        groups.append(
            training(
                lambda: bert_task(
                    "bert-lora",
                    "BERT-base, LoRA r=8" if not tiny else "BERT tiny, LoRA",
                    lora=True,
                    device=device,
                    tiny=tiny,
                    **bert,
                ),
                "bert-lora",
                "BERT-base, LoRA r=8",
                "tokens/s",
                bert["batch"] * bert["seq"],
                ("transformers", "peft"),
            )
        )
    if "resnet" in keys:
        groups.append(
            training(
                lambda: b.classifier_task(
                    "resnet",
                    f"ResNet-18 GroupNorm, 32x32, batch {rn['batch']}",
                    lambda: resnet18_gn(width=rn["width"]),
                    (3, 32, 32),
                    batch=rn["batch"],
                    device=device,
                ),
                "resnet",
                "ResNet-18 GroupNorm",
                "samples/s",
                rn["batch"],
                (),
            )
        )
    return groups


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    import _report

    lines = [
        f"DP-SGD on {meta['device_name']} ({meta['date']}, torch {meta['versions']['torch']}, "
        f"opacus {meta['versions']['opacus']}, transformers {meta['versions']['transformers']}, peft {meta['versions']['peft']})."
    ]
    headers = [
        "row",
        "library",
        "configuration",
        "throughput (best)",
        "(median)",
        "× torch.randn / × slower than non-private",
        "÷ Opacus ghost",
        "peak GiB (group)",
    ]
    cells = []
    for r in rows:
        ok = "best" in r
        if r.get("kind") == "noise":
            ratio = f"{r['ratio_to_reference']:.2f}× randn" if ok and "ratio_to_reference" in r else "—"
        else:
            ratio = f"{1 / r['ratio_to_reference']:.2f}" if ok and "ratio_to_reference" in r else "—"
        unit = r.get("unit", "")
        cells.append(
            [
                r["model"],
                r["library"],
                r["config"]
                + (f" ({r['dtype']})" if r.get("dtype") else "")
                + (f", sampler {r['sampler']}" if r.get("sampler") else ""),
                f"{r['best']:,.0f} {unit}" if ok else r["status"][:200],
                f"{r['median']:,.0f}" if ok else "—",
                ratio,
                f"{r['ratio_to_opacus_ghost']:.2f}" if ok and "ratio_to_opacus_ghost" in r else "—",
                f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else "—",
            ]
        )
    notes = [
        "compute only: forward, backward, per-example clipping, noise, optimizer step (SGD) on a fixed random batch on the GPU; "
        f"float32, matmul precision '{meta['float32_matmul_precision']}'",
        f"best and median of {meta['rounds']} interleaved rounds of 1–{meta['max_steps']} steps after {meta['warmup']} timed warm-up steps",
        "Opacus: ghost clipping (layers without a ghost norm sampler, e.g. HF Conv1D and GroupNorm, use its per-example "
        "gradients), float32 torch.normal noise; dpkit: fast path (ghost clipping / book-keeping; torch.func for other "
        "layers), 'lattice' = exact discrete Gaussian (default), 'continuous' = Box–Muller on CSPRNG words",
    ]
    return _report.markdown(lines[0], headers, headers[:3], cells, notes)


def _smoke_without_gpu() -> int:
    """A smoke run without a CUDA device: what this benchmark takes from bench_dpsgd.py must exist."""
    _smoke.skip("every GPU row", "no CUDA device (on a CPU, bench_dpsgd.py --smoke runs the same code paths)")
    return _smoke.finish(_smoke.missing("bench_dpsgd", *SHARED))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated subset of {', '.join(GROUPS)}")
    ap.add_argument("--out", type=Path, default=_out_default())
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=5, help="steps per round at most (rounds × this ≈ timed steps)")
    ap.add_argument("--round-seconds", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--allow-cpu", action="store_true", help="run without CUDA (plumbing check only)")
    ap.add_argument("--tiny", action="store_true", help="tiny models and sizes (plumbing check)")
    _smoke.add_flag(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.rounds, args.max_steps, args.warmup, args.round_seconds, args.tiny = 1, 1, 1, 0.0, True
        args.out = _smoke.out_path("dpsgd_gpu.json")
    keys = [k.strip() for k in args.only.split(",") if k.strip()]
    bad = [k for k in keys if k not in GROUPS]
    if bad:
        print(f"bench_dpsgd_gpu: unknown group(s) {bad}; choose from {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    if args.smoke and shutil.which("nvidia-smi") is None:  # no NVIDIA driver, no CUDA: spare the torch import
        return _smoke_without_gpu()
    try:
        import torch
    except ImportError as exc:
        print(
            f"bench_dpsgd_gpu: torch is not importable ({exc}); run it with a Python that has CUDA torch "
            "(bash benchmarks/gpu_dpsgd.sh picks one)",
            file=sys.stderr,
        )
        return 2
    if args.smoke and not torch.cuda.is_available():
        return _smoke_without_gpu()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            f"bench_dpsgd_gpu: no CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda}): the GPU "
            "rows need one. Run `bash benchmarks/gpu_dpsgd.sh` on a GPU machine (or --allow-cpu --tiny to check the "
            "plumbing here).",
            file=sys.stderr,
        )
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _report
    import bench_dpsgd as b

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    t_start = time.perf_counter()
    print(f"[gpu] {name}; torch {torch.__version__}; groups {keys}", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    meta = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "device_name": name,
        "device": device,
        "python": platform.python_version(),
        "tiny": args.tiny,
        "rounds": args.rounds,
        "max_steps": args.max_steps,
        "warmup": args.warmup,
        "round_seconds": args.round_seconds,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "versions": {d: _report.version(d) for d in ("dpkit", "torch", "opacus", "transformers", "peft", "numpy")},
        "cuda": torch.version.cuda,
    }
    for g in build_groups(keys, device, args.tiny):
        t0 = time.perf_counter()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            got = b.measure_group(
                g,
                rounds=args.rounds,
                round_seconds=args.round_seconds,
                sync=sync,
                min_steps=1,
                max_steps=args.max_steps,
                warmup=args.warmup,
                log=lambda s: print(s.replace("[bench]", "[gpu]"), file=sys.stderr, flush=True),
            )
        except Exception as exc:  # noqa: BLE001 - one broken group must not lose the others
            got = [
                {"group": g.key, "model": g.name, "library": "all", "config": "all", "status": f"error: {b._err(exc)}"}
            ]
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
        for r in got:
            r["peak_gib"] = peak
            r["group_seconds"] = time.perf_counter() - t0
        rows += got
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        print(
            f"[gpu] {g.name}: {time.perf_counter() - t0:.0f} s (total {time.perf_counter() - t_start:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        # write after every group: a run cut short keeps what it measured
        meta["seconds"] = time.perf_counter() - t_start
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, ensure_ascii=False) + "\n")
    md = markdown(meta, rows)
    args.out.with_suffix(".md").write_text(md + "\n")
    print(
        f"[gpu] wrote {args.out} and {args.out.with_suffix('.md')} in {time.perf_counter() - t_start:.0f} s",
        file=sys.stderr,
    )
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
