"""The documentation is tested code: every fenced block of README.md and docs/**/*.md is a test case.

* ```` ```python ```` blocks run, each document in its own namespace: a block continues the
  blocks before it in the same document, unless it starts a fresh namespace with ``new``. A block
  runs as a reader pasting it into ``python``'s prompt runs it (``code.InteractiveConsole``, fed
  line by line, then an empty line): code dedented right after a ``with``/``for``/``if`` block
  without a blank line between is a SyntaxError there, and an expression statement prints its
  value. A block that is not run (``skip``) must still paste. A block's printed output must not be
  cut by pandas (``...`` columns, ``[n rows x m columns]``).
* ```` ```bash ````, ```` ```sh ````, ```` ```shell ```` and ```` ```console ```` blocks run only
  when marked ``run`` (with bash, ``-e -o pipefail``, in a scratch directory, with the virtual
  environment's ``bin`` first on PATH, under a timeout; in a ``console`` block only the ``$ ``
  lines are commands). Any other shell block must parse (``bash -n``), and a block written as a
  synopsis (``[--option ...]`` or ``...``/``…`` placeholders) must say so with ``synopsis``.
* ```` ```json ```` blocks marked ``metadata`` are loaded with ``Metadata.from_dict`` and must
  round-trip through ``to_dict``; other JSON blocks are prose.

A block is marked by an HTML comment on the line before it (blank lines allowed in between),
several marks separated by commas: ``<!-- docs: skip (needs a GPU) -->``, ``<!-- docs: new -->``,
``<!-- docs: run -->``, ``<!-- docs: synopsis -->``, ``<!-- docs: needs-adult -->`` (uses UCI
Adult at ``../shared/data/adult/`` from the repository root; skipped when absent),
``<!-- docs: slow -->`` (the ``slow`` marker), ``<!-- docs: metadata -->``.

Blocks run in a scratch copy of the repository root (its entries linked, not copied, and
``../shared`` linked beside it), so relative paths in the docs work and nothing is written into
the repository. Each case is ``file:line`` of its opening fence. Where blocks of one document run
in different processes (pytest-xdist), a process replays the earlier blocks it has not run.

``DPKIT_DOCS_KEEP_GOING=1`` runs every block even after an earlier one of its document failed.
``DPKIT_DOCS_FILES`` (paths separated by ``os.pathsep``) collects other Markdown files instead,
e.g. a committed version of a page written to a temporary file.

The collector itself lives in ``tests/_docs_collector.py``. It must find the faults of the docs as
they once were: ``tests/docs_fixtures/`` holds minimal pages reproducing them (a synopsis written
as a command, a block using a name no block defines, a model charged to a budget whose accountant
cannot price it, code dedented right after a block that the prompt reads as part of it), and :func:`test_the_collector_finds_the_faults_of_the_old_docs` checks that
each is reported. (The fourth, a ``curl`` POST without ``Content-Type``, is found by
``tests/test_docs_curl.py``, which runs the documents' ``curl`` commands against ``dpkit serve``.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _docs_collector import (
    CHECKED_LANGS,
    PANDAS_CUT,
    SYNOPSIS,
    Block,
    BlockFailed,
    BlockSkipped,
    Runner,
    collect,
    documents,
    parse,
    shell_commands,
)

FIXTURES = Path(__file__).resolve().parent / "docs_fixtures"
# Run every block even after an earlier one of its document failed (to list all failures at once).
KEEP_GOING = bool(os.environ.get("DPKIT_DOCS_KEEP_GOING"))

BLOCKS = collect(documents(os.environ.get("DPKIT_DOCS_FILES")))
CHECKED = [b for b in BLOCKS if b.lang in CHECKED_LANGS]
_RUNNER: Runner | None = None


def _param(b: Block) -> object:
    marks = [pytest.mark.slow] if "slow" in b.marks else []
    return pytest.param(b, id=b.id, marks=marks)


def _isolate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks draw figures off screen and never see the caller's ledger or audit key."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for name in ("DPKIT_LEDGER", "DPKIT_AUDIT_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("block", [_param(b) for b in CHECKED])
def test_block(block: Block, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    global _RUNNER
    if _RUNNER is None:  # one per process: python blocks of a document share its namespace
        _RUNNER = Runner(BLOCKS, lambda: tmp_path_factory.mktemp("docs"), keep_going=KEEP_GOING)
    _isolate(monkeypatch)
    try:
        _RUNNER.check(block)
    except BlockSkipped as skipped:
        pytest.skip(str(skipped))
    except BlockFailed as failed:
        pytest.fail(str(failed), pytrace=False)


def test_the_collector_sees_the_marks(tmp_path: Path) -> None:
    """The collector itself: fences, marks and chains are read as documented."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nx = 1\n```\n\n<!-- docs: skip (needs a GPU) -->\n```python\nimport torch\n```\n"
        "<!-- docs: new, slow -->\n````python\ny = 2\n````\n<!-- docs: synopsis -->\n```bash\ndpkit x [--y]\n```\n"
        "<!-- docs: frobnicate -->\n```console\n$ ls\nout\n```\n",
        encoding="utf-8",
    )
    blocks = parse(doc, "doc.md")
    assert [(b.line, b.lang) for b in blocks] == [
        (1, "python"),
        (6, "python"),
        (10, "python"),
        (14, "bash"),
        (18, "console"),
    ]
    assert blocks[1].marks == {"skip": "needs a GPU"}
    assert blocks[2].marks == {"new": "", "slow": ""} and blocks[2].chain == ("doc.md", 10)
    assert blocks[1].chain == ("doc.md", 1) and blocks[1].index == 1
    assert blocks[4].bad_marks == ["frobnicate"] and shell_commands(blocks[4]) == "ls\n"
    assert SYNOPSIS.search(blocks[3].code)
    assert PANDAS_CUT.search("      sex    count  ...  mean\n0  F  1  ...  2\n\n[2 rows x 7 columns]\n")
    assert not PANDAS_CUT.search("sex  count\nF    1\n")


