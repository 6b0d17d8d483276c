"""A small, safe, bounded evaluator for ``$`` references in configs: ``"$hidden * 2"``,
``"$in_shape[1]"``.

Configs never execute code, so this is not ``eval``: the expression is parsed with :mod:`ast`
and only a whitelist of node kinds is interpreted (numbers, strings, names, ``+ - * / // % **``,
unary minus, subscripts, tuples/lists, comparisons, ``a if c else b`` and the functions
``min max abs int float round``). Anything else — attribute access, lambdas, comprehensions,
calls to other names — is rejected with :class:`ExprError` before anything runs.

A config is untrusted input, so evaluation is also bounded: whatever an expression says, it
finishes at once and small (``"$n ** 64"`` chained through variables, ``round(10**64, -10**9)``
or ``$n * [0]`` would otherwise hang or fill memory). Each limit is checked before the work
it guards, and each refusal is an :class:`ExprError` naming the limit and the value:

* ``MAX_TEXT``: an expression has at most 1,000 characters. The syntax tree then has at most
  that many nodes, each evaluated at most once (there are no loops, comprehensions or user
  functions, and a variable is evaluated once and cached), so the text bounds the steps.
* ``MAX_DEPTH``: at most 64 levels of nesting, counted together over expression nodes, the
  lists and mappings being resolved and the variables referenced (``$a`` with
  ``a = "$b * 2"`` nests ``b``'s expression inside), so Python's stack is never exhausted.
* ``MAX_INT_BITS``: an integer result has at most 63 bits, ``|x| < 2**63`` (what int64
  holds, and more than any size in a model); ``a ** b`` is refused from the sizes of ``a``
  and ``b`` before it is computed.
* ``MAX_SIZE``: a string, list or tuple result holds at most 10,000 items (its characters, or
  its elements and, nested, theirs); ``a + b`` is refused from its operands' sizes before it
  is built. Repetition (``3 * [0]``, ``"ab" * 2``) and ``%`` formatting of strings (whose
  widths allocate) are not allowed at all.
* ``MAX_NDIGITS``: ``round(x, n)`` takes ``|n| <= 64`` (``round(x, -10**9)`` builds
  ``10**(10**9)`` inside Python).

Floats need no bound: every float operation takes constant time and space.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
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
MAX_TEXT = 1_000
MAX_DEPTH = 64
MAX_INT_BITS = 63
MAX_SIZE = 10_000
MAX_NDIGITS = 64
_INT_LIMIT = f"integers of at most {MAX_INT_BITS} bits (|x| < 2**{MAX_INT_BITS})"
_SIZE_LIMIT = (f"at most {MAX_SIZE} items (characters of a string, elements of a list or "
               "tuple with their nested ones)")
_SEQUENCE = (str, list, tuple)
_DOLLAR_NAME = re.compile(r"\$(?=[A-Za-z_])")
_DEPTH: ContextVar[int] = ContextVar("funcgraph_factory_expr_depth", default=0)


class ExprError(ConfigError):
    """An expression is malformed, uses a forbidden construct, names an unknown variable or
    passes a limit (a ConfigError: configs are where expressions live)."""


class _Limit(ExprError):
    """Internal: a limit refused an expression; :func:`evaluate_ref` adds the expression."""


class _LookupFailed(Exception):
    """Internal: ``lookup`` raised something other than KeyError; re-raised unchanged."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def is_ref(value: Any) -> bool:
    """Whether a config value is a reference expression (a string starting with ``$``)."""
    return isinstance(value, str) and value.startswith("$")


def source(ref: str) -> str:
    """The Python-syntax text of a ``$`` reference: ``"$a * $b"`` -> ``"a * b"``; the leading
    ``$`` goes whatever follows it (``"$(a + 1) * 2"``, ``"$[a, a]"``)."""
    return _DOLLAR_NAME.sub("", ref.removeprefix("$")).strip()


def _quote(ref: str) -> str:
    """``ref`` for a message: quoted, and cut to about 80 characters."""
    return repr(ref) if len(ref) <= 80 else repr(ref[:77]) + "..."


@contextlib.contextmanager
def deeper() -> Iterator[None]:
    """One more level of nesting (an expression node, a list or mapping being resolved, a
    variable reference) for the whole evaluation in progress, nested ones included;
    ExprError past ``MAX_DEPTH`` levels."""
    depth = _DEPTH.get() + 1
    if depth > MAX_DEPTH:
        raise _Limit(f"nests deeper than {MAX_DEPTH} levels (expression nodes, lists and "
                     "mappings, and the variables referenced, counted together)")
    token = _DEPTH.set(depth)
    try:
        yield
    finally:
        _DEPTH.reset(token)


def _size(value: Any) -> int:
    """The items of a string (characters), list or tuple (elements, plus the items of those
    that are strings, lists or tuples); 0 for anything else. Counting stops once past
    ``MAX_SIZE``, so it is cheap even for a list that holds itself many times over."""
    total, todo = 0, [value]
    while todo and total <= MAX_SIZE:
        v = todo.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, list | tuple):
            total += len(v)
            todo.extend(e for e in v if isinstance(e, _SEQUENCE))
    return total


