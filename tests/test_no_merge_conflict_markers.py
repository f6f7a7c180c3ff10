"""No source, doc or data file of the repository holds a merge-conflict marker line."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)
SUFFIXES = {".py", ".md", ".json", ".yml", ".yaml", ".toml", ".sh", ".csv", ".txt", ".cfg", ".html"}
FOLDERS = ("src", "tests", "docs", "benchmarks", "tools", ".ci")


def test_no_file_holds_a_conflict_marker():
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "mkdocs.yml"]
    for folder in FOLDERS:
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and (p.suffix in SUFFIXES or folder == ".ci")]
    assert len(files) > 100
    marked = [str(p.relative_to(ROOT)) for p in files if MARKER.search(p.read_text(errors="replace"))]
    assert marked == []
