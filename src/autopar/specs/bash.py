"""A small, non-executing reader for bash launch scripts.

Training launch scripts build their command line from variables: quoted argument strings
(``GPT_ARGS="--num-layers 32 \\ ..."``), bash arrays (``MODEL_ARGS=( ... )``), ``$VAR`` /
``${VAR}`` / ``${VAR:-default}`` / ``${ARR[@]}`` expansions, ``$((...))`` arithmetic,
backslash line continuations and comments. :class:`ShellScript` evaluates exactly that subset,
in order, without running anything: assignments update a variable table, every other statement
becomes an expanded ``argv`` (tokenised by :mod:`shlex`). What bash would only know at run time
(``$(command)``, back-quotes, variables never assigned in the script) expands to an *unknown*
marker; :func:`unknown_reason` turns a marked value into a sentence for the error message, so a
value the planner needs is never guessed.

Semantics follow the bash manual (``man bash``: QUOTING, PARAMETER EXPANSION, ARITHMETIC
EVALUATION, Word Splitting). Control flow (``if``/``for``/functions) is not interpreted: every
statement is read top to bottom.

Work is bounded, so that any input is read in about a second or refused with one error line: a
script of at most :data:`MAX_SCRIPT_CHARS` characters and :data:`MAX_SCRIPT_LINES` lines (and statements), each
statement expanding to at most :data:`MAX_EXPANDED_CHARS` characters and all of them together to at
most :data:`MAX_TOTAL_EXPANDED_CHARS`, expansions nested at most :data:`MAX_NESTING` deep (``${A:-${B:-...}}``,
``$((...$((...))...))``) and arithmetic following at most :data:`MAX_NESTING` variables that name
other variables (``A=B``, ``B=A`` is a cycle, named in the message as bash would only loop).
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field

from autopar.errors import AutoparError
from autopar.specs.bash_arith import evaluate

_MARK_OPEN, _MARK_CLOSE, _SPACE, _DOLLAR = "\x01", "\x02", "\x03", "\x04"
_ASSIGN = re.compile(r"\s*(?:(?:export|local|readonly|declare(?:\s+-\w+)*)\s+)?([A-Za-z_]\w*)(\+?)=")
_NAME = re.compile(r"[A-Za-z_]\w*")
_BRACED = re.compile(r"(#?)([A-Za-z_]\w*|\d+)(\[[@*\d]+\])?(?:(:?[-=+?])(.*))?", re.S)
_EXPANDS = re.compile(r"[\\'\"`$]")  # what expand() acts on outside single quotes
_SHLEX_SPECIAL = re.compile(r"[\\'\";&|<>]")  # text without these splits at whitespace alone
# the rest of a "..." string, backslash escapes kept (the unrolled loop: linear, no backtracking)
_DOUBLE_QUOTED_END = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SHLEX_WORD = re.compile(r"[^ \t\r\n]+")  # shlex's whitespace
Value = str | list[str]

# Bounds on the work of reading one script (see the module docstring). Launch scripts hold a few
# KB and tens of statements; Megatron-LM's and MindSpeed-LLM's examples are under 10 KB.
MAX_SCRIPT_CHARS = 1_000_000
MAX_SCRIPT_LINES = 10_000
# One expanded statement (a variable's value or a command line): A="$A$A" forty times grew to 2^40
# characters (a hang; shlex's tokeniser is quadratic in the length).
MAX_EXPANDED_CHARS = 100_000
MAX_TOTAL_EXPANDED_CHARS = 2_000_000  # all statements together (10,000 lines x "$LONG_ARGS")
# ${A:-${A:-...}} 400 deep overflowed Python's stack; bash's own arithmetic stops at 1,024 levels
# ("expression recursion level exceeded"); launch scripts nest two or three.
MAX_NESTING = 32


def unknown(reason: str) -> str:
    """A marker standing for a value only known when the script runs (``reason`` says why)."""
    # one word when split, and no '$' for a later expansion to escape (it printed as a backslash before the name)
    return f"{_MARK_OPEN}{reason.replace(' ', _SPACE).replace('$', _DOLLAR)}{_MARK_CLOSE}"


def unknown_reason(value: str) -> str | None:
    """The reason of the first unknown marker in ``value``, or None if it is fully known."""
    m = re.search(f"{_MARK_OPEN}(.*?){_MARK_CLOSE}", value)
    return m.group(1).replace(_SPACE, " ").replace(_DOLLAR, "$") if m else None


@dataclass(frozen=True)
class Statement:
    """One top-level statement: ``[start, end)`` offsets into the original text, and the
    statement with comments and backslash-newlines blanked out (same length, same offsets)."""

    start: int
    end: int
    clean: str


@dataclass
class ShellScript:
    """A bash script read statement by statement (see the module docstring).

    Attributes:
        text: the original script.
        clean: ``text`` with comments and line continuations replaced by spaces (same offsets).
        variables: final value of every variable (a string, or a list for arrays).
        commands: ``(statement, argv)`` for every statement that is not an assignment.
        assignments: for each scalar variable, the ``[start, end)`` offsets of each assigned
            value in ``text`` (for rewriting a value in place).
    """

    text: str
    clean: str = ""
    variables: dict[str, Value] = field(default_factory=dict)
    commands: list[tuple[Statement, list[str]]] = field(default_factory=list)
    assignments: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    _depth: int = field(default=0, repr=False)  # expand() calls in progress (nesting)
    _chain: list[str] = field(default_factory=list, repr=False)  # variables arithmetic is resolving
    _expanded_chars: int = field(default=0, repr=False)  # all statements so far

    def __post_init__(self) -> None:
        """Read every statement.

        Raises:
            AutoparError: a script beyond :data:`MAX_SCRIPT_CHARS` or :data:`MAX_SCRIPT_LINES`
                (before any parsing), a statement beyond the expansion bounds, unbalanced quotes
                or brackets.
        """
        check_script_size(len(self.text), self.text.count("\n") + 1)
        statements, self.clean = split_statements(self.text)
        check_script_size(len(self.text), len(statements))  # "X=1;" repeated on one line
        for st in statements:
            self._run(st)

    def _words(self, what: str, text: str) -> list[str]:
        """``text`` expanded and split into words; ``what`` names it in the error.

        Raises:
            AutoparError: the expansion passes :data:`MAX_EXPANDED_CHARS`, or the script's
                expansions together pass :data:`MAX_TOTAL_EXPANDED_CHARS`.
        """
        try:
            expanded = self.expand(text)
        except _TooLong:
            raise AutoparError(f"{what} expands to more than {MAX_EXPANDED_CHARS:,} characters, beyond what a "
                               "launch script needs") from None
        self._expanded_chars += len(expanded)
        if self._expanded_chars > MAX_TOTAL_EXPANDED_CHARS:
            raise AutoparError(f"the script's statements expand to more than {MAX_TOTAL_EXPANDED_CHARS:,} characters "
                               f"together (at {what}), beyond what a launch script needs")
        return split_words(expanded)

    def _run(self, st: Statement) -> None:
        m = _ASSIGN.match(st.clean)
        if not m:
            argv = [w for w in self._words("a command", st.clean) if w]
            if argv:
                self.commands.append((st, argv))
            return
        name, append, rest = m.group(1), m.group(2), st.clean[m.end():]
        if rest.startswith("("):
            close = _matching(rest, 0)
            words = [w for w in self._words(f"variable {name}", rest[1:close]) if w]
            old = self.variables.get(name, [])
            self.variables[name] = (list(old) if append and isinstance(old, list) else []) + words
            return
        word_end = _word_end(rest)
        words = self._words(f"variable {name}", rest[:word_end])
        value = words[0] if words else ""
        old = self.variables.get(name, "")
        self.variables[name] = (_scalar(old) + value) if append else value
        self.assignments.setdefault(name, []).append((st.start + m.end(), st.start + m.end() + word_end))

    # ----- expansion ------------------------------------------------------------------------
    def lookup(self, name: str) -> Value:
        """A variable's value; an unknown marker when the script never assigns it."""
        if name in self.variables:
            return self.variables[name]
        return unknown(f"${name} is not set in the script")

    def expand(self, text: str) -> str:
        """Expand parameters, arithmetic and command substitutions in ``text``.

        The result is shell-quoted text for :func:`split_words`: values substituted outside
        double quotes are word-split (bash Word Splitting), inside double quotes they stay one word.

        Raises:
            AutoparError: expansions nested more than :data:`MAX_NESTING` deep.
            _TooLong: the result passes :data:`MAX_EXPANDED_CHARS` (the caller names the statement).
        """
        if self._depth >= MAX_NESTING:
            raise AutoparError(f"expansions nested more than {MAX_NESTING} deep (${{...${{...}}...}} or "
                               f"$((...$((...))...))) near {text[:40]!r}")
        self._depth += 1
        try:
            return self._expand(text)
        finally:
            self._depth -= 1

    def _expand(self, text: str) -> str:
        out: list[str] = []
        size, i, quote = 0, 0, ""
        while i < len(text):
            if size > MAX_EXPANDED_CHARS:
                raise _TooLong
            if quote == "'":  # copy up to and with the closing quote
                close = text.find("'", i)
                close = len(text) - 1 if close < 0 else close
                out.append(text[i:close + 1])
                size += close + 1 - i
                i, quote = close + 1, ""
                continue
            special = _EXPANDS.search(text, i)
            if special is None or special.start() > i:  # plain text up to the next special character
                stop = len(text) if special is None else special.start()
                out.append(text[i:stop])
                size += stop - i
                i = stop
                continue
            c = text[i]
            if c == "\\" and i + 1 < len(text):
                out.append(text[i:i + 2])
                i += 1
            elif c in "'\"" and (not quote or c == quote):
                if c == "'" and quote == '"':
                    out.append(c)
                else:
                    quote = "" if quote else c
                    out.append(c)
            elif c == "`":
                close = text.find("`", i + 1)
                i = len(text) if close < 0 else close
                out.append(self._emit(unknown("a `command` substitution"), bool(quote)))
            elif c == "$":
                value, i = self._dollar(text, i)
                if value is None:
                    out.append("$")
                elif isinstance(value, list):
                    words = " ".join(shlex.quote(w) for w in value)
                    out.append(f'" {words} "' if quote else words)
                else:
                    out.append(self._emit(value, bool(quote)))
                size += len(out[-1])
                continue
            else:
                out.append(c)
            size += len(out[-1])
            i += 1
        if size > MAX_EXPANDED_CHARS:
            raise _TooLong
        return "".join(out)

    @staticmethod
    def _emit(value: str, quoted: bool) -> str:
        if quoted:
            return re.sub(r'(["\\$`])', r"\\\1", value)
        return " ".join(shlex.quote(w) for w in value.split()) if value.strip() else ""

    def _dollar(self, text: str, i: int) -> tuple[Value | None, int]:
        """Expand the ``$`` construct at ``text[i]``; returns (value, index after it)."""
        if text.startswith("$((", i):
            close = _matching(text, i + 1)
            inner = text[i + 3:close - 1]
            return self.arithmetic(inner), close + 1
        if text.startswith("$(", i):
            return unknown("a $(command) substitution"), _matching(text, i + 1) + 1
        if text.startswith("${", i):
            close = _matching(text, i + 1, "{", "}")
            return self._braced(text[i + 2:close]), close + 1
        m = _NAME.match(text, i + 1)
        if m:
            return self.lookup(m.group(0)), m.end()
        if i + 1 < len(text) and (text[i + 1].isdigit() or text[i + 1] in "@*#?!$"):
            return unknown(f"${text[i + 1]} is only known at run time"), i + 2
        return None, i + 1

    def _braced(self, body: str) -> Value:
        m = _BRACED.fullmatch(body)
        if not m:
            return unknown(f"${{{body[:40]}}} is not supported")
        count, name, index, op, word = m.groups()
        value = self.variables.get(name)
        if index and index[1:-1] not in "@*":
            items = value if isinstance(value, list) else [value] if value is not None else []
            k = int(index[1:-1])
            value = items[k] if k < len(items) else None
        if count:
            return str(len(value) if isinstance(value, list) else len(value or ""))
        empty = value is None or (op and op.startswith(":") and value in ("", []))
        if op and op[-1] in "-=" and empty:
            default = split_words(self.expand(word or ""))
            value = " ".join(default)
            if op[-1] == "=":
                self.variables[name] = value
        elif op and op[-1] == "+":
            value = "" if empty else " ".join(split_words(self.expand(word or "")))
        if value is None:
            return unknown(f"${name} is not set in the script")
        return value

    def arithmetic(self, expr: str) -> str:
        """``$((expr))`` as a decimal string (bash integer arithmetic), or an unknown marker."""
        expanded = " ".join(split_words(self.expand(expr))) or "0"
        if unknown_reason(expanded):
            return expanded
        try:
            return str(evaluate(expanded, lambda n: self._integer(n)))
        except _Unknown as err:
            return unknown(str(err))
        except AutoparError as err:
            return unknown(f"$(({expr.strip()[:40]})): {err}")

    def _integer(self, name: str) -> int:
        """The integer value of variable ``name`` in arithmetic; a value naming another variable
        is evaluated in turn (bash), at most :data:`MAX_NESTING` deep.

        Raises:
            _Unknown: the value is only known at run time, the variables form a cycle, or the
                chain is longer than :data:`MAX_NESTING`.
        """
        if name in self._chain:
            cycle = " -> ".join(self._chain[self._chain.index(name):] + [name])
            raise _Unknown(f"variables {cycle[:120]} refer to each other in arithmetic")
        if len(self._chain) >= MAX_NESTING:
            raise _Unknown(f"${self._chain[0]} names another variable more than {MAX_NESTING} times in arithmetic")
        value = _scalar(self.lookup(name))
        if unknown_reason(value):
            raise _Unknown(unknown_reason(value))
        self._chain.append(name)
        try:
            return evaluate(value.strip() or "0", self._integer)
        finally:
            self._chain.pop()


