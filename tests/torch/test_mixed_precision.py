"""Mixed precision: forward and backward under ``torch.autocast`` (bf16, fp16 on CPU), with the
per-example norms, clip factors and clipped sum computed in float32 or wider — never in half
precision — and the release on the float64 lattice.

"Never in half precision" is checked by watching every aten operation that ``optimizer.step()``
runs (a ``TorchDispatchMode``): the only ones with a half-precision input are the conversions
that widen it.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dpkit.torch import make_private  # noqa: E402

SEED = 31337
N, BATCH = 240, 24
HALF = (torch.float16, torch.bfloat16)
CONVERSIONS = {"aten._to_copy.default", "aten.copy_.default", "aten.detach.default", "aten.alias.default"}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest.py)


def _models():
    """Each fast path and a torch.func unit: Linear (one position), LayerNorm (vmap), Conv2d
    (several positions: the ghost Gram or the materialised per-example gradient), Embedding."""
    g = torch.Generator().manual_seed(SEED)
    return {
        "mlp": (
            lambda: nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 2)),
            torch.randn(N, 6, generator=g),
        ),
        "conv": (
            lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)),
            torch.randn(N, 1, 8, 8, generator=g),
        ),
        "embedding": (
            lambda: nn.Sequential(nn.Embedding(20, 8), nn.Flatten(), nn.Linear(8 * 5, 2)),
            torch.randint(0, 20, (N, 5), generator=g),
        ),
    }


MODELS = _models()


def _autocast_dtypes():
    out = [torch.bfloat16]
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            nn.Linear(2, 2)(torch.randn(1, 2))
        out.append(torch.float16)
    except (RuntimeError, AssertionError):  # pragma: no cover - an older torch without CPU fp16 autocast
        pass
    return out


DTYPES = _autocast_dtypes()


class HalfPrecisionOps(TorchDispatchMode):
    """Records the aten operations that take a half-precision tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves, _ = tree_flatten((args, kwargs))
        if any(isinstance(t, torch.Tensor) and t.dtype in HALF for t in leaves):
            self.ops[str(func)] = self.ops.get(str(func), 0) + 1
        return func(*args, **kwargs)


class RecordingNoise:
    """The optimizer's noise plan, recording what each release gets and returns."""

    def __init__(self, plan) -> None:
        self.plan = plan
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __getattr__(self, name):
        return getattr(self.plan, name)

    def release(self, flat, src):
        given = flat.clone()
        out = self.plan.release(flat, src)
        self.calls.append((given, out.clone()))
        return out


def setup(name: str, **kwargs):
    make, x = MODELS[name]
    torch.manual_seed(0)
    model = make()
    y = (torch.arange(N) % 2).long()
    return make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(TensorDataset(x, y), batch_size=BATCH),
        noise_multiplier=1.0,
        delta=1e-5,
        epochs=1,
        max_grad_norm=1.0,
        rng=np.random.default_rng(SEED),
        **kwargs,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("step_inside", [False, True], ids=["step-after", "step-inside"])
def test_a_step_under_autocast_clips_and_sums_in_float32_or_wider(name: str, dtype, step_inside: bool) -> None:
    private = setup(name)
    model, opt, loader = private
    recorder = RecordingNoise(opt.noise)
    opt.noise = recorder
    x, y = next(iter(loader))
    before = [p.detach().clone() for p in model.parameters()]
    watch = HalfPrecisionOps()
    with torch.autocast("cpu", dtype=dtype):
        out = model(x)
        assert out.dtype == dtype  # the forward really ran in half precision
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        if step_inside:
            with watch:
                opt.step()
    if not step_inside:
        with watch:
            opt.step()
    assert opt.steps == 1 and opt.released
    assert set(watch.ops) <= CONVERSIONS, watch.ops  # nothing but widening touched a half tensor
    assert opt.last_norms is not None and opt.last_norms.dtype in (torch.float32, torch.float64)
    assert opt.last_norms.shape == (len(x),) and bool(torch.isfinite(opt.last_norms).all())
    ((given, released),) = recorder.calls
    assert given.dtype == released.dtype == torch.float64  # lattice noise: the float64 release
    k = released / opt.noise.lattice.granularity
    assert torch.equal(k, torch.round(k))  # on the lattice
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(
        bool(torch.isfinite(p).all()) and not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True)
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(MODELS))
def test_under_autocast_each_example_is_clipped_to_exactly_c(name: str, dtype) -> None:
    """One example at a time under autocast, with C far below every gradient norm: the clipped
    gradient has norm C·(1 − margin) to float32 rounding — the norm the clip factor used is the
    norm of the (widened) gradient that is summed, and the recorded tensors were widened to
    float32 before anything was computed from them."""
    from dpkit.torch.optimizer import _autocast_off, _widen_recorded

    private = setup(name, noise="continuous")
    model, opt, _ = private
    engine = opt.engine
    clip = 1e-3
    x_all, y_all = MODELS[name][1][:6], (torch.arange(6) % 2).long()
    for i in range(6):
        with torch.autocast("cpu", dtype=dtype):
            nn.functional.cross_entropy(model(x_all[i : i + 1]), y_all[i : i + 1]).backward()
        with _autocast_off(engine.params):
            _widen_recorded(engine)
            dtypes = {
                t.dtype for u in engine.units for c in u.calls for t in (*c.args, *c.grads) if t.is_floating_point()
            }
            sums, batch, norms = engine.clipped_sum(clip, torch.float64)
        assert batch == 1 and dtypes == {torch.float32}
        assert norms.dtype == torch.float64 and float(norms[0]) > 10 * clip
        got = float(torch.cat([s.reshape(-1) for s in sums]).norm())
        assert got == pytest.approx(clip * (1 - engine.last_margin), rel=1e-5)
        assert got <= clip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_training_under_autocast_with_virtual_batches(dtype) -> None:
    private = setup("mlp", max_physical_batch_size=5)
    model, opt, loader = private
    for x, y in loader:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    assert opt.steps == len(loader) == N // BATCH
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
