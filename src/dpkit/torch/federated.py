"""Differentially private federated averaging with client-level privacy (DP-FedAvg).

The algorithm is DP-FedAvg of McMahan, Ramage, Talwar & Zhang (2018), *Learning differentially
private recurrent language models* (ICLR), Algorithm 1 with uniform client weights and the
fixed-denominator estimator. Each round ``t = 1 … T``:

1. every client is kept independently with probability q = ``sample_rate`` (Poisson sampling; the coins come
   from dpkit's secure source, :func:`dpkit.noise.integers.bernoulli`, not from ``torch`` or
   ``random``);
2. each sampled client starts from the global model θ and runs ``local_steps`` (or
   ``local_epochs``) of plain SGD on its own data, giving the update Δ_k = θ_k − θ;
3. each update is clipped to ℓ2 norm C = ``max_grad_norm`` *as one vector over all parameters*;
4. the server adds Gaussian noise with standard deviation σ·C to the **sum** of the
   clipped updates and divides by the *expected* number of sampled clients ``q·n`` (a public
   constant, never the realised count), then steps θ ← θ + ``server_lr`` · average.

Privacy unit and neighbours: one *client* (all of its examples together), ``add_remove``. Adding
or removing one client changes the clipped sum by at most C in ℓ2 (its own clipped
update; the others do not depend on it within the round). One round is therefore the Poisson
subsampled Gaussian mechanism with noise multiplier σ, and the run is the adaptive composition of
``rounds`` of them::

    event_ = SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(σ)), rounds)

(``GaussianEvent(σ)`` alone when q = 1), priced by an RDP (Mironov, Talwar & Zhang 2019) or PLD
accountant. The number of clients n enters the denominator q·n and is treated as public, as in
McMahan et al.; pass ``expected_clients_per_round`` to fix that constant from public knowledge
instead. Only the model's parameters are aggregated; buffers (e.g. batch-norm statistics) stay
those of the global model.

Noise (floating-point safe; docs/architecture.md, "The noise layer"): the sum is not formed in
floating point. Every clipped update is snapped to the lattice g·ℤ^d, g = 2^k, chosen from
σ·C, the dimension d and n only (never from the data): r_k = round(Δ_k / g) as exact int64,
summed exactly in int64, plus exact discrete Gaussian noise on ℤ (Canonne, Kamath & Steinke 2020)
drawn from the secure source, and only then multiplied by g. Neighbouring integer sums differ by r_k
with ‖r_k‖₂ ≤ C/g + √d/2, so the lattice noise parameter is σ·(C/g + √d/2), rounded *up* to a
multiple of 2^-8: the noise multiplier actually used is at least σ (and exceeds it by a relative
√d·g/(2·C), about 2^-40·σ). The discrete Gaussian at this scale (σ/g ≈ 2^40) differs from the
continuous one by O(2^-78) in δ per round (see :mod:`dpkit.mechanisms.gaussian`); σ is calibrated
and ε reported at δ·(1 − 2^-20), which covers that for ``rounds`` · 2^-58 <= δ. The resulting float
tensor is post-processing of the exact noisy integer.

Paying: :meth:`FederatedAveraging.fit` spends ``event_`` on ``budget`` (if given) for the whole
run *before* any client is sampled or any update computed; a refusal raises
:class:`~dpkit.errors.BudgetExceededError` and leaves the model untouched. Every argument is
validated in the constructor, so bad input never debits anything.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from dpkit import _validate as v
from dpkit._validate import short_repr
from dpkit.accounting.calibration import calibrate_noise_multiplier, dp_sgd_event
from dpkit.accounting.events import DPEvent
from dpkit.accounting.registry import resolve_accountant
from dpkit.budget import Budget
from dpkit.errors import DPError, InvalidDataError, InvalidParameterError
from dpkit.noise.discrete import sample_discrete_gaussian
from dpkit.noise.integers import bernoulli
from dpkit.noise.lattice import (  # covers the lattice's O(2^-78) per round (module docstring)
    DELTA_MARGIN,
    exact_lattice_sum,
)
from dpkit.noise.source import RNG, RandomSource, resolve_rng

__all__ = ["FederatedAveraging", "ClientData"]

ClientData = Any  # a (features, labels) pair of tensors / arrays, or a torch Dataset of such pairs

_SUPPORTED_ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")  # the registry names that price DP-FedAvg rounds
_CLIP_SHRINK = 1.0 - 2.0**-30  # clipping aims a hair inside the ball: float rounding never exits it
_BASE_BITS, _MAX_BITS = 40, 47  # lattice g about 2^-40 of σ·clip (finer for large d), as dpkit.noise.lattice
_SUM_LIMIT = 2**60  # bound on |exact integer sum| (int64 headroom for the noise)


def _lattice_exponent(scale: float, clip: float, dim: int, n_clients: int) -> int:
    """k with g = 2^k: about 2^-40 of the noise scale σ·clip (finer for long vectors), coarsened
    when needed so that one client's coordinates (< 2^52) and the n-client sum (<= 2^60) are exact
    in float64 / int64. Depends on σ, clip, d and n only."""
    bits = min(_BASE_BITS + max(0, math.ceil(math.log2(max(math.sqrt(dim), 1.0)))), _MAX_BITS)
    k = math.floor(math.log2(scale)) - bits
    while clip / math.ldexp(1.0, k) + 1 >= 2.0**52 or n_clients * (clip / math.ldexp(1.0, k) + 1) > _SUM_LIMIT:
        k += 1
    return k


def _as_tensor(value: Any, name: str, *, dtype: torch.dtype | None) -> torch.Tensor:
    """``value`` as a tensor of real numbers (cast to ``dtype`` when given), finite."""
    try:
        t = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    except Exception as exc:
        raise InvalidDataError(name, f"cannot be read as a tensor ({exc})", "a tensor or array of numbers") from exc
    if t.dtype == torch.bool or t.dtype.is_complex:
        raise InvalidDataError(name, f"has dtype {t.dtype}", "real numbers")
    if dtype is not None:
        t = t.to(dtype)
    if t.dtype.is_floating_point and not bool(torch.isfinite(t).all()):
        raise InvalidDataError(name, "holds a non-finite value", "finite numbers")
    return t


def _client_tensors(client: ClientData, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A client's data as (X, y) tensors with the same first dimension >= 1."""
    name = f"clients[{k}]"
    accepted = "a (features, labels) pair of tensors/arrays, or a torch Dataset of (x, y) pairs"
    if isinstance(client, torch.utils.data.Dataset) and not isinstance(client, (tuple, list)):
        try:
            n = len(client)  # type: ignore[arg-type]
            items = [client[i] for i in range(n)]
            xs = torch.stack([torch.as_tensor(it[0]) for it in items]) if n else torch.empty(0)
            ys = torch.stack([torch.as_tensor(it[1]) for it in items]) if n else torch.empty(0)
        except Exception as exc:
            raise InvalidDataError(name, f"could not be read as (x, y) pairs ({exc})", accepted) from exc
        client = (xs, ys)
    if not isinstance(client, (tuple, list)) or len(client) != 2:
        raise InvalidDataError(name, f"is {short_repr(client, 80)}", accepted)
    X = _as_tensor(client[0], f"{name} features", dtype=dtype)
    y = _as_tensor(client[1], f"{name} labels", dtype=None)
    if X.ndim == 0 or X.shape[0] == 0:
        raise InvalidDataError(name, "holds no examples", "at least one example per client")
    if y.ndim == 0 or y.shape[0] != X.shape[0]:
        raise InvalidDataError(name, f"has {X.shape[0]} feature rows but labels of shape {tuple(y.shape)}", accepted)
    y = y.to(dtype) if y.dtype.is_floating_point else y.to(torch.long)
    return X, y


