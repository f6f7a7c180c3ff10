"""Integer arithmetic of bash ``$((...))`` and Megatron's list expressions, without running code.

:func:`evaluate` walks the Python AST of the expression (``+ - * / % **``, parentheses, names,
lists): bash ``ARITHMETIC EVALUATION`` semantics (64-bit integers, ``/`` truncating towards zero),
bounded so that no input runs long: values at most :data:`MAX_MAGNITUDE`, lists at most
:data:`MAX_LIST_LENGTH` entries, powers refused before they are computed.
"""

from __future__ import annotations

import ast
import math
import operator

from autopar.errors import AutoparError

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod,
           ast.Pow: operator.pow, ast.FloorDiv: operator.floordiv,
           ast.Div: lambda a, b: int(a / b) if isinstance(a, int) else operator.truediv(a, b)}


MAX_MAGNITUDE = 2**63  # bash arithmetic is 64-bit: a larger value is a typo, and 10**10**10 would never finish
MAX_LIST_LENGTH = 100_000  # a layer pattern longer than any model (num_layers <= 10,000)


def _check_operands(op: ast.operator, left, right) -> None:
    """Refuse a power or list repetition whose result would not fit (before computing it)."""
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 \
            and right * math.log2(abs(left)) > 63:
        raise AutoparError(f"{left}**{right} is beyond 64-bit shell arithmetic")
    if isinstance(op, ast.Mult) and isinstance(left, list) and isinstance(right, int) \
            and len(left) * right > MAX_LIST_LENGTH:
        raise AutoparError(f"a list of {len(left)} x {right} entries is longer than {MAX_LIST_LENGTH}")


def evaluate(expr: str, names=None):
    """Evaluate integer arithmetic (``+ - * / % **``, parentheses, names) or a Megatron list
    expression such as ``([0]*3+[1]*58)`` (lists, ``list*int``, ``list+list``).

    ``/`` truncates towards zero like bash. ``names(name)`` resolves bare identifiers.

    Raises:
        AutoparError: anything else (calls, attributes, strings, division by zero), a value of
            :data:`MAX_MAGNITUDE` or more, a list longer than :data:`MAX_LIST_LENGTH`.
    """
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            if abs(node.value) >= MAX_MAGNITUDE:
                raise AutoparError(f"{str(node.value)[:40]}... is beyond 64-bit shell arithmetic")
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            _check_operands(node.op, left, right)
            value = _BINARY[type(node.op)](left, right)
            if isinstance(value, int) and abs(value) >= MAX_MAGNITUDE:
                raise AutoparError(f"{ast.unparse(node)[:80]} is beyond 64-bit shell arithmetic")
            return value
        if isinstance(node, ast.Name) and names is not None:
            return names(node.id)
        raise AutoparError(f"unsupported expression {ast.unparse(node)!r}")

    try:
        return ev(ast.parse(expr.strip(), mode="eval"))
    except (SyntaxError, TypeError, ValueError, ZeroDivisionError, RecursionError, MemoryError) as err:
        raise AutoparError(f"cannot evaluate {expr[:80]!r}: {err}") from None