def _short(value: Any) -> str:
    """A value for a message, at most about 60 characters (an int by its bit length if long)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def evaluate_ref(ref: str, lookup: Callable[[str], Any], known: Callable[[], list[str]]) -> Any:
    """Evaluate the reference ``ref`` (``"$hidden * 2"``) within the limits of the module
    docstring.

    Arguments:
        ref: the config string, starting with ``$``.
        lookup: resolves a name to its value; raises ``KeyError`` for an unknown name.
        known: the names that exist, for the "did you mean" hint of an unknown one.
    Raises:
        ExprError: with a message that quotes the expression.
    """
    text = source(ref)
    if len(text) > MAX_TEXT:
        raise ExprError(f"{_quote(ref)}: an expression of {len(text)} characters; config "
                        f"expressions have at most {MAX_TEXT}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ExprError(f"cannot parse {ref!r}: {e.msg}") from None
    try:
        return _Evaluator(lookup, known).visit(tree.body)
    except _LookupFailed as e:
        raise e.error from None
    except _Limit as e:
        raise ExprError(f"{_quote(ref)} {e}") from None
    except ExprError:
        raise
    except (ArithmeticError, TypeError, ValueError, IndexError, KeyError) as e:
        raise ExprError(f"cannot evaluate {ref!r}: {type(e).__name__}: {e}") from None


def _bounded(value: Any) -> Any:
    """``value`` if within the integer and size limits, else :class:`_Limit`."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _Limit(f"gives {_short(value)}; config expressions allow {_INT_LIMIT}")
    if isinstance(value, complex):
        raise _Limit(f"gives the complex number {value!r}; config expressions compute reals")
    if isinstance(value, _SEQUENCE) and _size(value) > MAX_SIZE:
        raise _Limit(f"gives a {type(value).__name__} of more than {MAX_SIZE} items; config "
                     f"expressions allow {_SIZE_LIMIT}")
    return value


def _check_binop(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse, before computing it, an operation whose result would pass a limit."""
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int):
        # |left| >= 2**(bits - 1), so |left ** right| has at least (bits - 1) * right + 1 bits
        at_least = (abs(left).bit_length() - 1) * right + 1
        if right > 0 and at_least > MAX_INT_BITS:
            raise _Limit(f"computes {_short(left)} ** {_short(right)}, an integer of at least "
                         f"{at_least} bits; config expressions allow {_INT_LIMIT}")
    if isinstance(op, ast.Mult) and (isinstance(left, _SEQUENCE) or isinstance(right, _SEQUENCE)):
        raise _Limit(f"repeats with * ({_short(left)} * {_short(right)}); config expressions "
                     "do not repeat strings, lists or tuples: write the value out")
    if isinstance(op, ast.Mod) and isinstance(left, str):
        raise _Limit(f"formats the string {_short(left)} with %; config expressions do not "
                     "format strings: join them with +")
    if isinstance(op, ast.Add) and (isinstance(left, _SEQUENCE) or isinstance(right, _SEQUENCE)):
        total = _size(left) + _size(right)
        if total > MAX_SIZE:
            raise _Limit(f"concatenates {_short(left)} + {_short(right)}, more than {MAX_SIZE} "
                         f"items; config expressions allow {_SIZE_LIMIT}")


class _Evaluator:
    def __init__(self, lookup: Callable[[str], Any], known: Callable[[], list[str]]) -> None:
        self.lookup = lookup
        self.known = known

    def visit(self, node: ast.AST) -> Any:
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:
            raise ExprError(f"{type(node).__name__} is not allowed in a config expression")
        with deeper():
            return method(node)

    def visit_Constant(self, node: ast.Constant) -> Any:
        if not isinstance(node.value, int | float | str | bool) and node.value is not None:
            raise ExprError(f"constant {node.value!r} is not allowed in a config expression")
        return _bounded(node.value)

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
        _check_binop(node.op, left, right)
        return _bounded(op(left, right))

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        op = _UNARY.get(type(node.op))
        if op is None:
            raise ExprError(f"operator {type(node.op).__name__} is not allowed")
        return _bounded(op(self.visit(node.operand)))

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
        return _bounded(tuple(self.visit(e) for e in node.elts))

    def visit_List(self, node: ast.List) -> Any:
        return _bounded([self.visit(e) for e in node.elts])

    def visit_Call(self, node: ast.Call) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
            allowed = ", ".join(sorted(FUNCTIONS))
            raise ExprError(f"only calls to {allowed} with positional arguments are allowed")
        name = node.func.id
        args = [self.visit(a) for a in node.args]
        if name == "round" and len(args) == 2 and isinstance(args[1], int) and (
                abs(args[1]) > MAX_NDIGITS):
            raise _Limit(f"calls round with ndigits {_short(args[1])}; config expressions allow "
                         f"-{MAX_NDIGITS} <= ndigits <= {MAX_NDIGITS}")
        return _bounded(FUNCTIONS[name](*args))


def _lookup_in(env: Mapping[str, Any]) -> Callable[[str], Any]:
    return lambda name: env[name]


def evaluate_in(ref: str, env: Mapping[str, Any]) -> Any:
    """Evaluate ``ref`` against a plain mapping of names (used by tests and simple callers)."""
    return evaluate_ref(ref, _lookup_in(env), lambda: list(env))


__all__ = [
    "FUNCTIONS",
    "MAX_DEPTH",
    "MAX_INT_BITS",
    "MAX_NDIGITS",
    "MAX_SIZE",
    "MAX_TEXT",
    "ExprError",
    "deeper",
    "evaluate_in",
    "evaluate_ref",
    "is_ref",
    "source",
]
