"""The Dinur–Nissim reconstruction attack (seed 004 ch. 1, Thm 1.2) run as an analyst over HTTP.

A 200-row table holds one secret bit per person. The analyst asks 4n = 800 random subset sums
(``SELECT SUM(secret) FROM people WHERE id IN (...)``), each at the largest ε that lets all 800
fit the whole budget (ε = 1), solves the LP and rounds. Through the service every answer is
paid for and noised (Laplace, scale 800 on sums of at most 200), so the attack is reduced to
guessing: it must recover at most 65% of the bits. Against the attacks module's naive curator
(uniform noise ≤ 2 ≪ √n) the same attack recovers at least 95%, and against the service with a
budget far too large (ε = 4,000) it succeeds too — the test has power.

Error rates: the service draws its noise from the OS CSPRNG (a seeded generator is refused), so
the test is random. Reduced to guessing, the number of recovered bits behaves like
Binomial(200, ½) (300 offline runs of this attack against the same Laplace noise: mean 50.3%,
s.d. 3.6%, as the binomial's 3.5%), and P[Binomial(200, ½) ≥ 130] ≈ 1.3·10⁻⁵ is the
false-failure rate of the ≤ 65% assertion. (ε = 1 in all bounds any attacker's expected
accuracy per bit by e/(1 + e) ≈ 73%; the test checks the much stronger practical claim.) The
power checks fail with negligible probability: at ε = 5 per query the noise (scale 0.2) is far
below the rounding margin of the LP, and the naive curator's noise is seeded.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from _live_server import live_server  # noqa: E402
from dpkit.attacks import Curator, NaiveCurator, dinur_nissim_attack, split_epsilon  # noqa: E402
from dpkit.server import Service, create_app  # noqa: E402
from server._api import UNPACED  # noqa: E402

N = 200
QUERIES = 4 * N


class HTTPCurator(Curator):
    """Subset sums asked through the service's query endpoint, as the analyst would."""

    def __init__(self, x: np.ndarray, client: httpx.Client, key: str, epsilon: float) -> None:
        super().__init__(x)
        self._client, self._key, self._epsilon = client, key, epsilon
        self.statuses: list[int] = []

    def query_many(self, subsets: np.ndarray) -> np.ndarray:
        answers = np.zeros(len(subsets))
        for i, row in enumerate(np.asarray(subsets, dtype=bool)):
            ids = np.flatnonzero(row)
            if ids.size == 0:
                continue  # the empty sum is 0: nothing to ask
            sql = f"SELECT SUM(secret) FROM people WHERE id IN ({', '.join(map(str, ids))})"
            r = self._client.post(
                "/v1/datasets/people/query",
                json={"epsilon": self._epsilon, "sql": sql},
                headers={"Authorization": f"Bearer {self._key}"},
            )
            self.statuses.append(r.status_code)
            if r.status_code == 200:
                answers[i] = r.json()["rows"][0]["sum_secret"]
        self.queries_answered += len(subsets)
        return answers


#: Every row is a different person; ``id`` is declared (an integer the analyst may filter on).
METADATA = {
    "row_level": True,
    "columns": {
        "id": {"type": "categorical", "value_type": "integer"},
        "secret": {"type": "numeric", "lower": 0, "upper": 1},
    },
}


def _attack_service(tmp_path, x: np.ndarray, budget: float, seed: int) -> tuple[float, list[int], Service]:
    pd.DataFrame({"id": np.arange(N), "secret": x}).to_csv(tmp_path / "people.csv", index=False)
    # secure noise: the only kind it accepts; a budget far above the default maximum grant
    service = Service(f"sqlite:///{tmp_path / f'ledger-{budget:g}.sqlite'}", max_grant_epsilon=max(10.0, budget))
    service.register_dataset("people", tmp_path / "people.csv", METADATA)
    _, key = service.create_principal("eve", "analyst")
    service.grant("eve", "people", epsilon=budget)
    with (
        live_server(create_app(service, rate=1e9, burst=10**9, **UNPACED)) as base,
        httpx.Client(base_url=base, timeout=60) as client,
    ):
        curator = HTTPCurator(x, client, key, split_epsilon(budget, QUERIES))
        result = dinur_nissim_attack(curator, N, rng=np.random.default_rng(seed + 1))
    return result.recovered_fraction, curator.statuses, service


@pytest.mark.slow
def test_dinur_nissim_over_http_is_reduced_to_guessing(tmp_path) -> None:
    x = np.random.default_rng(2003).integers(0, 2, N)
    recovered, statuses, service = _attack_service(tmp_path, x, budget=1.0, seed=11)
    try:
        assert statuses.count(200) >= QUERIES - 1  # every query was answered and paid for…
        assert recovered <= 0.65, f"recovered {recovered:.1%} of the bits through the API"  # false failure ≈ 1.3e-5
        spent = service.ledger.get_budget("people", "eve")
        assert spent.spent_epsilon <= 1.0  # …from exactly the analyst's whole budget
        service.verify_log()
    finally:
        service.close()
    naive = dinur_nissim_attack(
        NaiveCurator(x, noise_bound=2.0, rng=np.random.default_rng(12)), N, rng=np.random.default_rng(13)
    )
    assert naive.recovered_fraction >= 0.95, f"the naive curator leaked only {naive.recovered_fraction:.1%}"


@pytest.mark.slow
def test_the_attack_has_power_against_a_budget_far_too_large(tmp_path) -> None:
    x = np.random.default_rng(2003).integers(0, 2, N)
    recovered, _, service = _attack_service(tmp_path, x, budget=4000.0, seed=21)
    service.close()
    assert recovered >= 0.95, f"with ε = 5 per query the attack should succeed; recovered {recovered:.1%}"
