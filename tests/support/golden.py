"""Where the test fixtures kept in the repository live, and the one reader of the golden JSONL cases.

``tests/fixtures/dsv4-reference/`` holds DeepSeek's public golden cases (generated from DeepSeek's reference
encoders; see its README) and ``tests/fixtures/k8s/`` the DynamoGraphDeployment CRD the recipe checks validate
against (NVIDIA Dynamo, Apache-2.0; see its README). Both live inside the repository so a fresh clone runs
the whole suite on its own.
"""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"
REFERENCE_DIR = FIXTURES_DIR / "dsv4-reference"
K8S_DIR = FIXTURES_DIR / "k8s"


def load_jsonl(name: str) -> list[dict]:
    """The cases of one golden file of ``dsv4-reference/``, in file order."""
    with (REFERENCE_DIR / name).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
