import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT.parent / "shared" / "reference" / "published.json"
sys.path.insert(0, str(ROOT))


def published_cases(prefix: str) -> list[dict]:
    """Entries of shared/reference/published.json whose id starts with ``prefix``."""
    return [e for e in json.loads(PUBLISHED.read_text()) if e["id"].startswith(prefix)]


def published(id_: str) -> dict:
    for e in json.loads(PUBLISHED.read_text()):
        if e["id"] == id_:
            return e
    raise KeyError(id_)


@pytest.fixture
def root() -> Path:
    return ROOT