class _Unknown(Exception):
    """An arithmetic operand whose value is only known at run time."""


class _TooLong(Exception):
    """An expansion passed :data:`MAX_EXPANDED_CHARS` (the statement is named by the caller)."""


def check_script_size(num_chars: int, num_lines: int) -> None:
    """Refuse a script beyond :data:`MAX_SCRIPT_CHARS` characters or :data:`MAX_SCRIPT_LINES`
    lines (or statements) before reading it (``num_chars`` may be a file's size in bytes, an
    upper bound).

    Raises:
        AutoparError: the size, the bound and what launch scripts hold.
    """
    if num_chars > MAX_SCRIPT_CHARS:
        raise AutoparError(f"{num_chars:,} bytes, beyond the {MAX_SCRIPT_CHARS:,} a launch script is read up to "
                           "(they hold a few KB)")
    if num_lines > MAX_SCRIPT_LINES:
        raise AutoparError(f"{num_lines:,} lines or statements, beyond the {MAX_SCRIPT_LINES:,} a launch script is "
                           "read up to (they hold tens to hundreds)")


def split_words(text: str) -> list[str]:
    """Split shell-quoted text into words (:mod:`shlex`, POSIX rules); an unbalanced quote is an
    error. Operators (``|``, ``;``, ``&&``, redirections) become words of their own. Text with no
    quote, backslash or operator is split at whitespace directly (what shlex does with it; its
    set-up alone costs 20 us, most of a 500,000-line script's reading time)."""
    if not _SHLEX_SPECIAL.search(text):
        return _SHLEX_WORD.findall(text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError as err:
        raise AutoparError(f"cannot split shell words ({err}) in: {text.strip()[:60]!r}") from None


def _scalar(value: Value) -> str:
    return value[0] if isinstance(value, list) and value else value if isinstance(value, str) else ""


@functools.lru_cache(maxsize=8)
def _stops(wanted: str) -> re.Pattern:
    """A pattern matching a character of ``wanted`` (``\\s``: whitespace), a quote or a backslash."""
    return re.compile("[" + re.escape(wanted.replace("\\s", "")) + ("\\s" if "\\s" in wanted else "") + "\\\\'\"]")


def _unquoted(text: str, start: int, wanted: str) -> Iterator[tuple[int, str]]:
    """``(index, char)`` of each character of ``text`` from ``start`` that is in ``wanted``
    (``\\s``: any whitespace), outside quotes and not backslash-escaped (bash rules: nothing
    escapes inside ``'...'``). Jumps from one candidate to the next (a regular expression), so
    a long statement costs little."""
    stops, i = _stops(wanted), start
    while (m := stops.search(text, i)) is not None:
        i, c = m.start(), m.group()
        if c == "\\":
            i += 2
        elif c == "'":
            close = text.find("'", i + 1)
            if close < 0:
                return
            i = close + 1
        elif c == '"':
            close = _DOUBLE_QUOTED_END.match(text, i + 1)
            if close is None:
                return
            i = close.end()
        else:
            yield i, c
            i += 1


def _word_end(text: str) -> int:
    """Index just after the first shell word of ``text`` (quotes, ``$(...)`` and ``${...}``
    respected)."""
    depth = 0
    for i, c in _unquoted(text, 0, "\\s;&|<>(){}"):
        if c in "({" and (depth or text[i - 1 : i] == "$"):
            depth += 1
        elif c in ")}" and depth:
            depth -= 1
        elif not depth and (c.isspace() or c in ";&|<>"):
            return i
    return len(text)


def _matching(text: str, i: int, open_: str = "(", close: str = ")") -> int:
    """Index of the bracket closing the one at ``text[i]`` (quotes respected).

    Raises:
        AutoparError: unbalanced brackets.
    """
    depth = 0
    for j, c in _unquoted(text, i, open_ + close):
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j
    raise AutoparError(f"unbalanced {open_!r} in script near: {text[i:i + 40]!r}")


def split_statements(text: str) -> tuple[list[Statement], str]:
    """Cut ``text`` into top-level statements at unquoted newlines and ``;``.

    Returns the statements and the whole text with comments and backslash-newlines blanked
    (the same length as ``text``, so offsets agree).

    Raises:
        AutoparError: an unterminated quote or bracket.
    """
    clean = list(text)
    statements: list[Statement] = []
    start, depth, quote, i = 0, 0, "", 0
    while i < len(text):
        c = text[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\" and i + 1 < len(text):
            if text[i + 1] == "\n":
                clean[i] = clean[i + 1] = " "
            i += 1
        elif quote == '"':
            quote = "" if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1].isspace() or text[i - 1] in ";("):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            clean[i:end] = " " * (end - i)
            i = end
            continue
        elif c in "({":
            depth += 1
        elif c in ")}":
            depth = max(0, depth - 1)
        elif c in "\n;" and depth == 0:
            statements.append(Statement(start, i, "".join(clean[start:i])))
            start = i + 1
        i += 1
    if quote:
        raise AutoparError(f"unterminated {quote} quote in the script")
    statements.append(Statement(start, len(text), "".join(clean[start:])))
    return [s for s in statements if s.clean.strip()], "".join(clean)
