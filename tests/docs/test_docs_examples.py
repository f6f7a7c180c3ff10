"""Every ``$ autopar ...`` example of the documentation runs and prints what the docs show
(format and runner: ``tools/docs_examples.py``); the parser and checker are tested on their own."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("docs_examples", ROOT / "tools" / "docs_examples.py")
docs_examples = importlib.util.module_from_spec(_spec)
sys.modules["docs_examples"] = docs_examples  # dataclasses look their module up there
_spec.loader.exec_module(docs_examples)

BLOCKS = docs_examples.blocks()


def test_the_docs_have_examples_for_every_command():
    """Every command but ``profile`` (it measures on a GPU, with torch) has a runnable example."""
    run = {e.argv[0] for b in BLOCKS for e in b.examples}
    assert {"search", "estimate", "devices", "balance", "export", "validate"} <= run


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.path.relative_to(ROOT / 'docs')}:{b.span[0]}" for b in BLOCKS])
def test_docs_example_runs_and_prints_what_is_shown(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for example in block.examples:
        code, output = docs_examples.run(example.argv)
        assert code == 0, f"autopar {' '.join(example.argv)} exited {code}:\n{output}"
        missing = docs_examples.missing_lines(example.shown, output)
        assert not missing, (f"autopar {' '.join(example.argv)}: {len(missing)} shown line(s) not printed, first "
                             f"{missing[0]!r} (python tools/docs_examples.py --update rewrites them)")


def test_parse_block_joins_continuations_and_keeps_output():
    examples = docs_examples.parse_block("$ autopar search \\\n    --top 3\nline one\n...\n$ autopar devices\nx\n")
    assert [e.argv for e in examples] == [["search", "--top", "3"], ["devices"]]
    assert examples[0].shown == ["line one", "..."] and examples[1].shown == ["x"]


def test_parse_block_refuses_other_programs():
    with pytest.raises(ValueError, match="only autopar"):
        docs_examples.parse_block("$ rm -rf out\n")


def test_missing_lines_masks_timings_and_checks_order():
    output = "a\n8,960 layouts enumerated in 0.11 s; rest\nb\n"
    assert docs_examples.missing_lines(["8,960 layouts enumerated in 9.99 s; rest", "...", "b"], output) == []
    assert docs_examples.missing_lines(["b", "a"], output) == ["a"]  # out of order
    assert docs_examples.missing_lines(["c"], output) == ["c"]
