"""dpkit.synth.split: the synthesizer refuses, before paying, an ε whose noise the samplers cannot
draw — σ below the exact discrete Gaussian's floor 2**-20 (too much ε), σ above MAX_SIGMA (too
little), a selection ε the exponential mechanism refuses — and the largest ε it accepts still fits.

Before the floor check, ``Synthesizer(epsilon=1e13, ...)`` on two columns was accepted, paid the
whole budget in ``fit`` and then raised ``sigma=... is not accepted`` from the sampler: the tests
below that fit at the boundary and refuse past it fail on that code (it accepted both sides).
Deterministic: fixed seeds; no assertion on a noisy value.
"""

from __future__ import annotations

import json
import math
import struct
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dpkit as dp
from dpkit.analytics import Categorical, Metadata, Numeric
from dpkit.errors import InvalidParameterError
from dpkit.noise import discrete
from dpkit.synth import Synthesizer
from dpkit.synth import measure as measure_module
from dpkit.synth import split as split_module
from dpkit.synth.split import MAX_SIGMA, MIN_SIGMA, split

TWO = Metadata(columns={"a": Categorical(("x", "y")), "b": Categorical(("u", "v"))}, row_level=True)
THREE = Metadata(
    columns={"sex": Categorical(("F", "M")), "age": Numeric(0, 100), "city": Categorical(("a", "b", "c"))},
    row_level=True,
)
DELTA = 1e-6


