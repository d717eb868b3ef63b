"""A small safe evaluator for the expressions in lessons (placeholders, checks, answers, op arguments).

Lessons are text that teachers write and learners may load from anywhere, so an expression is
never handed to Python's `eval`. It is parsed with `ast` and walked node by node against an
allowlist: constants, names from the context, attribute access (no names starting with `_`),
subscripts and slices, arithmetic, comparisons, boolean logic, `x if c else y`, list / tuple /
dict literals, comprehensions, and calls of the pure helper functions the context names. Anything
else (lambdas, imports, f-strings, walrus, calling a method, dunders) is refused with a message.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

MAX_POWER_EXPONENT = 256  # 2 ** 1_000_000_000 would hang a classroom laptop
MAX_SEQUENCE_LEN = 1_000_000  # "x" * 10**12 likewise


class UnsafeExpression(ValueError):
    """The expression uses something the lesson language does not allow (or is malformed)."""


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
}


def parse(source: str) -> ast.Expression:
    """Parse one expression and check that it only uses allowed syntax (no evaluation yet)."""
    text = source.strip()
    if not text:
        raise UnsafeExpression("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise UnsafeExpression(f"syntax error in {text!r}: {e.msg}") from None
    for node in ast.walk(tree):
        _check_node(node)
    return tree


def free_names(tree: ast.AST) -> set[str]:
    """Names an expression reads from its context (comprehension variables excluded)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.comprehension):
            bound |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in bound}


def _check_node(node: ast.AST) -> None:
    allowed = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Store, ast.Attribute,
               ast.Subscript, ast.Slice, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare,
               ast.IfExp, ast.List, ast.Tuple, ast.Dict, ast.Call, ast.keyword, ast.ListComp,
               ast.GeneratorExp, ast.comprehension, ast.And, ast.Or, *_BINOPS, *_UNARY, *_COMPARE)
    if not isinstance(node, allowed):
        what = {ast.Lambda: "lambda", ast.NamedExpr: "':=' assignment", ast.JoinedStr: "f-string",
                ast.Starred: "'*' unpacking", ast.SetComp: "set comprehension",
                ast.DictComp: "dict comprehension", ast.Await: "await", ast.Yield: "yield"}
        name = what.get(type(node), type(node).__name__)
        raise UnsafeExpression(f"{name} is not allowed in a lesson expression")
    if isinstance(node, ast.Name) and node.id.startswith("_"):
        raise UnsafeExpression(f"name {node.id!r} is not allowed (names starting with '_' are private)")
    if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
        raise UnsafeExpression(f"attribute {node.attr!r} is not allowed (private or dunder)")
    if isinstance(node, ast.Constant) and not isinstance(node.value, str | int | float | bool | type(None)):
        raise UnsafeExpression(f"constant {node.value!r} is not allowed")
    if isinstance(node, ast.Call):
        # Only a helper named directly may be called: `len(x)`, never `x.method()` or `f()()`.
        if not isinstance(node.func, ast.Name):
            raise UnsafeExpression("only the lesson helper functions can be called "
                                   "(like len(...), table(a)); calling methods is not allowed")
        if any(k.arg is None for k in node.keywords):
            raise UnsafeExpression("'**' unpacking is not allowed")
    if isinstance(node, ast.comprehension) and node.is_async:
        raise UnsafeExpression("async comprehensions are not allowed")


