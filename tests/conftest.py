import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a copy of ../shared/reference/published.json (each entry names its source): tests read only the repository
PUBLISHED = ROOT / "tests" / "data" / "published.json"
sys.path.insert(0, str(ROOT))


def published_cases(prefix: str) -> list[dict]:
    """Entries of tests/data/published.json whose id starts with ``prefix``."""
    return [e for e in json.loads(PUBLISHED.read_text()) if e["id"].startswith(prefix)]


def published(id_: str) -> dict:
    for e in json.loads(PUBLISHED.read_text()):
        if e["id"] == id_:
            return e
    raise KeyError(id_)


@pytest.fixture
def root() -> Path:
    return ROOT
