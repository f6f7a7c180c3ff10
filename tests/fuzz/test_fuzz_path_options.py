"""Fuzz the file and directory options (``--model``, ``--script``, ``--device-file``, ``--from``,
``--layers``, ``--csv``, ``--profile-db`` to read; ``--out``, ``--plot``, ``--write-script``,
``--report`` to write) with odd paths: a directory, a missing file, a path under ``/dev/null``, a
binary file, an empty file, blanks. The run must succeed or give one ``error:`` line naming the
option (see :mod:`fuzz_support`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import MODELS, SCRIPTS
from fuzz_support import check_outcome, fuzz_settings, option_needles, run_cli

pytestmark = pytest.mark.fuzz

LLAMA = ["-m", "llama3-8b", "--device", "h100-80gb"]
#: (command line without the option, option): each reads or writes one path.
USES = [
    (["estimate", "--device", "h100-80gb", "--json"], "--model"),
    (["estimate", "--device", "h100-80gb", "--vocab-size", "32000", "--json"], "--script"),
    (["estimate", "-m", "llama3-8b", "--json"], "--device-file"),
    (["export", "--format", "megatron", *LLAMA], "--from"),
    (["balance"], "--layers"),
    (["validate", "--out", "{dir}/report"], "--csv"),
    (["search", *LLAMA, "--top", "1", "--json"], "--profile-db"),
    (["export", "--format", "megatron", *LLAMA], "--out"),
    (["export", "--format", "deepspeed", *LLAMA, "--zero", "1"], "--out"),
    (["balance", *LLAMA, "--pp", "2"], "--plot"),
    (["search", *LLAMA, "--top", "1", "--script", str(SCRIPTS / "pretrain_llama2_7b.sh"), "--vocab-size", "32000",
      "--json"], "--write-script"),
    (["search", *LLAMA, "--top", "1", "--json"], "--report"),
]
#: Odd paths, relative to a scratch directory ({dir}).
PATHS = ["{dir}", "{dir}/missing.json", "{dir}/missing/x.json", "/dev/null/x", "{dir}/binary.bin", "{dir}/empty.json",
         "{dir}/nested.json", "{dir}/text.txt", "{dir}/out.png", "{dir}/out.sh", "{dir}/new_dir/", "x" * 300,
         "{dir}/" + "x" * 300 + ".json"]  # (a NUL byte cannot be in a command-line argument)


def _scratch(d: Path) -> Path:
    """A scratch directory with the odd files of :data:`PATHS`."""
    (d / "binary.bin").write_bytes(b"\xff\xfe\x00\x01")
    (d / "empty.json").write_text("")
    (d / "nested.json").write_text("[" * 5000 + "]" * 5000)
    (d / "text.txt").write_text("hello\n")
    return d


def _run_path_case(use, path) -> None:
    base, option = use
    with tempfile.TemporaryDirectory() as tmp:  # fresh per example: an output must not become a later input
        d = _scratch(Path(tmp))
        out = run_cli([a.format(dir=d) for a in base] + [option, path.format(dir=d)])
    check_outcome(out, option_needles(option))


@fuzz_settings(60)
@given(use=st.sampled_from(USES), path=st.sampled_from(PATHS))
def test_odd_paths(use, path):
    _run_path_case(use, path)


@fuzz_settings(12)
@given(use=st.sampled_from(USES), blank=st.sampled_from(["", " "]))
def test_blank_path_is_refused(use, blank):
    """An empty path is never a file: ``export --from ''`` exported the default layout, ``validate
    --csv ''`` scored the shipped CSV, ``--out ''`` printed to stdout."""
    base, option = use
    with tempfile.TemporaryDirectory() as tmp:
        out = run_cli([a.format(dir=tmp) for a in base] + [option, blank])
    assert out.exit_code == 2, f"{option}={blank!r} was accepted"
    check_outcome(out, option_needles(option))


#: (command, input option, output option): the same file given as both.
SAME_FILE = [
    (["export", "--format", "megatron", "--device", "h100-80gb", "--vocab-size", "32000"], "--script", "--out"),
    (["export", "--format", "megatron", "--device", "h100-80gb"], "--model", "--out"),
    (["export", "--format", "megatron", "-m", "llama3-8b"], "--device-file", "--out"),
    (["search", "--device", "h100-80gb", "--top", "1", "--vocab-size", "32000"], "--script", "--write-script"),
    (["balance", "--device", "h100-80gb", "--pp", "2"], "--model", "--plot"),
]


@fuzz_settings(10)
@given(case=st.sampled_from(SAME_FILE), link=st.booleans())
def test_output_over_an_input_is_refused(case, link):
    """``export --script run.sh --out run.sh`` replaced the launch script with the export."""
    base, source, target = case
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        content = {"--script": (SCRIPTS / "pretrain_llama2_7b.sh").read_text(),
                   "--model": (MODELS / "llama3-8b.json").read_text(), "--device-file": "base: h100-80gb\n"}[source]
        name = {"--script": "run.sh", "--model": "config.json", "--device-file": "dev.yaml"}[source]
        if target == "--plot":
            name = "config.png"  # balance --model m.svg --plot m.svg
        path = d / name
        path.write_text(content)
        other = d / "alias"
        other.symlink_to(path)
        out = run_cli([*base, source, path, target, other if link else path])
        kept = path.read_bytes() == content.encode()
    assert out.exit_code == 2 and kept, f"{source} and {target} the same file: exit {out.exit_code}, input kept {kept}"
    check_outcome(out, option_needles(target))
