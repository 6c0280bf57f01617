"""The documentation collector: the fenced blocks of Markdown files, their marks, and how each is
checked (the rules are in ``tests/test_docs.py``'s docstring).

Nothing here depends on pytest: :meth:`Runner.check` raises :class:`BlockFailed` or
:class:`BlockSkipped`, so the same code checks the real documents (``test_docs.py``) and the
fixtures of faults it must find (``tests/docs_fixtures/``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import traceback
import types
from code import InteractiveConsole
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ADULT = SHARED / "data" / "adult"
VENV_BIN = ROOT / ".venv" / "bin"
SHELL = {"bash", "sh", "shell", "console"}
MARKS = {"skip", "new", "run", "synopsis", "needs-adult", "slow", "metadata"}
CHECKED_LANGS = {"python", "json", *SHELL}
# Entries of the repository root that a block may write to: created afresh, never linked.
NOT_LINKED = {".git", ".dpkit", "out", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
SHELL_TIMEOUT_S = 120

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*docs:\s*(?P<marks>.*?)\s*-->\s*$")
_ONE_MARK = re.compile(r"^(?P<name>[a-z-]+)\s*(?:\((?P<reason>.*)\))?$")
SYNOPSIS = re.compile(r"\[--|\.\.\.|…")
PANDAS_CUT = re.compile(r"\[\d+ rows x \d+ columns\]|\S {2}\.\.\. {2}\S")


class BlockFailed(Exception):
    """A block did not do what the documentation says (the message says what happened)."""


class BlockSkipped(Exception):
    """A block was not checked (the message says why)."""


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


# -- collecting -----------------------------------------------------------------------------------


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


def documents(chosen: str | None = None) -> list[tuple[Path, str]]:
    """README.md and every Markdown page under docs/ (``docs/guide/`` included), or the files
    named in ``chosen`` (paths separated by ``os.pathsep``), with their names for case ids."""
    if chosen:
        paths = [Path(p).resolve() for p in chosen.split(os.pathsep) if p]
    else:
        paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    out = []
    for p in paths:
        try:
            name = p.relative_to(ROOT).as_posix()
        except ValueError:
            name = p.name
        out.append((p, name))
    return out


def collect(docs: Iterable[tuple[Path, str]]) -> list[Block]:
    return [b for path, name in docs for b in parse(path, name)]


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


def shell_commands(b: Block) -> str:
    if b.lang != "console":
        return b.code
    return "\n".join(line[2:] for line in b.code.splitlines() if line.startswith("$ ")) + "\n"


# -- checking -------------------------------------------------------------------------------------


class _Console(InteractiveConsole):
    """``python``'s prompt, as a reader pasting a block into it: the lines are pushed one by one, a
    statement runs once it is complete (an indented block ends only at a blank line, so code
    dedented right after it is a SyntaxError there, though not in a script), and an expression
    statement prints its value. ``run=False`` only compiles (a block that is not run must still
    paste). The first error is kept in :attr:`error` and nothing runs after it."""

    def __init__(self, b: Block, namespace: dict, *, run: bool = True) -> None:
        super().__init__(namespace, filename=str(b.path))
        self.block, self.run = b, run
        self.error: BaseException | None = None
        self._start = 0  # the block's line (0-based) where the pending statement starts

    def paste(self) -> None:
        lines = self.block.code.splitlines()
        more = False
        for i, line in enumerate([*lines, ""]):  # the reader's Enter after the last line
            if not more:
                self._start = i
            more = self.push(line)
            if self.error is not None:
                return
        if more:
            self.error = SyntaxError(f"the block ends inside an unfinished statement (from its line {self._start + 1})")

    def runsource(self, source: str, filename: str = "<input>", symbol: str = "single") -> bool:
        # Leading blank lines put the statement at its line of the Markdown file, for tracebacks.
        return super().runsource("\n" * (self.block.line + self._start) + source, filename, symbol)

    def runcode(self, code: types.CodeType) -> None:
        if self.run and self.error is None:
            try:
                exec(code, self.locals)
            except Exception as exc:
                self.error = exc

    def showsyntaxerror(self, filename: str | None = None, **kwargs: object) -> None:
        if self.error is None:
            self.error = sys.exc_info()[1]


def _show(value: object) -> None:
    """The prompt's display of an expression statement's value (without setting ``builtins._``)."""
    if value is not None:
        print(repr(value))


def _exec(b: Block, namespace: dict, cwd: Path) -> str:
    """Run a python block as pasted into an interactive console (:class:`_Console`); its printed
    output, or the first exception it raised."""
    console = _Console(b, namespace)
    out = io.StringIO()
    old, hook = Path.cwd(), sys.displayhook
    os.chdir(cwd)
    sys.displayhook = _show
    try:
        with contextlib.redirect_stdout(out):
            console.paste()
    finally:
        sys.displayhook = hook
        os.chdir(old)
    if console.error is not None:
        raise console.error
    return out.getvalue()


def _paste_error(exc: SyntaxError) -> str:
    return "".join(traceback.format_exception_only(exc)) + (
        "pasted line by line into python's prompt, an indented block (with, for, if, def) ends only at "
        "a blank line: add one before the code dedented after it, and none inside the block"
    )


def _pastes(b: Block) -> None:
    """A block that is not run must still paste: compiled statement by statement, as the prompt
    would, raising the first SyntaxError."""
    console = _Console(b, {}, run=False)
    console.paste()
    if console.error is not None:
        raise console.error


class Runner:
    """Checks the blocks of ``blocks``; python blocks of one chain share a namespace and a scratch
    directory (from ``new_base()``, a fresh empty directory per call). Where blocks of one chain
    are checked in different processes (pytest-xdist), a process replays the earlier blocks it
    has not run. ``keep_going``: run every block even after an earlier one of its chain failed."""

    def __init__(self, blocks: list[Block], new_base: Callable[[], Path], *, keep_going: bool = False) -> None:
        self.blocks = blocks
        self.new_base = new_base
        self.keep_going = keep_going
        self._state: dict[tuple[str, int], tuple[int, dict, Path]] = {}  # chain -> (last index run, namespace, cwd)
        self._failed: dict[tuple[str, int], tuple[int, str]] = {}  # chain -> (index, id) of a block that failed

    def check(self, b: Block) -> str:
        """Check one block: its output (python), or "" — else BlockFailed or BlockSkipped."""
        if b.bad_marks:
            raise BlockFailed(f"{b.id}: unknown docs mark(s) {b.bad_marks}; known: {sorted(MARKS)}")
        if b.lang == "python" and ("skip" in b.marks or ("needs-adult" in b.marks and not ADULT.is_dir())):
            try:
                _pastes(b)
            except SyntaxError as exc:
                raise BlockFailed(f"{b.id} is not run, but does not paste:\n{_paste_error(exc)}") from None
        if "skip" in b.marks:
            if not b.marks["skip"]:
                raise BlockFailed(f"{b.id}: <!-- docs: skip (reason) --> needs a reason")
            raise BlockSkipped(b.marks["skip"])
        if "needs-adult" in b.marks and not ADULT.is_dir():
            raise BlockSkipped("UCI Adult is not at ../shared/data/adult/ beside the repository")
        if b.lang == "python":
            output = self._python(b)
            cut = PANDAS_CUT.search(output)
            if cut is not None:
                raise BlockFailed(f"{b.id}: pandas cut a printed table ({cut.group(0).strip()!r}): print it whole")
            return output
        if b.lang == "json":
            if "metadata" in b.marks:
                from dpkit.analytics import Metadata

                meta = Metadata.from_dict(json.loads(b.code))
                if Metadata.from_dict(meta.to_dict()) != meta:
                    raise BlockFailed(f"{b.id}: the metadata does not round-trip through to_dict")
            return ""
        if b.lang in SHELL:
            self._shell(b)
        return ""

    # -- python --

    def _chain_blocks(self, b: Block) -> list[Block]:
        return sorted((x for x in self.blocks if x.chain == b.chain and x.path == b.path), key=lambda x: x.index)

    def _python(self, b: Block) -> str:
        assert b.chain is not None
        failed = self._failed.get(b.chain)
        if failed is not None and failed[0] < b.index and not self.keep_going:
            raise BlockSkipped(f"an earlier block of this document failed: {failed[1]}")
        state = self._state.get(b.chain)
        if state is None or state[0] >= b.index:
            state = (-1, {"__name__": "__docs__"}, make_workspace(self.new_base()))
        last, namespace, cwd = state
        for earlier in self._chain_blocks(b)[last + 1 : b.index]:
            if "skip" in earlier.marks or ("needs-adult" in earlier.marks and not ADULT.is_dir()):
                continue
            try:
                _exec(earlier, namespace, cwd)
            except Exception as exc:
                if self.keep_going:
                    continue
                self._failed[b.chain] = (earlier.index, earlier.id)
                self._state.pop(b.chain, None)
                raise BlockSkipped(
                    f"an earlier block of this document failed: {earlier.id} ({type(exc).__name__})"
                ) from None
        try:
            output = _exec(b, namespace, cwd)
        except Exception as exc:
            self._failed[b.chain] = (b.index, b.id)
            if self.keep_going:
                self._state[b.chain] = (b.index, namespace, cwd)
            else:
                self._state.pop(b.chain, None)
            if isinstance(exc, SyntaxError):
                raise BlockFailed(f"{b.id} does not paste:\n{_paste_error(exc)}") from None
            frames = traceback.extract_tb(exc.__traceback__)
            inside = [f for f in frames if f.filename != __file__]  # the block and what it called
            error = "".join(traceback.format_list(inside[-8:])) + "".join(traceback.format_exception_only(exc))
            raise BlockFailed(f"{b.id} raised:\n{error}") from None
        self._state[b.chain] = (b.index, namespace, cwd)
        return output

    # -- shell --

    def _shell(self, b: Block) -> None:
        commands = shell_commands(b)
        if "run" in b.marks:
            env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
            cwd = make_workspace(self.new_base())
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", commands],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=SHELL_TIMEOUT_S,
            )
            if done.returncode != 0:
                raise BlockFailed(f"{b.id}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        elif "synopsis" not in b.marks:
            placeholder = SYNOPSIS.search(commands)
            if placeholder is not None:
                raise BlockFailed(
                    f"{b.id}: {placeholder.group(0)!r} reads as a synopsis: mark the block "
                    "<!-- docs: synopsis --> or write a command that runs"
                )
            bash = shutil.which("bash") or "bash"
            done = subprocess.run([bash, "-n", "-c", commands], capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise BlockFailed(f"{b.id}: not valid shell: {done.stderr}")


# -- the service blocks (README, getting started) ---------------------------------------------------


def logical_lines(code: str) -> list[str]:
    """The block's commands, one per line: continuation lines joined, blank lines dropped."""
    lines: list[str] = []
    pending = ""
    for raw in code.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line:
            lines.append(line)
    return lines


def shell_blocks(path: Path) -> list[str]:
    return [b.code for b in parse(path, path.name) if b.lang in SHELL]


def service_block(path: Path) -> str:
    """The first shell block of ``path`` that starts ``dpkit serve`` and sends a ``curl``."""
    for code in shell_blocks(path):
        lines = logical_lines(code)
        if any(x.startswith("dpkit serve") for x in lines) and any(x.startswith("curl ") for x in lines):
            return code
    raise AssertionError(f"{path.name} has no shell block with `dpkit serve` and `curl`")


def docs_env() -> dict[str, str]:
    """The environment a reader runs the docs' commands in: the project's `dpkit` first on PATH,
    no ledger or audit key of the caller's."""
    env = {k: v for k, v in os.environ.items() if k not in ("DPKIT_LEDGER", "DPKIT_AUDIT_KEY")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env
