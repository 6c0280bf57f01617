"""The documentation is tested code: every fenced block of README.md and docs/*.md is a test case.

* ```` ```python ```` blocks run, each document in its own namespace: a block continues the
  blocks before it in the same document, unless it starts a fresh namespace with ``new``. A
  block's printed output must not be cut by pandas (``...`` columns, ``[n rows x m columns]``).
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
e.g. a committed version of the guide written to a temporary file.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ADULT = SHARED / "data" / "adult"
VENV_BIN = ROOT / ".venv" / "bin"
SHELL = {"bash", "sh", "shell", "console"}
MARKS = {"skip", "new", "run", "synopsis", "needs-adult", "slow", "metadata"}
# Entries of the repository root that a block may write to: created afresh, never linked.
NOT_LINKED = {".git", ".dpkit", "out", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
SHELL_TIMEOUT_S = 120
# Run every block even after an earlier one of its document failed (to list all failures at once).
KEEP_GOING = bool(os.environ.get("DPKIT_DOCS_KEEP_GOING"))

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*docs:\s*(?P<marks>.*?)\s*-->\s*$")
_ONE_MARK = re.compile(r"^(?P<name>[a-z-]+)\s*(?:\((?P<reason>.*)\))?$")
_SYNOPSIS = re.compile(r"\[--|\.\.\.|…")
_PANDAS_CUT = re.compile(r"\[\d+ rows x \d+ columns\]|\S {2}\.\.\. {2}\S")


@dataclass
class Block:
    path: Path
    name: str  # as shown in the case id
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marks: dict[str, str] = field(default_factory=dict)  # name -> reason ("" when none)
    bad_marks: list[str] = field(default_factory=list)
    chain: tuple[str, int] | None = None  # (document, first block's line) for python blocks
    index: int = 0  # position among the python blocks of the document

    @property
    def id(self) -> str:
        return f"{self.name}:{self.line}"


def _parse_marks(text: str) -> tuple[dict[str, str], list[str]]:
    marks: dict[str, str] = {}
    bad: list[str] = []
    for part in filter(None, (p.strip() for p in re.split(r",(?![^(]*\))", text))):
        m = _ONE_MARK.match(part)
        if m is None or m.group("name") not in MARKS:
            bad.append(part)
        else:
            marks[m.group("name")] = (m.group("reason") or "").strip()
    return marks, bad


def parse(path: Path, name: str) -> list[Block]:
    """The fenced blocks of one Markdown file, with their marks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if (
                close
                and close.group("fence")[0] == fence[0]
                and len(close.group("fence")) >= len(fence)
                and not close.group("info").strip()
            ):
                break
            body.append(lines[i][len(m.group("indent")) :] if lines[i].startswith(m.group("indent")) else lines[i])
            i += 1
        i += 1
        marks: dict[str, str] = {}
        bad: list[str] = []
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0 and (mark := _MARK.match(lines[j])):
            marks, bad = _parse_marks(mark.group("marks"))
        lang = info.split()[0].lower() if info else ""
        blocks.append(Block(path, name, start + 1, lang, "\n".join(body) + "\n", marks, bad))
    chain: tuple[str, int] | None = None
    index = 0
    for b in blocks:
        if b.lang != "python":
            continue
        if chain is None or "new" in b.marks:
            chain, index = (b.name, b.line), 0
        b.chain, b.index = chain, index
        index += 1
    return blocks


def documents() -> list[tuple[Path, str]]:
    chosen = os.environ.get("DPKIT_DOCS_FILES")
    if chosen:
        paths = [Path(p).resolve() for p in chosen.split(os.pathsep) if p]
    else:
        paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    out = []
    for p in paths:
        try:
            name = p.relative_to(ROOT).as_posix()
        except ValueError:
            name = p.name
        out.append((p, name))
    return out


def collect() -> list[Block]:
    return [b for path, name in documents() for b in parse(path, name)]


BLOCKS = collect()
CHECKED = [b for b in BLOCKS if b.lang in {"python", "json", *SHELL}]


def _param(b: Block) -> object:
    marks = [pytest.mark.slow] if "slow" in b.marks else []
    return pytest.param(b, id=b.id, marks=marks)


# -- the scratch copy of the repository -----------------------------------------------------------


