"""Fuzz the launch-script reader through ``autopar estimate --script FILE --json`` (the script's own
layout) and ``autopar search --script FILE --write-script OUT``: the shipped Megatron-LM scripts
with a flag's value or a variable replaced by an odd shell word (odd quoting, expansions, command
substitutions, arithmetic, huge numbers), a flag line dropped, or an odd line inserted. The run
must give valid JSON (and the rewritten script) or one ``error:`` line that names the flag or
variable changed (see :mod:`fuzz_support`)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import SCRIPTS
from fuzz_support import HUGE_DIGITS, check_outcome, fuzz_settings, module_workdir, option_needles, run_cli

pytestmark = pytest.mark.fuzz

BASES = {path.name: path.read_text() for path in sorted(SCRIPTS.glob("*.sh"))}

#: Well-formed shell words a hand-edited script may hold where a number or a name belongs: the
#: error must then name the flag or variable changed.
VALUE_WORDS = st.one_of(
    st.sampled_from([
        "0", "-1", "-0", "1", "3", "7", "4097", "1.5", "1e3", "0x10", "010", "2147483648", "9223372036854775808",
        HUGE_DIGITS, "abc", "ß∂", "''", '""', "' '", "'2'", '"2"', "\\", "$UNSET", "${UNSET}", "${UNSET:-4}",
        "${TP:+x}", "${#TP}", "${TP/2/3}", "${TP:-${PP:-${NNODES}}}", "$((1/0))", "$((2**64))", "$((-3))",
        "$((TP*PP))", "$(date)", "`hostname`", "$(($(echo 3)))", "{1..3}", "*", "~", "'a b'", '"$TP $PP"',
        "${TP}${PP}", "$TP$PP", "$'\\x41'", '"${ARR[@]}"', "${ARR[0]}", "$$", "${UNSET:?}",
    ]),
    st.integers(min_value=-5, max_value=5000).map(str),
    st.text(alphabet="0123456789abcxyz.-+_", min_size=1, max_size=6),
)
#: Words that change the script's structure (quotes, operators, a comment, a line continuation):
#: what breaks is not known, so any one ``error:`` line will do.
SYNTAX_WORDS = st.one_of(
    st.sampled_from(["'", '"', "\\", "$", "$((", "(", ")", ";", "&&", "|", "#", "\t", "<<EOF", "2>&1", "a b"]),
    st.text(alphabet="0123456789$'\"{}()-+*/:\\ abc;|&#", max_size=6),
)
#: How errors name the layout and cluster flags besides their own spelling (autopar's layout fields).
ALIASES = {"--tensor-model-parallel-size": ["tp"], "--pipeline-model-parallel-size": ["pp"],
           "--expert-model-parallel-size": ["ep"], "--expert-tensor-parallel-size": ["etp"],
           "--context-parallel-size": ["cp"], "--micro-batch-size": ["mbs", "num_microbatches"],
           "--global-batch-size": ["global batch size", "num_microbatches"], "--seq-length": ["seq_len"],
           "--nnodes": ["world size", "mbs*dp"], "--nproc_per_node": ["world size", "mbs*dp"],
           "--num-query-groups": ["num_key_value_heads"],
           "--num-experts": ["routed experts"], "--num-attention-heads": ["num_attention_heads"],
           "--hidden-size": ["hidden_size"], "--ffn-hidden-size": ["ffn_hidden_size"]}

#: Whole lines inserted somewhere in a script.
ODD_LINES = st.sampled_from([
    'A="unterminated', "B='unterminated", "C=$(unterminated", "D=${unterminated", "E=$((1+", "F=(1 2",
    "G=$G$G", "H=${H:-${H}}", "export", "export =", "unset TP", "TP=", "PP=", "readonly TP=3", "declare -a X=(1 2)",
    "if [ 1 ]; then", "fi", "for i in 1 2; do", "done", "function f() { echo; }", "f() {", "}", "source x.sh",
    ". ./other.sh", "set -e", "cat <<EOF", "EOF", "eval \"$GPT_ARGS\"", "shift 3", "\\", "((TP=TP+1))",
    "let TP=9", "A=B", "B=A", "echo $((A))", "ARR=(); ARR+=(--tp 3)", "${NOTHING}", "\x00", "é=1", "TP=\u00a02",
])


def _flag_lines(text: str) -> list[tuple[int, str]]:
    """(line number, flag) of each line that starts with a ``--flag`` taking a value."""
    out = []
    for i, line in enumerate(text.splitlines()):
        m = re.match(r"\s*(--[\w-]+)\s+([^\s\\]+)", line)
        if m and not m.group(2).startswith("--"):
            out.append((i, m.group(1)))
    return out


def _assignments(text: str) -> list[tuple[int, str]]:
    """(line number, variable) of each one-line ``NAME=value`` (not an array or a quoted block)."""
    return [(i, m.group(1)) for i, line in enumerate(text.splitlines())
            if (m := re.match(r"(\w+)=(?![(\"]\s*$)", line))]


def _needles(flag: str) -> list:
    """How an error may name ``flag`` (see :data:`ALIASES`)."""
    return [*option_needles(flag), *ALIASES.get(flag, [])]


def _users(text: str, var: str) -> list[str]:
    """The flags whose value line mentions ``$var`` or ``${var}``."""
    return [m.group(1) for m in re.finditer(rf"(--[\w-]+)\s+\S*\$\{{?{var}\b", text)]


@st.composite
def mutated_script(draw) -> tuple[str, list[str]]:
    """(script text, needles: the flag/variable names the mutation changed, the script's name for
    an inserted line, none for a structural change)."""
    name = draw(st.sampled_from(sorted(BASES)))
    lines = BASES[name].splitlines()
    kind = draw(st.sampled_from(["flag value", "variable", "drop flag", "syntax", "insert line"]))
    if kind in ("flag value", "syntax"):
        i, flag = draw(st.sampled_from(_flag_lines(BASES[name])))
        word = draw(VALUE_WORDS if kind == "flag value" else SYNTAX_WORDS)
        lines[i] = re.sub(rf"({re.escape(flag)}\s+)[^\s\\]+", lambda m: m.group(1) + word, lines[i], count=1)
        needles = _needles(flag) if kind == "flag value" else []
    elif kind == "variable":
        i, var = draw(st.sampled_from(_assignments(BASES[name])))
        lines[i] = f"{var}={draw(VALUE_WORDS)}"
        needles = [var, *(n for flag in _users(BASES[name], var) for n in _needles(flag))]
        if var in ("NNODES", "GPUS_PER_NODE"):
            needles += [*_needles("--nnodes"), *_needles("--nproc_per_node")]
    elif kind == "drop flag":
        i, flag = draw(st.sampled_from(_flag_lines(BASES[name])))
        lines[i] = re.sub(rf"{re.escape(flag)}\s+[^\s\\]+", "", lines[i], count=1)
        needles = _needles(flag)
    else:
        lines.insert(draw(st.integers(0, len(lines))), draw(ODD_LINES))
        needles = ["job.sh"]  # what the line breaks is not known: the message must name the script
    return "\n".join(lines) + "\n", needles


workdir = module_workdir("fuzz_script")


COMMON = ["--device", "h100-80gb", "--vocab-size", "32000"]


@fuzz_settings(120)
@given(case=mutated_script())
def test_mutated_script_estimate(workdir, case):
    text, needles = case
    path = workdir / "job.sh"
    path.write_text(text)
    out = run_cli(["estimate", "--script", path, *COMMON, "--json"])
    check_outcome(out, needles, json_stdout=True)


@fuzz_settings(25)
@given(case=mutated_script())
def test_mutated_script_search_and_rewrite(workdir, case):
    text, needles = case
    path, rewritten = workdir / "job.sh", workdir / "best.sh"
    path.write_text(text)
    rewritten.unlink(missing_ok=True)
    out = run_cli(["search", "--script", path, *COMMON, "--top", "1", "--write-script", rewritten, "--json"])
    if needles:  # a search may find nothing that fits the changed model or cluster
        needles = [*needles, "no layout fits", "no valid layout"]
    # nothing faster enough to rewrite the script: exit 0, said on stderr, nothing written
    kept = out.exit_code == 0 and out.stderr.startswith(f"not written: {rewritten}: ")
    check_outcome(out, needles, json_stdout=True, files=[] if kept else [rewritten])


NESTED_OPERATORS = ["${{V:-{}}}", "${{V:+{}}}", "${{V:={}}}", "$(( {} + 1 ))", '"{}"', "$(echo {})"]


@st.composite
def nested_value(draw, depths: st.SearchStrategy[int], operators: list[str] = NESTED_OPERATORS) -> str:
    """A value nested ``depth`` times in one kind of expansion, arithmetic, quotes or substitution
    (mixed kinds stop the reader early: ``$(...)`` is not expanded)."""
    value, operator = "2", draw(st.sampled_from(operators))
    for _ in range(draw(depths)):
        value = operator.format(value)
    return value


def _nested_script(value: str) -> str:
    return BASES["pretrain_llama2_7b.sh"].replace("TP=2", f"TP={value}", 1)


@fuzz_settings(20)
@given(value=nested_value(st.integers(1, 200)))
def test_nested_expansions(workdir, value):
    path = workdir / "job.sh"
    path.write_text(_nested_script(value))
    check_outcome(run_cli(["estimate", "--script", path, *COMMON, "--json"]), ["TP", *_needles(
        "--tensor-model-parallel-size"), "job.sh"], json_stdout=True)


@fuzz_settings(3)
@given(value=nested_value(st.integers(4000, 6000), NESTED_OPERATORS[:1] + NESTED_OPERATORS[2:3]))  # ${V:-..}, ${V:=..}
def test_deeply_nested_expansions(workdir, value):
    """Thousands of levels (the reader recursed once per level: a RecursionError from ~400 in the
    CLI; hypothesis raises the recursion limit while a test runs): refused by the reader's nesting
    limit (specs/bash.py), naming the script."""
    path = workdir / "job.sh"
    path.write_text(_nested_script(value))
    check_outcome(run_cli(["estimate", "--script", path, *COMMON, "--json"]), ["TP", *_needles(
        "--tensor-model-parallel-size"), "job.sh"], json_stdout=True)
