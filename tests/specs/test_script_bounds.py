"""The launch-script reader's work bounds (autopar.specs.bash): nesting depth, variable cycles in
arithmetic, script size, lines and statements, expansion size. Each input once crashed
(RecursionError), printed a 5,000-character error line, or took 30 s; each is now refused with
one error line before the work it would cost, and the fast paths equal what they replace."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.specs import bash
from autopar.specs.bash import ShellScript, split_words, unknown_reason
from test_bad_input import BASE_SCRIPT, one_line_error

SCRIPT_ARGS = ["--device", "h100-80gb", "--vocab-size", "32000"]


def _estimate_error(tmp_path, text: str) -> str:
    path = tmp_path / "job.sh"
    path.write_text(text)
    return one_line_error(["estimate", "--script", str(path), *SCRIPT_ARGS])


@pytest.mark.parametrize("nested", [
    "${A:-" * 400 + "1" + "}" * 400,  # RecursionError
    "$((" * 400 + "1" + "))" * 400,
    "${A:-" * (bash.MAX_NESTING + 1) + "1" + "}" * (bash.MAX_NESTING + 1),
])
def test_nesting_beyond_the_bound_is_one_line(tmp_path, nested):
    err = _estimate_error(tmp_path, BASE_SCRIPT.replace("TP=2", f"X={nested}\nTP=2", 1))
    assert err.startswith("error: job.sh: expansions nested more than 32 deep") and len(err) < 200


def test_nesting_within_the_bound_is_read():
    depth = bash.MAX_NESTING - 1  # the statement's own expand() is the first level
    assert ShellScript("X=" + "${A:-" * depth + "7" + "}" * depth).variables["X"] == "7"
    assert ShellScript("X=" + "$((1+" * depth + "1" + "))" * depth).variables["X"] == str(depth + 1)


def test_variable_cycle_in_arithmetic_is_named(tmp_path):
    """A=B, B=A, $((A)): bash loops until "expression recursion level exceeded"; the message had
    5,265 characters (one 'cannot evaluate' per Python frame)."""
    text = BASE_SCRIPT.replace("TP=2", "A=B\nB=A\nTP=$((A))", 1)
    err = _estimate_error(tmp_path, text)
    assert "variables A -> B -> A refer to each other in arithmetic" in err and len(err) < 200
    assert "variables A -> A" in unknown_reason(ShellScript("A=A+1\nX=$((A))").variables["X"])


def test_variable_chains_in_arithmetic():
    """A chain of names resolves (bash: A0=A1, A1=A2, ... evaluates the last) up to the bound."""
    chain = "".join(f"A{i}=A{i + 1}\n" for i in range(bash.MAX_NESTING - 1))
    ok = ShellScript(chain + f"A{bash.MAX_NESTING - 1}=5\nX=$((A0*2))")
    assert ok.variables["X"] == "10"
    long = "".join(f"A{i}=A{i + 1}\n" for i in range(bash.MAX_NESTING + 5)) + f"A{bash.MAX_NESTING + 5}=5\nX=$((A0))"
    assert "more than 32 times" in unknown_reason(ShellScript(long).variables["X"])


def test_large_script_file_is_refused_before_reading(tmp_path, monkeypatch):
    """The 2 MB, 500,000-line script took 30 s: a file over MAX_SCRIPT_CHARS bytes is refused from
    its size, without reading it (read_text is never called)."""
    monkeypatch.setattr(bash, "MAX_SCRIPT_CHARS", 1000)
    monkeypatch.setattr("autopar.specs.script.read_text", lambda *a: pytest.fail("the file was read"))
    err = _estimate_error(tmp_path, "X=1\n" * 251)
    assert err.endswith("1,004 bytes, beyond the 1,000 a launch script is read up to (they hold a few KB)")
    assert "--script=" in err


@pytest.mark.parametrize("prefix, count", [
    ("X=1\n" * 10_001, lambda script: script.count("\n") + 1),  # lines, counted before parsing
    ("X=1;" * 10_001, lambda script: 10_001 + len(bash.split_statements(BASE_SCRIPT)[0])),  # statements, one line
])
def test_too_many_lines_or_statements(tmp_path, prefix, count):
    script = prefix + "\n" + BASE_SCRIPT
    err = _estimate_error(tmp_path, script)
    assert err == f"error: job.sh: {count(script):,} lines or statements, beyond the 10,000 a launch script is read " \
                  "up to (they hold tens to hundreds)"


def test_total_expansion_is_bounded(tmp_path):
    """Each statement under the per-statement bound, all of them together over the total."""
    long = "x" * (bash.MAX_EXPANDED_CHARS - 100)
    text = f"L={long}\n" + "echo $L\n" * (bash.MAX_TOTAL_EXPANDED_CHARS // len(long) + 1) + BASE_SCRIPT
    err = _estimate_error(tmp_path, text)
    assert "the script's statements expand to more than 2,000,000 characters together (at a command)" in err


# ----- the fast paths equal what they replace -------------------------------------------------------
_SHELL_TEXT = st.text(alphabet=st.sampled_from(list("ab $'\"\\;&|<>(){}#=\t\n") + ["\x01", "\x03"]), max_size=40)


@settings(max_examples=300, deadline=None)
@given(_SHELL_TEXT)
def test_split_words_equals_shlex(text):
    """Text without quotes, backslashes or operators is split without shlex: same words."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        expected = list(lexer)
    except ValueError:
        return  # unbalanced quotes: split_words raises (tested with the scripts)
    assert split_words(text) == expected


def _unquoted_chars(text: str, start: int) -> list[tuple[int, str]]:
    """Oracle: every unquoted, unescaped character, one at a time (the reader before the
    regular-expression jumps)."""
    out, i, quote = [], start, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        else:
            out.append((i, c))
        i += 1
    return out


@settings(max_examples=300, deadline=None)
@given(_SHELL_TEXT, st.integers(0, 5))
def test_unquoted_jumps_equal_the_character_scan(text, start):
    for wanted in ("()", "{}", "\\s;&|<>(){}"):
        keep = (lambda c: c.isspace() or c in ";&|<>(){}") if "\\s" in wanted else (lambda c: c in wanted)
        expected = [(i, c) for i, c in _unquoted_chars(text, start) if keep(c)]
        assert list(bash._unquoted(text, start, wanted)) == expected