def test_the_guide_pages_are_collected() -> None:
    """Pages in folders under docs/ are documents too (the guide is docs/guide/*.md)."""
    names = {name for _, name in documents()}
    assert {"README.md", "docs/index.md", "docs/guide/getting-started.md"} <= names


#: Each fixture of tests/docs_fixtures/: the line of the block that must fail, and what its failure
#: must say. The pages reproduce faults of the docs before they were tested (issue items 4-6).
FAULTS = {
    # 4: a synopsis ([--option]) written in a bash block as if it were a command.
    "synopsis_in_a_command_block.md": [
        (5, "'[--' reads as a synopsis"),
        (17, "'[--' reads as a synopsis"),
    ],
    # 5: a block using a table that no block of its page defines.
    "undefined_name.md": [(5, "NameError: name 'df' is not defined")],
    # 6: a model charged to a budget whose default accountant cannot price Gaussian noise.
    "budget_without_gaussian_accountant.md": [(12, "BasicAccountant")],
    # Code dedented right after a `for` or `with` block: it runs as a script, but pasted into
    # python's prompt the line is read as part of the block (a SyntaxError), a skipped block too.
    "no_blank_line_after_a_block.md": [
        (6, "SyntaxError: invalid syntax"),
        (32, "is not run, but does not paste"),
    ],
}


@pytest.mark.parametrize("fixture", sorted(FAULTS))
def test_the_collector_finds_the_faults_of_the_old_docs(
    fixture: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector fails each faulty block of the fixture, for the fault's reason, and passes
    the others (so the failure is the fault's, not the page's)."""
    _isolate(monkeypatch)
    blocks = [b for b in parse(FIXTURES / fixture, fixture) if b.lang in CHECKED_LANGS]
    runner = Runner(blocks, lambda: tmp_path_factory.mktemp("fixture"), keep_going=True)
    failures: dict[int, str] = {}
    for b in blocks:
        try:
            runner.check(b)
        except BlockFailed as failed:
            failures[b.line] = str(failed)
        except BlockSkipped as skipped:  # pragma: no cover - a fixture block is never skipped
            pytest.fail(f"{b.id} was skipped: {skipped}")
    expected = dict(FAULTS[fixture])
    assert sorted(failures) == sorted(expected), failures
    for line, says in expected.items():
        assert says in failures[line], failures[line]