def _frame(n: int = 2_000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    sex = rng.choice(["F", "M"], n)
    city = np.where(sex == "F", rng.choice(["a", "b"], n), rng.choice(["b", "c"], n))
    return pd.DataFrame({"sex": sex, "age": np.where(sex == "F", 30.0, 60.0) + rng.normal(0, 4, n), "city": city})


def test_the_floor_is_the_samplers() -> None:
    """MIN_SIGMA is the discrete Gaussian's own floor: drawn at it, refused a double below it."""
    assert Fraction(MIN_SIGMA) == discrete._MIN_SCALE
    assert discrete.discrete_gaussian(MIN_SIGMA, 4, rng=np.random.default_rng(0)).tolist() == [0, 0, 0, 0]
    with pytest.raises(InvalidParameterError, match="sigma"):
        discrete.discrete_gaussian(math.nextafter(MIN_SIGMA, 0.0), 1, rng=np.random.default_rng(0))


@pytest.mark.parametrize("method", ["aim", "mst"])
@pytest.mark.parametrize("epsilon", [1e13, 1e15, 1e100, 1.7e308])
def test_too_much_epsilon_is_refused_before_paying(
    method: str, epsilon: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[int] = []
    monkeypatch.setattr(measure_module.TableCounts, "prepare", lambda self, salt: read.append(1))
    budget = dp.Budget(epsilon=1e308, delta=0.5, accountant="zcdp")
    with pytest.raises(InvalidParameterError) as err:
        Synthesizer(epsilon=epsilon, delta=DELTA, metadata=TWO, budget=budget, method=method).fit(
            pd.DataFrame({"a": ["x", "y"], "b": ["u", "v"]})
        )
    assert err.value.name == "epsilon" and err.value.value == epsilon
    text = str(err.value)
    assert "σ >= 2**-20" in text and "discrete Gaussian" in text and "at most " in text
    assert budget.events == () and budget.spent == (0.0, 0.0) and read == []


def _bits(x: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", x))[0])


def _double(i: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", i))[0])


#: THREE's cells with bins={"age": 4}: sex 2 + missing, age 4 + missing, city 3 + missing (AIM shares
#: the one-way ρ by cells, so the largest ε depends on them).
CELLS = (3, 5, 4)


def _accepted(method: str, d: int, rounds: int, epsilon: float) -> bool:
    try:
        split(method, d, rounds, epsilon, DELTA, cells=CELLS)
    except InvalidParameterError:
        return False
    return True


@pytest.mark.parametrize(("method", "rounds"), [("aim", 6), ("aim", 1), ("mst", 2)])
def test_the_largest_accepted_epsilon_fits_and_the_next_double_is_refused(method: str, rounds: int) -> None:
    """Bisection over the doubles (positive doubles order as their bits) finds the last accepted
    ε; a Synthesizer with it fits and spends, one with the next double is refused unpaid. The
    limit quoted in the refusal is itself accepted."""
    d = 3
    lo, hi = _bits(1.0), _bits(1e300)
    assert _accepted(method, d, rounds, _double(lo)) and not _accepted(method, d, rounds, _double(hi))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _accepted(method, d, rounds, _double(mid)) else (lo, mid)
    largest, refused = _double(lo), _double(hi)
    kwargs: dict[str, Any] = {"delta": DELTA, "metadata": THREE, "bins": {"age": 4}, "method": method}
    if method == "aim":
        kwargs["rounds"] = rounds
    budget = dp.Budget(epsilon=1e300, delta=0.5, accountant="zcdp")
    syn = Synthesizer(epsilon=largest, budget=budget, rng=np.random.default_rng(1), **kwargs).fit(_frame())
    plan = syn._plan
    assert min(*plan.sigma_ones, plan.sigma_two) >= MIN_SIGMA
    assert budget.events == (syn.event,) and syn.report is not None
    assert len(syn.sample(100)) == 100
    before = budget.spent
    with pytest.raises(InvalidParameterError) as err:
        Synthesizer(epsilon=refused, budget=budget, **kwargs).fit(_frame())
    assert err.value.name == "epsilon" and budget.spent == before
    quoted = float(str(err.value).split("at most ")[1].split(" ")[0])
    assert quoted <= largest and _accepted(method, d, rounds, quoted)


def test_too_little_epsilon_is_still_refused() -> None:
    with pytest.raises(InvalidParameterError, match=f"σ <= {MAX_SIGMA:g}") as err:
        Synthesizer(epsilon=1e-7, delta=1e-9, metadata=THREE)
    assert err.value.name == "epsilon"


def test_a_selection_epsilon_the_exponential_mechanism_refuses_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not reachable through the σ checks today (ρ finite and > 0 gives a finite selection ε > 0);
    kept so that a new split cannot hand the exponential mechanism an ε it refuses after paying."""
    monkeypatch.setattr(split_module, "_shares", lambda method, d, rounds, rho: (1.0, 1.0, math.inf))
    with pytest.raises(InvalidParameterError, match="exponential mechanism") as err:
        split("aim", 3, 6, 1.0, DELTA)
    assert err.value.name == "epsilon"
    with pytest.raises(InvalidParameterError, match="epsilon"):
        dp.Exponential(epsilon=math.inf)  # what the sampler would have said, after the debit


def test_a_bad_rng_is_refused_before_paying() -> None:
    budget = dp.Budget(epsilon=2.0, delta=1e-6, accountant="zcdp")
    with pytest.raises(InvalidParameterError) as err:
        Synthesizer(epsilon=1.0, delta=1e-9, metadata=THREE, budget=budget, rng=0)  # type: ignore[arg-type]
    assert err.value.name == "rng" and budget.events == ()


def test_dpkit_synth_refuses_it_and_writes_nothing(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dpkit.cli import app

    _frame(500).to_csv(tmp_path / "people.csv", index=False)
    (tmp_path / "meta.json").write_text(json.dumps(THREE.to_dict()))
    out = tmp_path / "out.csv"
    args = ["synth", str(tmp_path / "people.csv"), "--metadata", str(tmp_path / "meta.json"), "--epsilon", "1e14",
            "--delta", "1e-9", "--out", str(out), "--bins", "age=4"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and not out.exists()
    text = " ".join(result.output.split())
    assert "--epsilon" in text and "2**-20" in text