class Evaluator:
    """Evaluates parsed expressions against a context of names and a set of callable helpers."""

    def __init__(self, names: Mapping[str, Any], helpers: Mapping[str, Callable[..., Any]]) -> None:
        self.names = names
        self.helpers = helpers

    def eval(self, source: str | ast.Expression) -> Any:
        tree = parse(source) if isinstance(source, str) else source
        return self._eval(tree.body, {})

    # Each node kind is a few lines; the local scope holds comprehension variables.
    def _eval(self, node: ast.AST, local: dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self._name(node.id, local)
        if isinstance(node, ast.Attribute):
            value = self._eval(node.value, local)
            if isinstance(value, Mapping) and node.attr in value:  # dicts read like records
                return value[node.attr]
            try:
                return getattr(value, node.attr)
            except AttributeError:
                raise UnsafeExpression(f"{type(value).__name__} has no attribute {node.attr!r}") from None
        if isinstance(node, ast.Subscript):
            value = self._eval(node.value, local)
            key = self._eval(node.slice, local)
            try:
                return value[key]
            except (KeyError, IndexError, TypeError) as e:
                raise UnsafeExpression(f"cannot index {_short(value)} with {key!r}: {e}") from None
        if isinstance(node, ast.Slice):
            parts = [None if p is None else self._eval(p, local) for p in (node.lower, node.upper, node.step)]
            return slice(*parts)
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, local), self._eval(node.right, local)
            _guard_size(node.op, left, right)
            try:
                return _BINOPS[type(node.op)](left, right)
            except (TypeError, ZeroDivisionError) as e:
                what = f"{_short(left)} {type(node.op).__name__} {_short(right)}"
                raise UnsafeExpression(f"{what}: {e}") from None
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self._eval(node.operand, local))
        if isinstance(node, ast.BoolOp):
            result: Any = None
            for v in node.values:  # short-circuit, like Python
                result = self._eval(v, local)
                if isinstance(node.op, ast.And) and not result:
                    return result
                if isinstance(node.op, ast.Or) and result:
                    return result
            return result
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, local)
            for op, comp in zip(node.ops, node.comparators, strict=True):
                right = self._eval(comp, local)
                try:
                    ok = _COMPARE[type(op)](left, right)
                except TypeError as e:
                    what = f"cannot compare {_short(left)} and {_short(right)}"
                    raise UnsafeExpression(f"{what}: {e}") from None
                if not ok:
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self._eval(node.body if self._eval(node.test, local) else node.orelse, local)
        if isinstance(node, ast.List):
            return [self._eval(e, local) for e in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(self._eval(e, local) for e in node.elts)
        if isinstance(node, ast.Dict):
            return {self._eval(k, local): self._eval(v, local)
                    for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
        if isinstance(node, ast.ListComp | ast.GeneratorExp):
            return self._comprehension(node, local)
        if isinstance(node, ast.Call):
            return self._call(node, local)
        raise UnsafeExpression(f"{type(node).__name__} is not allowed")  # parse() already refused it

    def _name(self, name: str, local: dict[str, Any]) -> Any:
        if name in local:
            return local[name]
        if name in self.names:
            return self.names[name]
        if name in self.helpers:
            raise UnsafeExpression(f"{name} is a helper function: call it, like {name}(...)")
        raise UnsafeExpression(f"unknown name {name!r}")

    def _call(self, node: ast.Call, local: dict[str, Any]) -> Any:
        name = node.func.id  # type: ignore[attr-defined]  # parse() allows only Name
        fn = self.helpers.get(name)
        if fn is None:
            known = ", ".join(sorted(self.helpers))
            raise UnsafeExpression(f"{name}(...) is not a lesson helper; helpers: {known}")
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise UnsafeExpression("'*' unpacking is not allowed")
            args.append(self._eval(a, local))
        kwargs = {k.arg: self._eval(k.value, local) for k in node.keywords}
        try:
            return fn(*args, **kwargs)
        except UnsafeExpression:
            raise
        except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as e:
            raise UnsafeExpression(f"{name}(...) failed: {e}") from None

    def _comprehension(self, node: ast.ListComp | ast.GeneratorExp, local: dict[str, Any]) -> list[Any]:
        out: list[Any] = []

        def loop(i: int, scope: dict[str, Any]) -> None:
            if i == len(node.generators):
                out.append(self._eval(node.elt, scope))
                if len(out) > MAX_SEQUENCE_LEN:
                    raise UnsafeExpression("comprehension too long")
                return
            gen = node.generators[i]
            iterable = self._eval(gen.iter, scope)
            for item in _iterate(iterable):
                inner = dict(scope)
                _bind(gen.target, item, inner)
                if all(self._eval(cond, inner) for cond in gen.ifs):
                    loop(i + 1, inner)

        loop(0, dict(local))
        return out  # a generator expression is evaluated eagerly: sum(... for ...) works the same


def _iterate(value: Any) -> Iterable[Any]:
    if isinstance(value, Mapping):
        return list(value)
    try:
        return iter(value)
    except TypeError:
        raise UnsafeExpression(f"cannot loop over {_short(value)}") from None


def _bind(target: ast.AST, value: Any, scope: dict[str, Any]) -> None:
    if isinstance(target, ast.Name):
        scope[target.id] = value
    elif isinstance(target, ast.Tuple):
        items = list(value)
        if len(items) != len(target.elts):
            raise UnsafeExpression(f"cannot unpack {len(items)} values into {len(target.elts)} names")
        for t, v in zip(target.elts, items, strict=True):
            _bind(t, v, scope)
    else:
        raise UnsafeExpression("a comprehension loops over plain names only")


def _guard_size(op: ast.operator, left: Any, right: Any) -> None:
    if isinstance(op, ast.Pow) and isinstance(right, int | float) and abs(right) > MAX_POWER_EXPONENT:
        raise UnsafeExpression(f"exponent {right} is too large")
    if isinstance(op, ast.Mult):
        for seq, k in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(k, int) and len(seq) * k > MAX_SEQUENCE_LEN:
                raise UnsafeExpression("result would be too long")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
