"""Tests for the ``dpkit`` command line (dpkit.cli) and the demo it runs (dpkit.demo).

The demo's statistical check uses the secure default randomness (no seed), so it is a real test
of the released estimate, and is calibrated to be essentially never flaky: the survey has
n = 10,000 students with exactly 3,000 "yes" answers, so the Warner estimate
p̂ = 3·mean(Y) − 1 has standard deviation 3·√((2/9)/n) ≈ 0.0141 and misses the true rate by more
than 0.1 (7.1 σ) with probability 1.6e-12 (exact, from the convolution of the two binomials); the
two-coin estimate (σ ≈ 0.0087) misses by 0.1 with probability below 1e-30.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dpkit
from _cli_census import census_with_budget
from dpkit import datasets
from dpkit.cli import app
from dpkit.ledger.identity import dataset_identity

runner = CliRunner()


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["demo", "--help"],
        ["version", "--help"],
        ["account", "--help"],
        ["budget", "--help"],
        ["budget", "create", "--help"],
        ["query", "--help"],
        ["generate", "--help"],
        ["anonymity", "check", "--help"],
        ["attack", "reconstruction", "--help"],
    ],
)
def test_help(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_help_lists_only_real_commands() -> None:
    out = runner.invoke(app, ["--help"]).output
    panel = out[out.index("Commands") :]
    listed = set(re.findall(r"^\W*([a-z]+)\s{2,}\S", panel, flags=re.MULTILINE))
    assert listed == {
        "account",
        "admin",
        "anonymity",
        "attack",
        "budget",
        "check",
        "demo",
        "generate",
        "query",
        "serve",
        "synth",
        "version",
    }  # planned commands are not advertised before they exist


def test_no_arguments_shows_help() -> None:
    result = runner.invoke(app, [])
    assert "Usage" in result.output


def test_version() -> None:
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"dpkit {dpkit.__version__}"


def test_demo_writes_files_and_prints_the_estimate(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = runner.invoke(app, ["demo", "--out", str(out), "--seed", "1"])
    assert result.exit_code == 0, result.output
    png = out / "laplace_vs_gaussian.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    for name in ("survey_reports.csv", "age_histogram.csv", "results.json"):
        assert (out / name).is_file()
        assert name in result.stdout  # the paths of the files written are printed
    saved = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert f"{saved['randomized_response']['warner']['estimate']:.4f}" in result.stdout
    assert f"{saved['randomized_response']['two_coin']['estimate']:.4f}" in result.stdout
    assert "reproducible, NOT secure" in result.stdout
    # the released reports, not the true answers, are what the CSV holds
    lines = (out / "survey_reports.csv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "student,warner_report,two_coin_report" and len(lines) == 10_001


def test_demo_seed_is_reproducible(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        result = runner.invoke(app, ["demo", "--out", str(tmp_path / name), "--seed", "7", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        data.pop("files")
        data.pop("seconds")
        runs.append(data)
    assert runs[0] == runs[1]


def test_demo_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # stdout holds exactly one JSON document
    assert data["randomness"] == {"seed": None, "secure": True, "note": "CSPRNG (OS entropy)"}

    rr = data["randomized_response"]
    assert rr["true_rate"] == 0.3 and rr["n"] == 10_000
    w, c = rr["warner"], rr["two_coin"]
    assert abs(w["estimate"] - rr["true_rate"]) < 0.1  # fails w.p. 1.6e-12 (module docstring)
    assert abs(c["estimate"] - rr["true_rate"]) < 0.1
    assert w["estimate"] == pytest.approx(3 * w["mean_report"] - 1, abs=1e-12)  # seed 000
    assert c["estimate"] == pytest.approx(2 * c["p_b"] - 0.5, abs=1e-12)  # seed 002
    assert w["ci95"][0] < w["estimate"] < w["ci95"][1]

    lq = data["laplace_queries"]
    assert lq["count"]["scale"] == 2.0  # Δ = 1, ε = 0.5
    assert lq["count"]["bound95_formula"] == pytest.approx(2.0 * 2.995732273553991)  # b·ln 20
    assert lq["histogram"]["sensitivity"] == 2.0 and lq["histogram"]["sensitivity_add_remove"] == 1.0
    assert lq["k_queries"]["sensitivity"] == lq["k_queries"]["k"] == 10
    assert lq["epsilon_total"] == pytest.approx(1.5)

    rows = data["laplace_vs_gaussian"]["rows"]
    assert [r["epsilon"] for r in rows] == [0.125, 0.25, 0.5, 1.0, 2.0, 4.0]
    for r in rows:
        assert r["count_abs"]["laplace_formula"] < r["count_abs"]["gaussian_formula"]
        assert r["k_queries_sq"]["gaussian_formula"] < r["k_queries_sq"]["laplace_formula"]
        for key in ("count_abs", "histogram_sq", "k_queries_sq"):
            for mech in ("laplace", "gaussian"):
                # ≥ 100,000 noise values per cell: the measured mean is within 10% of the formula
                # (more than 15 standard errors, even for squared Laplace noise)
                assert r[key][f"{mech}_measured"] == pytest.approx(r[key][f"{mech}_formula"], rel=0.1)
    assert Path(data["files"][0]).name == "laplace_vs_gaussian.png"
    assert all(Path(p).is_file() for p in data["files"])


def test_demo_reports_unwritable_out(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = runner.invoke(app, ["demo", "--out", str(blocker / "sub")])
    assert result.exit_code == 1
    assert "could not write" in result.output


def test_demo_rejects_negative_seed(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--out", str(tmp_path), "--seed", "-1"])
    assert result.exit_code != 0


def test_datasets_are_deterministic() -> None:
    a, b = datasets.cheating_survey(), datasets.cheating_survey()
    assert (a.answers == b.answers).all() and a.true_rate == 0.3
    assert int(a.answers.sum()) == 3_000
    p, q = datasets.people(), datasets.people()
    assert (p.age == q.age).all() and (p.income == q.income).all()
    assert p.age.min() >= datasets.AGE_MIN and p.age.max() <= datasets.AGE_MAX


def test_account_prints_every_accountant(tmp_path) -> None:
    import json as _json

    result = runner.invoke(
        app,
        [
            "account",
            "--mechanism",
            "gaussian",
            "--noise-multiplier",
            "1.1",
            "--sample-rate",
            "0.004",
            "--steps",
            "500",
            "--delta",
            "1e-5",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = _json.loads(result.stdout)
    by_name = {r["accountant"]: r for r in doc["results"]}
    assert by_name["rdp"]["epsilon"] is not None and by_name["rdp"]["epsilon"] > 0
    assert by_name["basic"]["epsilon"] is None  # basic composition cannot price a Gaussian


def test_account_can_run_chosen_accountants_by_name() -> None:
    import json as _json

    result = runner.invoke(
        app,
        [
            "account",
            "--mechanism",
            "laplace",
            "--steps",
            "3",
            "--accountant",
            "basic",
            "--accountant",
            "zcdp",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    names = [r["accountant"] for r in _json.loads(result.stdout)["results"]]
    assert names == ["zcdp", "basic"]  # the report's own order
    bad = runner.invoke(app, ["account", "--accountant", "moments"])
    assert bad.exit_code == 1
    assert "moments" in bad.output and "zcdp" in bad.output


def test_account_in_training_terms_is_the_same_event() -> None:
    import json as _json

    def run(*args: str) -> dict:
        result = runner.invoke(app, ["account", "--noise-multiplier", "1.1", "--accountant", "rdp", "--json", *args])
        assert result.exit_code == 0, result.output
        return _json.loads(result.stdout)

    # 10 epochs of batches of 256 out of 60,000: q = 256/60000, 10 · ⌈60000 / 256⌉ = 2350 steps,
    # the steps make_private takes (the loader's length per epoch), not ⌈10 · 60000 / 256⌉ = 2344
    training = run("--epochs", "10", "--batch-size", "256", "--dataset-size", "60000")
    explicit = run("--sample-rate", "256/60000", "--steps", "2350")
    assert training["event"] == explicit["event"]
    assert training["results"][0]["epsilon"] == explicit["results"][0]["epsilon"]
    assert explicit["event"] != run("--sample-rate", "256/60000", "--steps", "2344")["event"]  # the test can tell


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--epochs", "1", "--batch-size", "10"], "--dataset-size missing"),
        (["--epochs", "1", "--batch-size", "10", "--dataset-size", "100", "--steps", "5"], "not both"),
        (["--epochs", "1", "--batch-size", "200", "--dataset-size", "100"], "batch size <= dataset size"),
        (["--epochs", "0", "--batch-size", "10", "--dataset-size", "100"], "--epochs=0"),
        (["--sample-rate", "1/0"], "--sample-rate='1/0'"),
        (["--sample-rate", "a quarter"], "256/60000"),
    ],
)
def test_account_training_terms_bad_input(args: list[str], says: str) -> None:
    result = runner.invoke(app, ["account", *args])
    assert result.exit_code == 1
    assert says in " ".join(result.output.split())


def test_account_rejects_a_bad_mechanism() -> None:
    result = runner.invoke(app, ["account", "--mechanism", "cauchy"])
    assert result.exit_code == 1
    assert "mechanism" in result.output


def test_budget_create_and_show(tmp_path) -> None:
    import json as _json

    ledger = str(tmp_path / "l.sqlite")
    assert (
        runner.invoke(app, ["budget", "create", "census", "alice", "--epsilon", "1", "--ledger", ledger]).exit_code == 0
    )
    shown = runner.invoke(app, ["budget", "--ledger", ledger, "--json"])
    assert shown.exit_code == 0, shown.output
    doc = _json.loads(shown.stdout)
    assert doc["budgets"][0]["remaining_epsilon"] == 1.0
    missing = runner.invoke(app, ["budget", "--ledger", str(tmp_path / "none.sqlite")])
    assert missing.exit_code == 1 and "no ledger" in missing.output


def test_budget_create_says_where_the_ledger_is_and_when_it_is_new(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the relative default ledger lands here
    first = runner.invoke(app, ["budget", "create", "census", "alice", "--epsilon", "1"])
    assert first.exit_code == 0, first.output
    where = str((tmp_path / ".dpkit" / "ledger.sqlite").resolve())
    assert where in first.stdout
    assert "created a new ledger" in first.stderr
    second = runner.invoke(app, ["budget", "create", "census", "bob", "--epsilon", "1"])
    assert second.exit_code == 0 and where in second.stdout
    assert "created a new ledger" not in second.stderr  # only when it is new


# ---- dpkit generate / dpkit query ------------------------------------------------------------------


def _census(tmp_path: Path) -> tuple[Path, Path, Path]:
    return census_with_budget(tmp_path, delta="1e-6")


def test_query_prints_a_table_and_spends_from_the_ledger(tmp_path: Path) -> None:
    data, meta, ledger = _census(tmp_path)
    args = [
        "query",
        str(data),
        "SELECT sex, COUNT(*), AVG(age) FROM census WHERE age > 30 GROUP BY sex",
        "--epsilon",
        "0.5",
        "--metadata",
        str(meta),
        "--ledger",
        str(ledger),
        "--analyst",
        "ann",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Female" in result.output and "95% CI" in result.output and "remaining ε=0.5" in result.output
    assert "privacy unit: person_id" in " ".join(result.output.split())
    js = runner.invoke(app, [*args, "--json"])
    doc = json.loads(js.stdout)
    assert doc["epsilon"] == 0.5 and doc["budget"]["remaining_epsilon"] == 0.0 and len(doc["rows"]) == 2
    assert (
        doc["privacy_unit"]["column"] == "person_id" and doc["privacy_unit"]["max_rows"] == 2 and doc["seeded"] is False
    )
    refused = runner.invoke(app, args)  # the budget is spent
    assert refused.exit_code == 1 and "budget exceeded" in " ".join(refused.output.split())
    assert len(dpkit.open_ledger(ledger).list_spends(dataset_identity(data), "ann")) == 2


def test_query_says_which_noise_scale_and_where_the_ledger_is(tmp_path: Path) -> None:
    data, meta, ledger = _census(tmp_path)
    args = [
        "query",
        str(data),
        "SELECT COUNT(*), AVG(age) FROM census",
        "--epsilon",
        "0.2",
        "--metadata",
        str(meta),
        "--ledger",
        str(ledger),
        "--analyst",
        "ann",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    # the mean's scale is its own (an approximate standard deviation in years), not its sum's
    assert "count: " in text and "approx. std. dev. of the mean" in text
    assert text.count("approx. std. dev. of the mean") == 1  # the count's own scale is not relabelled
    assert "count: laplace, ε=0.1, noise scale 20" in text  # Δ = 2 (two rows a person), ε = 0.1
    assert f"ledger: {ledger.resolve()}" in result.output  # on one line, however long
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert doc["budget"]["ledger"] == str(ledger.resolve())


def test_query_bounding_estimate_is_paid_and_shown(tmp_path: Path) -> None:
    """--bounding-epsilon pays its ε on top of --epsilon, in the same debit, and prints the
    estimate beside the disclosure of what the intervals cover; without it nothing extra is spent."""
    data, meta, ledger = _census(tmp_path)
    base = ["--metadata", str(meta), "--ledger", str(ledger), "--analyst", "ann"]
    sql = "SELECT COUNT(*) FROM census"
    plain = runner.invoke(app, ["query", str(data), sql, "--epsilon", "0.2", *base])
    assert plain.exit_code == 0, plain.output
    text = " ".join(plain.output.split())
    assert "intervals cover the statistic after bounding" in text and "bounding estimate" not in text
    paid = runner.invoke(app, ["query", str(data), sql, "--epsilon", "0.2", "--bounding-epsilon", "0.1", *base])
    assert paid.exit_code == 0, paid.output
    text = " ".join(paid.output.split())
    assert "bounding estimate (paid, ε=0.1)" in text and "remaining ε=0.5" in text
    spends = dpkit.open_ledger(ledger).list_spends(dataset_identity(data), "ann")
    assert [round(s.epsilon_cost, 9) for s in spends] == [0.2, 0.3]
    bad = runner.invoke(app, ["query", str(data), sql, "--epsilon", "0.2", "--bounding-epsilon", "-1", *base])
    assert bad.exit_code != 0 and "bounding_epsilon" in " ".join(bad.output.split())
    assert len(dpkit.open_ledger(ledger).list_spends(dataset_identity(data), "ann")) == 2  # refused unpaid


def test_the_budget_follows_the_file_not_the_table_name(tmp_path: Path) -> None:
    """--table names the table in SQL only; a different file has no budget until one is made for
    it, and a copy of the file pays from the same budget."""
    data, meta, ledger = _census(tmp_path)
    other = tmp_path / "other.csv"
    other.write_text(data.read_text().replace("Female", "Male", 1))
    base = ["--epsilon", "0.1", "--metadata", str(meta), "--ledger", str(ledger), "--analyst", "ann"]
    refused = runner.invoke(app, ["query", str(other), "SELECT COUNT(*) FROM census", "--table", "census", *base])
    assert refused.exit_code == 1 and "no budget" in " ".join(refused.output.split()).lower()
    copy = tmp_path / "copy.csv"
    copy.write_bytes(data.read_bytes())
    paid = runner.invoke(app, ["query", str(copy), "SELECT COUNT(*) FROM census", "--table", "census", *base])
    assert paid.exit_code == 0, paid.output
    assert dpkit.open_ledger(ledger).get_budget(dataset_identity(data), "ann").spent_epsilon == pytest.approx(0.1)


def test_a_seed_is_refused_by_query(tmp_path: Path) -> None:
    data, meta, ledger = _census(tmp_path)
    args = [
        "query",
        str(data),
        "SELECT COUNT(*) FROM census",
        "--epsilon",
        "0.05",
        "--metadata",
        str(meta),
        "--ledger",
        str(ledger),
        "--analyst",
        "ann",
        "--seed",
        "11",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "rng" in result.output
    assert dpkit.open_ledger(ledger).list_spends(dataset_identity(data), "ann") == []


def test_query_errors_are_clear(tmp_path: Path) -> None:
    data, meta, ledger = _census(tmp_path)
    base = ["--epsilon", "0.5", "--metadata", str(meta), "--ledger", str(ledger), "--analyst", "ann"]
    cases = [
        (["query", str(data), "SELECT * FROM census", *base], "read rows"),
        (["query", str(data), "SELECT COUNT(*) FROM adult", *base], "table"),
        (["query", str(tmp_path / "missing.csv"), "SELECT COUNT(*) FROM missing", *base], "no such file"),
        (
            [
                "query",
                str(data),
                "SELECT COUNT(*) FROM census",
                "--epsilon",
                "0.5",
                "--metadata",
                str(meta),
                "--ledger",
                str(tmp_path / "none.sqlite"),
            ],
            "create a budget",
        ),
        (
            ["query", str(data), "SELECT COUNT(*) FROM census", "--epsilon", "0.5", "--ledger", str(ledger)],
            "--metadata",
        ),
        (["query", str(data), "SELECT COUNT(*) FROM census", "--row-level", *base], "--row-level"),
        (["query", str(data), "SELECT COUNT(*) FROM census", *base[:-1], "bob"], "bob"),
        (["query", str(data), "SELECT AVG(person_id) FROM census", *base], "Numeric column"),
    ]
    for args, match in cases:
        result = runner.invoke(app, args)
        assert result.exit_code != 0 and match in " ".join(result.output.split()), (args, result.output)
    assert dpkit.open_ledger(ledger).get_budget(dataset_identity(data), "ann").spent_epsilon == 0


def test_generate_rejects_unknown_data_sets(tmp_path: Path) -> None:
    result = runner.invoke(app, ["generate", "moon", str(tmp_path / "x.csv")])
    assert result.exit_code == 1 and "census" in result.output


def test_anonymity_check_and_generalise(tmp_path: Path) -> None:
    import pandas as pd

    rows = [(25 + i % 30, "F" if i % 2 else "M", f"1{i % 7:04d}", "flu" if i % 3 else "cold") for i in range(300)]
    data = tmp_path / "patients.csv"
    pd.DataFrame(rows, columns=["age", "sex", "zip", "diagnosis"]).to_csv(data, index=False)
    out = tmp_path / "released.csv"
    result = runner.invoke(
        app,
        [
            "anonymity",
            "check",
            str(data),
            "--quasi",
            "age,sex,zip",
            "--k",
            "5",
            "--sensitive",
            "diagnosis",
            "--generalise",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["k"] < 5 and doc["rows_below_target"] > 0 and doc["generalised"]["k_achieved"] >= 5
    released = pd.read_csv(out)
    assert released.groupby(["age", "sex", "zip"]).size().min() >= 5
    bad = runner.invoke(app, ["anonymity", "check", str(data), "--quasi", "nope"])
    assert bad.exit_code == 1 and "nope" in bad.output


def test_attack_reconstruction_succeeds_on_the_naive_curator_and_fails_on_dpkit(tmp_path: Path) -> None:
    plot = tmp_path / "rec.png"
    result = runner.invoke(
        app, ["attack", "reconstruction", "--n", "100", "--noise", "1", "--seed", "4", "--plot", str(plot), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["naive"]["blatantly_non_private"] and doc["naive"]["recovered_fraction"] > 0.95
    assert doc["dpkit"]["recovered_fraction"] < 0.7 and doc["dpkit"]["spent"] <= 1.0  # fixed seed; ~guessing
    assert plot.exists() and plot.stat().st_size > 0
    bad = runner.invoke(app, ["attack", "reconstruction", "--n", "0"])
    assert bad.exit_code == 1 and "n=0" in bad.output