class FederatedAveraging:
    """DP federated averaging (DP-FedAvg) with client-level (ε, δ)-DP; see the module docstring
    for the algorithm, the theorem, the neighbour relation and the noise.

    Parameters (keyword-only after the model)
    -----------------------------------------
    model:
        A ``torch.nn.Module`` (deep-copied: the argument itself is never modified) or a
        zero-argument callable returning one. The copy is the global model, ``model_``.
    clients:
        A non-empty sequence of per-client datasets: ``(features, labels)`` pairs of tensors or
        numpy arrays, or torch ``Dataset`` objects yielding ``(x, y)`` pairs. Features (and
        float labels) are cast to the model's parameter dtype; integer labels to ``long``.
    sample_rate:
        q in (0, 1], the probability that each client takes part in a round (Poisson sampling).
    rounds:
        T, the number of rounds (an integer >= 1).
    local_steps / local_epochs:
        Local work per sampled client: ``local_steps`` SGD steps on minibatches drawn with
        replacement, or ``local_epochs`` passes over shuffled minibatches. At most one may be
        given; default one epoch.
    batch_size:
        Local minibatch size; ``None`` (default) uses the client's whole data in every step.
    local_lr, server_lr:
        Client SGD step size and the server's step on the averaged update (default 1.0: plain
        averaging as in FedAvg).
    max_grad_norm:
        The ℓ2 bound on each client's whole-model update (> 0), named as DP-SGD's clipping norm.
    noise_multiplier / epsilon:
        Exactly one: σ itself, or a target ε for which the smallest σ is found by
        :func:`~dpkit.accounting.calibrate_noise_multiplier` (and re-checked).
    delta:
        δ in (0, 1) at which ε is reported (and calibrated). Required: client-level δ should be
        well below 1/n.
    accountant:
        ``"rdp"`` (default) or ``"pld"`` (tighter, a little slower).
    budget:
        An optional :class:`~dpkit.budget.Budget` (with an accountant that supports Gaussian
        events, e.g. ``accountant=RDPAccountant``) that :meth:`fit` spends ``event_`` on first.
    expected_clients_per_round:
        The public denominator of the average; default ``q · len(clients)``.
    loss:
        ``loss(outputs, labels) -> scalar`` for local training; default cross-entropy.
    rng:
        ``None`` (default): client sampling and noise from the secure CSPRNG. A seeded
        ``numpy.random.Generator`` (tests, teaching; *not* secure) makes the run reproducible.
    progress:
        Show a ``rich`` progress bar with the running ε.

    Speed: clients train one after another; for tiny models on a busy machine,
    ``torch.set_num_threads(1)`` avoids thread-pool contention (often 10× faster).

    Attributes (known from construction: the price is set before anything runs)
    ---------------------------------------------------------------------------
    noise_multiplier_: σ. event_: the event of one :meth:`fit`. epsilon_: its ε at ``delta``.
    epsilon: the target ε given (None when ``noise_multiplier`` was). model_: the global model.

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> clients = [(torch.randn(8, 3, generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(20)]
    >>> import numpy as np
    >>> fed = FederatedAveraging(torch.nn.Linear(3, 2), clients=clients, sample_rate=0.5, rounds=3,
    ...                          local_lr=0.1, max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-3,
    ...                          rng=np.random.default_rng(0))
    >>> fed.event_
    SelfComposedEvent(event=PoissonSampledEvent(sampling_probability=0.5, event=GaussianEvent(noise_multiplier=1.0, neighbours='add_remove')), count=3)
    >>> model = fed.fit()
    """

    def __init__(
        self,
        model: nn.Module | Callable[[], nn.Module],
        *,
        clients: Sequence[ClientData],
        sample_rate: float,
        rounds: int,
        local_lr: float,
        max_grad_norm: float,
        delta: float,
        noise_multiplier: float | None = None,
        epsilon: float | None = None,
        local_steps: int | None = None,
        local_epochs: int | None = None,
        batch_size: int | None = None,
        server_lr: float = 1.0,
        accountant: Literal["rdp", "pld"] = "rdp",
        budget: Budget | None = None,
        expected_clients_per_round: float | None = None,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        rng: RNG = None,
        progress: bool = False,
    ) -> None:
        # -- the model -------------------------------------------------------------------------
        if isinstance(model, nn.Module):
            self.model_ = copy.deepcopy(model)
        elif callable(model):
            built = model()
            if not isinstance(built, nn.Module):
                raise InvalidParameterError(
                    "model",
                    short_repr(model, 80),
                    "a torch.nn.Module or a callable returning one",
                    f"it returned {short_repr(built, 80)}",
                )
            self.model_ = built
        else:
            raise InvalidParameterError(
                "model", short_repr(model, 80), "a torch.nn.Module or a zero-argument callable returning one"
            )
        self._names = [name for name, p in self.model_.named_parameters() if p.requires_grad]
        if not self._names:
            raise InvalidParameterError(
                "model", type(self.model_).__name__, "a module with at least one trainable parameter"
            )
        self._dim = sum(p.numel() for name, p in self.model_.named_parameters() if p.requires_grad)

        # -- the clients -------------------------------------------------------------------------
        if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence) or len(clients) == 0:
            raise InvalidParameterError("clients", short_repr(clients, 80), "a non-empty list of per-client datasets")
        dtype = next(p.dtype for p in self.model_.parameters() if p.requires_grad)
        self._clients = [_client_tensors(c, k, dtype) for k, c in enumerate(clients)]
        n = len(self._clients)

        # -- the algorithm -------------------------------------------------------------------------
        self.sample_rate = v.probability(sample_rate, "sample_rate", high_open=False)
        self.rounds = v.positive_int(rounds, "rounds")
        self.local_lr = v.positive(local_lr, "local_lr")
        self.server_lr = v.positive(server_lr, "server_lr")
        self.max_grad_norm = v.positive(max_grad_norm, "max_grad_norm")
        if local_steps is not None and local_epochs is not None:
            raise InvalidParameterError(
                "local_epochs",
                local_epochs,
                "None when local_steps is given",
                "give local_steps or local_epochs, not both",
            )
        self.local_steps = None if local_steps is None else v.positive_int(local_steps, "local_steps")
        self.local_epochs = (
            1
            if local_steps is None and local_epochs is None
            else (None if local_epochs is None else v.positive_int(local_epochs, "local_epochs"))
        )
        self.batch_size = None if batch_size is None else v.positive_int(batch_size, "batch_size")
        if expected_clients_per_round is None:
            self.expected_clients_per_round = self.sample_rate * n
        else:
            self.expected_clients_per_round = v.positive(expected_clients_per_round, "expected_clients_per_round")
        if loss is None:
            loss = nn.functional.cross_entropy
        if not callable(loss):
            raise InvalidParameterError(
                "loss", short_repr(loss, 80), "a callable loss(outputs, labels) -> scalar tensor"
            )
        self.loss = loss
        if not isinstance(progress, bool):
            raise InvalidParameterError("progress", progress, "True or False")
        self.progress = progress

        # -- privacy -------------------------------------------------------------------------------
        self.delta = v.delta(delta, allow_zero=False)
        if self.delta < self.rounds * 2.0**-58:
            raise InvalidParameterError(
                "delta",
                delta,
                f"a number in [rounds·2**-58, 1) = [{self.rounds * 2.0**-58:.3g}, 1)",
                "the lattice noise's O(2**-78) per-round slack must fit in δ·2**-20",
            )
        if not isinstance(accountant, str) or accountant not in _SUPPORTED_ACCOUNTANTS:
            raise InvalidParameterError("accountant", accountant, "'rdp' or 'pld'")
        self.accountant = accountant
        self._factory = resolve_accountant(accountant)
        if budget is not None and not isinstance(budget, Budget):
            raise InvalidParameterError("budget", short_repr(budget, 80), "a dpkit.Budget or None")
        self.budget = budget
        self._src: RandomSource = resolve_rng(rng)
        if (noise_multiplier is None) == (epsilon is None):
            raise InvalidParameterError(
                "noise_multiplier",
                noise_multiplier,
                "a number > 0 when epsilon is None, else None",
                "give exactly one of noise_multiplier and epsilon",
            )
        self.epsilon: float | None
        if noise_multiplier is not None:
            self.noise_multiplier_ = v.positive(noise_multiplier, "noise_multiplier")
            self.epsilon = None
        else:
            self.epsilon = v.epsilon(epsilon, "epsilon")
            self.noise_multiplier_ = calibrate_noise_multiplier(
                epsilon=self.epsilon,
                delta=self.delta * DELTA_MARGIN,
                accountant=self._factory,
                sample_rate=self.sample_rate,
                steps=self.rounds,
            )
        self.event_: DPEvent = dp_sgd_event(self.noise_multiplier_, self.sample_rate, self.rounds)
        self.epsilon_: float = self.epsilon_after(self.rounds)
        if budget is not None:
            budget.can_spend(self.event_)  # unsupported event types raise here, before anything runs

        # -- the noise plan (a function of σ, clip, d and n only) ---------------------------------
        self._exponent = _lattice_exponent(
            self.noise_multiplier_ * self.max_grad_norm, self.max_grad_norm, self._dim, n
        )
        g = Fraction(math.ldexp(1.0, self._exponent))
        root = Fraction(math.nextafter(math.sqrt(self._dim), math.inf))
        self._lattice_sensitivity = Fraction(self.max_grad_norm) / g + root / 2
        self._lattice_sigma = Fraction(
            math.ceil(Fraction(self.noise_multiplier_) * self._lattice_sensitivity * 256), 256
        )

    # -- accounting ------------------------------------------------------------------------------

    def epsilon_after(self, rounds: int) -> float:
        """ε at ``delta`` of the first ``rounds`` rounds, with this run's accountant."""
        t = v.positive_int(rounds, "rounds")
        return (
            self._factory()
            .compose(dp_sgd_event(self.noise_multiplier_, self.sample_rate, t))
            .get_epsilon(self.delta * DELTA_MARGIN)
        )

    @property
    def granularity(self) -> float:
        """g, the spacing of the lattice the noisy sum lives on."""
        return math.ldexp(1.0, self._exponent)

    @property
    def lattice_noise_multiplier(self) -> float:
        """The noise multiplier actually drawn: lattice σ / lattice sensitivity (>= σ)."""
        return float(self._lattice_sigma / self._lattice_sensitivity)

    # -- one client --------------------------------------------------------------------------------

    def _global_params(self) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in self.model_.named_parameters() if p.requires_grad}

    def _flat(self, params: dict[str, torch.Tensor]) -> np.ndarray:
        return torch.cat([params[k].reshape(-1).to(torch.float64) for k in self._names]).numpy()

    def _client_update(self, k: int, *, generator: torch.Generator | None = None) -> np.ndarray:
        """Client ``k``'s clipped update from the current global model, as a float64 vector with
        ℓ2 norm <= C = ``max_grad_norm`` (a non-finite update, e.g. from divergence, counts as zero). Private
        data: never returned to the user."""
        X, y = self._clients[k]
        start = self._global_params()
        params = {name: t.clone().requires_grad_(True) for name, t in start.items()}
        frozen = {name: p.detach() for name, p in self.model_.named_parameters() if name not in params}
        buffers = {name: b for name, b in self.model_.named_buffers()}
        m = X.shape[0]
        for idx in self._local_batches(m, generator):
            out = functional_call(self.model_, {**params, **frozen, **buffers}, (X[idx],))
            loss = self.loss(out, y[idx])
            grads = torch.autograd.grad(loss, [params[name] for name in self._names], allow_unused=True)
            with torch.no_grad():
                for name, grad in zip(self._names, grads, strict=True):
                    if grad is not None:
                        params[name] -= self.local_lr * grad
        delta = self._flat({k2: p.detach() for k2, p in params.items()}) - self._flat(start)
        norm = float(np.linalg.norm(delta))
        if not math.isfinite(norm):
            return np.zeros(self._dim)
        if norm > self.max_grad_norm * _CLIP_SHRINK:
            delta *= self.max_grad_norm * _CLIP_SHRINK / norm
        return delta

    def _local_batches(self, m: int, generator: torch.Generator | None) -> Iterator[torch.Tensor | slice]:
        b = self.batch_size
        if self.local_steps is not None:
            for _ in range(self.local_steps):
                if b is None or b >= m:
                    yield slice(None)
                else:
                    yield torch.randint(0, m, (b,), generator=generator)
            return
        for _ in range(self.local_epochs or 1):
            if b is None or b >= m:
                yield slice(None)
                continue
            perm = torch.randperm(m, generator=generator)
            for s in range(0, m, b):
                yield perm[s : s + b]

    # -- one round -----------------------------------------------------------------------------

    def _lattice_sum(self, updates: Sequence[np.ndarray]) -> np.ndarray:
        """Σ round(Δ_k / g), exactly, as int64 (each |coordinate| < 2^52, the sum <= 2^60)."""
        if not updates:
            return np.zeros(self._dim, dtype=np.int64)
        scale = math.ldexp(1.0, -self._exponent)
        steps = np.rint(np.stack(updates) * scale).astype(np.int64)  # u·2^-k is exact; rint is exact
        return exact_lattice_sum(steps).astype(np.int64)  # |sum| <= 2^60 by the lattice's choice

    def _noisy_sum(self, updates: Sequence[np.ndarray]) -> np.ndarray:
        """g·(Σ round(Δ_k/g) + discrete Gaussian noise): the clipped sum plus noise of standard
        deviation ``lattice_noise_multiplier`` · C (>= σ·C) per coordinate."""
        total = self._lattice_sum(updates)
        noise = sample_discrete_gaussian(self._lattice_sigma, self._dim, self._src)
        if noise.size and int(np.abs(noise).max()) >= 2**61:  # pragma: no cover - about e^-(2^25) per draw
            raise DPError("discrete Gaussian draw beyond 2**61; nothing was released")
        return (total + noise).astype(np.float64) * self.granularity  # post-processing of exact integers

    def _round(self, generator: torch.Generator) -> None:
        n = len(self._clients)
        chosen = np.flatnonzero(bernoulli(self.sample_rate, n, rng=self._src)) if self.sample_rate < 1 else np.arange(n)
        updates = [self._client_update(int(k), generator=generator) for k in chosen]
        average = self._noisy_sum(updates) / self.expected_clients_per_round
        offset = 0
        with torch.no_grad():
            for p in self.model_.parameters():
                if not p.requires_grad:
                    continue
                size = p.numel()
                step = torch.from_numpy(average[offset : offset + size]).reshape(p.shape)
                p.copy_((p.detach().to(torch.float64) + self.server_lr * step).to(p.dtype))
                offset += size

    # -- the run ---------------------------------------------------------------------------------

    def fit(self, on_round: Callable[[int, nn.Module], None] | None = None) -> nn.Module:
        """Pay for the whole run, then train; returns the global model ``model_``.

        ``on_round(t, model)`` is called after round t (1-based) with the global model in
        ``eval()`` mode (e.g. to evaluate it on public data; the model is post-processing of the
        noisy rounds so far). Each call of :meth:`fit` runs ``rounds`` more rounds from
        the current global model and spends ``event_`` again.

        Raises :class:`~dpkit.errors.BudgetExceededError` (nothing trained, nothing sampled)
        when ``budget`` cannot pay for ``event_``.
        """
        if on_round is not None and not callable(on_round):
            raise InvalidParameterError(
                "on_round", short_repr(on_round, 80), "None or a callable on_round(round, model)"
            )
        if self.budget is not None:
            self.budget.spend(self.event_)  # pay first; refused → raises, nothing has run
        seed = int(self._src.words(1)[0] >> np.uint64(1))  # local minibatch order only
        generator = torch.Generator().manual_seed(seed)
        was_training = self.model_.training
        self.model_.train()
        try:
            with self._progress() as advance:
                for t in range(1, self.rounds + 1):
                    self._round(generator)
                    if on_round is not None:
                        self.model_.eval()
                        on_round(t, self.model_)
                        self.model_.train()
                    advance(t)
        finally:
            self.model_.train(was_training)
        return self.model_

    run = fit

    @contextlib.contextmanager
    def _progress(self) -> Iterator[Callable[[int], None]]:
        if not self.progress:
            yield lambda _t: None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (
            TextColumn("DP-FedAvg"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("ε = {task.fields[eps]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, transient=False) as bar:
            task = bar.add_task("rounds", total=self.rounds, eps="0")

            def advance(t: int) -> None:
                bar.update(task, completed=t, eps=f"{self.epsilon_after(t):.3f} (δ={self.delta:g})")

            yield advance

    def __repr__(self) -> str:
        return (
            f"FederatedAveraging(clients={len(self._clients)}, sample_rate={self.sample_rate}, rounds={self.rounds}, "
            f"max_grad_norm={self.max_grad_norm}, noise_multiplier={self.noise_multiplier_:.6g}, epsilon={self.epsilon_:.4g}, delta={self.delta:g})"
        )
