"""Test-wide fixtures, and the test tiers.

Tiers (markers registered in pyproject.toml): ``make test`` runs everything; ``make test-fast``
deselects ``slow``, ``statistical``, ``spark``, ``postgres`` and ``browser``. The markers are put
on tests here, in :func:`pytest_collection_modifyitems`, rather than in the test files, so one
table says which tests are heavy and why. A test gets a marker when

* its module (or a folder above it) is listed in ``MODULE_MARKERS``;
* its name (without parameters) is listed in ``TEST_MARKERS``;
* it uses a fixture listed in ``FIXTURE_MARKERS`` (a PostgreSQL schema, a Spark session), or is
  the ``"postgres"`` parametrisation of a test run on each ledger backend;
* it draws a statistical conclusion: its code, or a helper function of its module that it calls,
  uses one of ``STATISTICAL_NAMES`` (the shared significance level and tests of ``_stats``, or a
  scipy goodness-of-fit test).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from pathlib import Path

import mpmath
import pytest

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _mpmath_precision(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test gets the mpmath precision its module asks for (``MP_PREC``, in bits), restored
    afterwards: mpmath's precision is process-global, and modules sharing a worker must not
    inherit each other's settings."""
    with mpmath.workprec(getattr(request.module, "MP_PREC", 200)):
        yield


# ``pg_url``: a fresh PostgreSQL schema per test (skips when no server can be started).
import _postgres  # noqa: E402

pg_url = _postgres.pg_url


# -- test tiers -----------------------------------------------------------------------------------

#: Whole modules, or folders (ending in "/"), relative to tests/.
MODULE_MARKERS: dict[str, tuple[str, ...]] = {
    # Empirical privacy audits: each draws tens of thousands of samples per claim.
    "audit/": ("statistical",),
    # Empirical audits of joined queries and their broken twins (about 20 s each).
    "analytics/test_joins_audit.py": ("statistical", "slow"),
    # The audit of dpkit.synth's measurement noise.
    "synth/test_measure.py": ("statistical",),
    # A local Spark session (JVM start-up, then seconds per query).
    "analytics/test_spark_engine.py": ("spark", "slow"),
    # Joined queries on a local Spark session, each against DuckDB.
    "analytics/test_spark_joins.py": ("spark", "slow"),
    # A Spark Connect server (a JVM, about 6 s to start) and a gRPC client.
    "analytics/test_spark_connect.py": ("spark", "slow"),
    # A Spark standalone cluster (scripts/spark-cluster.sh: a master and two workers, about 40 s).
    "analytics/test_spark_cluster.py": ("spark", "slow"),
    # The service's Spark datasets (a local Spark session per test worker).
    "server/test_spark_datasets.py": ("spark", "slow"),
    # The service's Spark datasets of several tables (one dataset for the module, joined queries).
    "server/test_spark_dataset_tables.py": ("spark", "slow"),
    # dpkit.synth's marginals counted on a local Spark session.
    "synth/test_spark_counts.py": ("spark", "slow"),
    # Connects to the server itself (not only through ``pg_url``).
    "ledger/test_postgres_ledger.py": ("postgres",),
    # Headless Chromium against a live server.
    "server/test_dashboard.py": ("browser", "slow"),
    # The README's curl against a real `dpkit serve` subprocess (about 25 s).
    "test_docs_curl.py": ("slow",),
    # Every script of examples/, each in a fresh interpreter (about 80 s in all).
    "test_examples.py": ("slow",),
    # Two fresh interpreters joined by torch.distributed (gloo): about 10 s.
    "torch/test_distributed.py": ("slow",),
}