def make_workspace(base: Path) -> Path:
    """``base/repo``: the repository root's entries linked in, ``base/shared`` linked beside it."""
    repo = base / "repo"
    repo.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (repo / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    if SHARED.is_dir():
        (base / "shared").symlink_to(SHARED.resolve(), target_is_directory=True)
    return repo


# -- python blocks: one namespace per chain, per process ------------------------------------------

_STATE: dict[tuple[str, int], tuple[int, dict, Path]] = {}  # chain -> (last index run, namespace, cwd)
_FAILED: dict[tuple[str, int], tuple[int, str]] = {}  # chain -> (index, id) of a block that failed here


def _exec(b: Block, namespace: dict, cwd: Path) -> str:
    code = compile("\n" * (b.line) + b.code, str(b.path), "exec")
    out = io.StringIO()
    old = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
    finally:
        os.chdir(old)
    return out.getvalue()


def _chain_blocks(b: Block) -> list[Block]:
    return sorted((x for x in BLOCKS if x.chain == b.chain and x.path == b.path), key=lambda x: x.index)


def run_python(b: Block, tmp_path_factory: pytest.TempPathFactory) -> str:
    assert b.chain is not None
    failed = _FAILED.get(b.chain)
    if failed is not None and failed[0] < b.index and not KEEP_GOING:
        pytest.skip(f"an earlier block of this document failed: {failed[1]}")
    state = _STATE.get(b.chain)
    if state is None or state[0] >= b.index:
        state = (-1, {"__name__": "__docs__"}, make_workspace(tmp_path_factory.mktemp("docs")))
    last, namespace, cwd = state
    for earlier in _chain_blocks(b)[last + 1 : b.index]:
        if "skip" in earlier.marks:
            continue
        try:
            _exec(earlier, namespace, cwd)
        except Exception as exc:
            if KEEP_GOING:
                continue
            _FAILED[b.chain] = (earlier.index, earlier.id)
            _STATE.pop(b.chain, None)
            pytest.skip(f"an earlier block of this document failed: {earlier.id} ({type(exc).__name__})")
    try:
        output = _exec(b, namespace, cwd)
    except Exception as exc:
        _FAILED[b.chain] = (b.index, b.id)
        if KEEP_GOING:
            _STATE[b.chain] = (b.index, namespace, cwd)
        else:
            _STATE.pop(b.chain, None)
        frames = traceback.extract_tb(exc.__traceback__)
        inside = [f for f in frames if f.filename != __file__]  # the block and what it called
        error = "".join(traceback.format_list(inside[-8:])) + "".join(traceback.format_exception_only(exc))
    else:
        _STATE[b.chain] = (b.index, namespace, cwd)
        return output
    pytest.fail(f"{b.id} raised:\n{error}", pytrace=False)
    _STATE[b.chain] = (b.index, namespace, cwd)
    return output


# -- shell blocks ---------------------------------------------------------------------------------


def shell_commands(b: Block) -> str:
    if b.lang != "console":
        return b.code
    return "\n".join(line[2:] for line in b.code.splitlines() if line.startswith("$ ")) + "\n"


@pytest.mark.parametrize("block", [_param(b) for b in CHECKED])
def test_block(block: Block, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    b = block
    assert not b.bad_marks, f"unknown docs mark(s) {b.bad_marks}; known: {sorted(MARKS)}"
    if "skip" in b.marks:
        assert b.marks["skip"], "<!-- docs: skip (reason) --> needs a reason"
        pytest.skip(b.marks["skip"])
    if "needs-adult" in b.marks and not ADULT.is_dir():
        pytest.skip("UCI Adult is not at ../shared/data/adult/ beside the repository")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for name in ("DPKIT_LEDGER", "DPKIT_AUDIT_KEY"):
        monkeypatch.delenv(name, raising=False)

    if b.lang == "python":
        output = run_python(b, tmp_path_factory)
        cut = _PANDAS_CUT.search(output)
        if cut is not None:
            pytest.fail(f"{b.id}: pandas cut a printed table ({cut.group(0).strip()!r}): print it whole", pytrace=False)
    elif b.lang == "json":
        if "metadata" in b.marks:
            from dpkit.analytics import Metadata

            data = json.loads(b.code)
            meta = Metadata.from_dict(data)
            assert Metadata.from_dict(meta.to_dict()) == meta
    else:
        commands = shell_commands(b)
        if "run" in b.marks:
            env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
            cwd = make_workspace(tmp_path_factory.mktemp("shell"))
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", commands],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=SHELL_TIMEOUT_S,
            )
            if done.returncode != 0:
                pytest.fail(f"{b.id}: exit {done.returncode}\n{done.stdout}\n{done.stderr}", pytrace=False)
        elif "synopsis" not in b.marks:
            placeholder = _SYNOPSIS.search(commands)
            if placeholder is not None:
                pytest.fail(
                    f"{b.id}: {placeholder.group(0)!r} reads as a synopsis: mark the block "
                    "<!-- docs: synopsis --> or write a command that runs",
                    pytrace=False,
                )
            bash = shutil.which("bash") or "bash"
            done = subprocess.run([bash, "-n", "-c", commands], capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                pytest.fail(f"{b.id}: not valid shell: {done.stderr}", pytrace=False)


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
    assert _SYNOPSIS.search(blocks[3].code)
    assert _PANDAS_CUT.search("      sex    count  ...  mean\n0  F  1  ...  2\n\n[2 rows x 7 columns]\n")
    assert not _PANDAS_CUT.search("sex  count\nF    1\n")
