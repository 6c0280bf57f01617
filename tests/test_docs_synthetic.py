"""The service guide's synthetic-table example is answered on the service the README sets up.

The README's curator-service block is run up to its ``dpkit serve`` line, as a reader runs it (in a
fresh directory: ``dpkit generate``, ``dpkit admin ...``); then, on that ledger, alice sends the
README's own query and the guide's synthetic-table body — both read from the documents, so the
test breaks when either changes. Before, the README granted alice δ = 0 and the guide's example
was refused with 409 (issue 27, item 14). The service is opened in this process (the documented
``dpkit serve`` answers a synthetic table at its fixed time, a minute later; the same request
and the same budget decide the answer either way; ``test_docs_curl.py`` runs the server itself).

Deterministic: the answer's shape and the amounts spent do not depend on the noise."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from _docs_collector import ROOT, docs_env, logical_lines, parse, service_block

README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide" / "service.md"


def _guide_synthetic_body() -> dict[str, object]:
    for block in parse(GUIDE, GUIDE.name):
        if block.lang == "json" and '"bins"' in block.code and '"columns"' in block.code:
            body: dict[str, object] = json.loads(block.code)
            return body
    raise AssertionError("the service guide has no synthetic-table body")


def test_the_guides_synthetic_table_is_answered_within_the_readmes_grant(tmp_path: Path) -> None:
    from dpkit.server import QueryRequest, Service
    from dpkit.server.synthetic import SynthRequest

    lines = logical_lines(service_block(README))
    at = next(i for i, x in enumerate(lines) if x.startswith("dpkit serve"))
    env = docs_env()
    setup = "\n".join(lines[:at])
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", setup],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"the README's setup failed:\n{done.stdout}\n{done.stderr}"
    key = re.search(r"analyst alice\b[^\n]*\n\s*(dpk_[\w-]+)", done.stdout)
    assert key, done.stdout
    curl = next(x for x in lines[at:] if x.startswith("curl "))
    query = json.loads(re.search(r"-d '([^']*)'", curl).group(1))  # type: ignore[union-attr]
    body = _guide_synthetic_body()
    with Service(f"sqlite:///{tmp_path / '.dpkit' / 'ledger.sqlite'}", data_root=tmp_path) as svc:
        alice = svc.authenticate(key.group(1))
        svc.query(alice, "census", QueryRequest(**query))
        answer, _ = svc.synthesize(alice, "census", SynthRequest(**body))  # type: ignore[arg-type]
        assert answer["columns"] == body["columns"] and answer["rows"]
        b = svc.ledger.get_budget("census", "alice")
        assert (b.spent_epsilon, b.spent_delta) == (query["epsilon"] + body["epsilon"], body["delta"])
