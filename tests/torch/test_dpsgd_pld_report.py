"""The PLD ε of a DP-SGD run, reported while it trains.

``make_private(accountant="pld")`` calibrates, stops and reports with privacy loss distributions;
a run accounted by RDP (the default) reports the PLD ε of the very same steps with
``get_epsilon(accountant="pld")``. Both are dpkit's accountants on exactly the run's event.
Deterministic: no statistical assertion.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dpkit.accounting import PLDAccountant, RDPAccountant  # noqa: E402
from dpkit.errors import InvalidParameterError  # noqa: E402
from dpkit.torch import make_private  # noqa: E402
from dpkit.torch.optimizer import LATTICE_DELTA_SHARE  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest.py)

SEED, N, BATCH, STEPS, DELTA = 20260611, 200, 20, 3, 1e-5


def _run(**kwargs: object):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(N, 3, generator=g)
    model = nn.Linear(3, 2)
    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=BATCH),
        delta=DELTA,
        epochs=1,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        rng=np.random.default_rng(SEED),
        **kwargs,
    )
    model, opt, loader = private
    for i, (xb, yb) in enumerate(loader):
        if i == STEPS:
            break
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    assert opt.steps == STEPS
    return private


def _priced(accountant: type, private) -> float:  # type: ignore[no-untyped-def]
    run = accountant().compose(private.optimizer.step_event, count=STEPS)
    return float(run.get_epsilon(DELTA * (1 - LATTICE_DELTA_SHARE)))


def test_a_pld_run_reports_the_pld_epsilon_live() -> None:
    private = _run(accountant="pld")
    pld, rdp = _priced(PLDAccountant, private), _priced(RDPAccountant, private)
    assert private.epsilon == private.optimizer.epsilon == pld
    assert pld < rdp


def test_an_rdp_run_reports_the_pld_epsilon_of_the_same_steps() -> None:
    private = _run()
    pld, rdp = _priced(PLDAccountant, private), _priced(RDPAccountant, private)
    assert private.epsilon == rdp  # the default is unchanged
    assert private.get_epsilon(accountant="pld") == private.optimizer.get_epsilon(accountant="pld") == pld
    assert pld < rdp
    assert private.get_epsilon(accountant="rdp") == rdp
    assert private.get_epsilon(1e-3, accountant="pld") < pld


def test_an_accountant_that_cannot_price_the_run_is_refused() -> None:
    private = _run()
    with pytest.raises(InvalidParameterError, match="accountant"):
        private.get_epsilon(accountant="zcdp")
    fixed = _run(poisson_sampling=False)
    with pytest.raises(InvalidParameterError, match="poisson_sampling=False"):
        fixed.get_epsilon(accountant="pld")
