"""A small, safe evaluator for ``$`` references in configs: ``"$hidden * 2"``, ``"$in_shape[1]"``.

Configs never execute code, so this is not ``eval``: the expression is parsed with :mod:`ast`
and only a whitelist of node kinds is interpreted (numbers, strings, names, ``+ - * / // % **``,
unary minus, subscripts, tuples/lists, comparisons, ``a if c else b`` and the functions
``min max abs int float round``). Anything else — attribute access, lambdas, comprehensions,
calls to other names — is rejected with :class:`ExprError` before anything runs.
"""

from __future__ import annotations

import ast
import difflib
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "float": float,
    "round": round,
}
_MAX_POWER = 64  # "$n ** 10**9" must not hang the config checker
_DOLLAR_NAME = re.compile(r"\$(?=[A-Za-z_])")


class ExprError(ConfigError):
    """An expression is malformed, uses a forbidden construct or names an unknown variable
    (a ConfigError: configs are where expressions live)."""


class _LookupFailed(Exception):
    """Internal: ``lookup`` raised something other than KeyError; re-raised unchanged."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def is_ref(value: Any) -> bool:
    """Whether a config value is a reference expression (a string starting with ``$``)."""
    return isinstance(value, str) and value.startswith("$")


def source(ref: str) -> str:
    """The Python-syntax text of a ``$`` reference: ``"$a * $b"`` -> ``"a * b"``."""
    return _DOLLAR_NAME.sub("", ref).strip()


def evaluate_ref(ref: str, lookup: Callable[[str], Any], known: Callable[[], list[str]]) -> Any:
    """Evaluate the reference ``ref`` (``"$hidden * 2"``).

    Arguments:
        ref: the config string, starting with ``$``.
        lookup: resolves a name to its value; raises ``KeyError`` for an unknown name.
        known: the names that exist, for the "did you mean" hint of an unknown one.
    Raises:
        ExprError: with a message that quotes the expression.
    """
    text = source(ref)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ExprError(f"cannot parse {ref!r}: {e.msg}") from None
    try:
        return _Evaluator(lookup, known).visit(tree.body)
    except _LookupFailed as e:
        raise e.error from None
    except ExprError:
        raise
    except (ArithmeticError, TypeError, ValueError, IndexError, KeyError) as e:
        raise ExprError(f"cannot evaluate {ref!r}: {type(e).__name__}: {e}") from None


class _Evaluator:
    def __init__(self, lookup: Callable[[str], Any], known: Callable[[], list[str]]) -> None:
        self.lookup = lookup
        self.known = known

    def visit(self, node: ast.AST) -> Any:
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:
            raise ExprError(f"{type(node).__name__} is not allowed in a config expression")
        return method(node)

    def visit_Constant(self, node: ast.Constant) -> Any:
        if not isinstance(node.value, int | float | str | bool) and node.value is not None:
            raise ExprError(f"constant {node.value!r} is not allowed in a config expression")
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        try:
            return self.lookup(node.id)
        except KeyError:
            close = difflib.get_close_matches(node.id, self.known(), n=1)
            hint = f" (did you mean ${close[0]}?)" if close else ""
            raise ExprError(f"unknown variable ${node.id}{hint}") from None
        except Exception as e:  # e.g. a cyclic reference found while resolving the variable
            raise _LookupFailed(e) from e

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise ExprError(f"operator {type(node.op).__name__} is not allowed")
        left, right = self.visit(node.left), self.visit(node.right)
        too_big = isinstance(right, int | float) and abs(right) > _MAX_POWER
        if isinstance(node.op, ast.Pow) and too_big:
            raise ExprError(f"exponent {right} is too large (at most {_MAX_POWER})")
        if isinstance(node.op, ast.Mult) and isinstance(left, str | list | tuple):
            raise ExprError("repeating strings or lists with * is not allowed")
        return op(left, right)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        op = _UNARY.get(type(node.op))
        if op is None:
            raise ExprError(f"operator {type(node.op).__name__} is not allowed")
        return op(self.visit(node.operand))

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        for op_node, right_node in zip(node.ops, node.comparators, strict=True):
            op = _COMPARE.get(type(op_node))
            if op is None:
                raise ExprError(f"comparison {type(op_node).__name__} is not allowed")
            right = self.visit(right_node)
            if not op(left, right):
                return False
            left = right
        return True

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        if isinstance(node.slice, ast.Slice):
            raise ExprError("slices are not allowed; index one element, e.g. $in_shape[-1]")
        return self.visit(node.value)[self.visit(node.slice)]

    def visit_Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.visit(e) for e in node.elts)

    def visit_List(self, node: ast.List) -> Any:
        return [self.visit(e) for e in node.elts]

    def visit_Call(self, node: ast.Call) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
            allowed = ", ".join(sorted(FUNCTIONS))
            raise ExprError(f"only calls to {allowed} with positional arguments are allowed")
        return FUNCTIONS[node.func.id](*(self.visit(a) for a in node.args))


def _lookup_in(env: Mapping[str, Any]) -> Callable[[str], Any]:
    return lambda name: env[name]


def evaluate_in(ref: str, env: Mapping[str, Any]) -> Any:
    """Evaluate ``ref`` against a plain mapping of names (used by tests and simple callers)."""
    return evaluate_ref(ref, _lookup_in(env), lambda: list(env))


__all__ = ["FUNCTIONS", "ExprError", "evaluate_ref", "evaluate_in", "is_ref", "source"]