#: Single tests, "module::name" relative to tests/ (every parametrisation of the name), that took
#: several seconds each in ``pytest --durations`` and carry no marker otherwise.
TEST_MARKERS: dict[str, tuple[str, ...]] = {
    # Empirical audits written inline (no shared helper to recognise them by).
    "analytics/test_query_audit.py::test_user_level_group_by_count_keeps_its_epsilon": ("statistical", "slow"),
    "analytics/test_query_audit.py::test_an_engine_that_skips_bounding_is_caught": ("statistical", "slow"),
    "mechanisms/test_candidate_quantile.py::test_audit_stays_within_epsilon": ("statistical", "slow"),
    "mechanisms/test_sample_aggregate.py::test_audit_within_claim": ("statistical",),
    "mechanisms/test_sample_aggregate.py::test_broken_twin_is_caught": ("statistical", "slow"),
    "mechanisms/test_smooth_sensitivity.py::test_cauchy_variant_audit_within_claim": ("statistical",),
    # Several processes or threads racing on one ledger, dataset copy or server.
    "ledger/test_sqlite_ledger.py::test_processes_debiting_concurrently_spend_exactly_the_budget": ("slow",),
    "ledger/test_sqlite_ledger.py::test_processes_creating_the_same_ledger_at_once": ("slow",),
    "server/test_datasets.py::test_two_processes_query_one_shared_copy": ("slow",),
    "server/test_edge.py::test_the_poisoned_bodies_cannot_fail_a_concurrent_victim": ("slow",),
    "server/test_race.py::test_the_race_test_catches_a_check_then_pay_ledger": ("slow",),
    "server/test_refusals.py::test_an_unauthenticated_flood_leaves_the_chain_unchanged": ("slow",),
    "server/test_refusals.py::test_authenticated_requests_do_not_use_the_address_bucket": ("slow",),
    "server/test_side_channels.py::test_a_poisoned_row_cannot_fail_a_query_or_reach_an_analyst": ("slow",),
    "server/test_side_channels.py::test_a_refused_query_does_not_run_and_does_not_depend_on_the_data": ("slow",),
    "server/test_side_channels.py::test_a_source_that_can_no_longer_be_read_is_a_fixed_answer": ("slow",),
    "server/test_pacing.py::test_the_time_of_a_paid_answer_does_not_depend_on_one_person": ("statistical", "slow"),
    "server/test_pacing.py::test_me_does_not_wait_behind_held_answers": ("slow",),
    "server/test_registration_race.py": ("slow",),
    "test_docs_synthetic.py": ("slow",),
    # `dpkit serve` and `dpkit demo` in a subprocess.
    "server/test_processes.py::test_workers_stop_when_the_supervisor_is_killed": ("slow",),
    "server/test_processes.py::test_a_second_server_on_a_served_port_refuses_to_start": ("slow",),
    "server/test_slow_clients.py::test_dpkit_serve_applies_the_limits": ("slow",),
    "test_cli.py::test_demo_writes_files_and_prints_the_estimate": ("slow",),
    "test_cli.py::test_demo_seed_is_reproducible": ("slow",),
    "test_cli.py::test_demo_json": ("slow",),
    "test_cli.py::test_attack_reconstruction_succeeds_on_the_naive_curator_and_fails_on_dpkit": ("slow",),
    "analytics/test_limits.py::test_keys_just_under_the_limit_are_answered_and_one_more_is_refused": ("slow",),
    "attacks/test_reconstruction.py::test_broken_dp_curator_is_caught": ("slow",),
    "ml/test_logistic.py::test_calibrated_multiplier_meets_target_and_is_tight": ("slow",),
    "ml/test_kmeans.py::test_textbook_random_start_is_its_weakness_and_private_init_removes_it": ("slow",),
    "test_cli.py::test_query_errors_are_clear": ("slow",),
    # A local Spark session started by `dpkit query --engine spark --master local[2]`.
    "test_cli_engine.py::test_engine_spark_with_master_and_conf": ("spark", "slow"),
    "test_cli_engine.py::test_engine_spark_reads_a_csv_by_dpkits_rules": ("spark", "slow"),
    # Training runs: a per-example oracle over many models, and learning to a target.
    "torch/test_dpsgd_clipping.py::test_clipped_sum_matches_one_example_at_a_time": ("slow",),
    "torch/test_dpsgd_training.py::test_learns_at_large_epsilon_with_the_users_loop": ("slow",),
    "torch/test_dpsgd_training.py::test_train_helper_reports_epsilon_per_epoch": ("slow",),
    "torch/test_federated.py::test_learns_on_simulated_clients_at_large_epsilon": ("slow",),
    "torch/test_federated.py::test_calibrated_epsilon_is_met": ("slow",),
}

#: Fixtures that need an outside service.
FIXTURE_MARKERS: dict[str, str] = {
    "pg_url": "postgres",
    "spark": "spark",
}

#: Names whose use makes a test statistical: the shared significance level and tests of
#: tests/_stats.py, and scipy's goodness-of-fit tests.
STATISTICAL_NAMES = frozenset(
    {"ALPHA", "chi2_pvalue", "binomial_z", "kstest", "ks_2samp", "binomtest", "chisquare", "anderson_ksamp"}
)


def _names_used(code: types.CodeType) -> set[str]:
    """Global and attribute names used by ``code`` and the functions and lambdas nested in it."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def _is_statistical(function: object, module: types.ModuleType, seen: set[str] | None = None) -> bool:
    """Whether ``function``, or a function of ``module`` it calls (transitively), uses a name of
    ``STATISTICAL_NAMES``."""
    code = getattr(inspect.unwrap(function), "__code__", None)  # type: ignore[arg-type]
    if code is None:
        return False
    names = _names_used(code)
    if names & STATISTICAL_NAMES:
        return True
    seen = set() if seen is None else seen
    for name in names - seen:
        seen.add(name)
        helper = getattr(module, name, None)
        if (
            inspect.isfunction(helper)
            and helper.__module__ == module.__name__
            and _is_statistical(helper, module, seen)
        ):
            return True
    return False


def _tier_markers(item: pytest.Item) -> set[str]:
    path = item.path.relative_to(TESTS).as_posix() if item.path.is_relative_to(TESTS) else item.path.name
    markers: set[str] = set()
    for key, names in MODULE_MARKERS.items():
        if path == key or (key.endswith("/") and path.startswith(key)):
            markers.update(names)
    name = getattr(item, "originalname", item.name)
    markers.update(TEST_MARKERS.get(f"{path}::{name}", ()))
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in FIXTURE_MARKERS:
            markers.add(FIXTURE_MARKERS[fixture])
    # Tests parametrised over the ledger backends reach PostgreSQL without the ``pg_url`` fixture.
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "postgres" in [v for v in callspec.params.values() if isinstance(v, str)]:
        markers.add("postgres")
    module = getattr(item, "module", None)
    function = getattr(item, "function", None)
    if module is not None and function is not None and _is_statistical(function, module):
        markers.add("statistical")
    return markers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in sorted(_tier_markers(item)):
            item.add_marker(marker)
