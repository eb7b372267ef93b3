"""Safe arithmetic expressions for mechanism files.

Mechanism YAML files write numbers as expressions such as ``(1/3)*mass*length^2`` or
``x1+5*cos(deg2rad(45))``.  This module evaluates them with its own tree walker over Python's
`ast`; nothing is ever passed to `eval`/`exec`, and only the following is accepted:

* numbers (``2``, ``0.5``, ``1e-3``),
* names: the caller's variables and the constant ``pi``,
* binary ``+ - * /`` and power, written ``^`` (as in the reference implementation) or ``**``,
* unary ``+`` and ``-`` (``-2^2`` is ``-4``, as in mathematics; ``2^3^2`` is ``2^(3^2)``),
* parentheses,
* calls to ``sin cos tan sqrt atan2 deg2rad`` (radians; ``atan2(y, x)``).

All arithmetic is done in floating point; every intermediate result must be finite.  Any problem
raises `ExpressionError` (a `ValueError`) whose one-line message names the problem.
"""

from __future__ import annotations

import ast
import math
import numbers
import warnings
from typing import Dict, Mapping, Optional, Union

__all__ = ["ExpressionError", "evaluate", "FUNCTIONS", "CONSTANTS", "MAX_EXPRESSION_LENGTH"]


class ExpressionError(ValueError):
    """An expression could not be evaluated.  The message says why, on one line."""


def _deg2rad(x: float) -> float:
    return x * math.pi / 180.0


#: Functions callable from expressions: name -> (callable, number of arguments).
FUNCTIONS: Dict[str, tuple] = {
    "sin": (math.sin, 1),
    "cos": (math.cos, 1),
    "tan": (math.tan, 1),
    "sqrt": (math.sqrt, 1),
    "atan2": (math.atan2, 2),
    "deg2rad": (_deg2rad, 1),
}

#: Named constants; they take precedence over caller variables of the same name.
CONSTANTS: Dict[str, float] = {"pi": math.pi}

#: Longest accepted expression text, in characters.
MAX_EXPRESSION_LENGTH = 1000

_OPERATOR_SYMBOLS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "^",
    ast.FloorDiv: "//", ast.Mod: "%", ast.MatMult: "@", ast.BitXor: "^", ast.BitAnd: "&",
    ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>", ast.Invert: "~", ast.Not: "not",
    ast.UAdd: "+", ast.USub: "-",
}


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise ExpressionError(f"non-finite result ({value}) from {what}")
    return value


def _translate(text: str) -> str:
    """Turn the expression language into Python syntax: ``^`` becomes ``**``.

    The language has no strings and no bitwise operators, so every ``^`` is a power operator and a
    plain textual replacement is exact.  Python's ``**`` already has the wanted precedence: it binds
    tighter than unary minus on its left (``-2**2 == -4``) and is right-associative.
    """
    # Line breaks and tabs (e.g. from YAML block scalars) are plain white space here.
    return " ".join(text.split()).replace("^", "**")


def _parse(text: str) -> ast.expr:
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(f"expression too long ({len(text)} characters, at most {MAX_EXPRESSION_LENGTH})")
    if not text.strip():
        raise ExpressionError("empty expression")
    for ch in text:
        if ord(ch) > 127:
            hint = "; use ASCII '*'" if ch in "\u2217\u00d7\u22c5\u00b7" else ""
            raise ExpressionError(f"unsupported character {ch!r} (U+{ord(ch):04X}) in expression "
                                  f"'{_short(text)}'{hint}")
        if ch in "\n\r\t\f\v":
            continue
        if not (32 <= ord(ch) < 127):
            raise ExpressionError(f"unsupported control character U+{ord(ch):04X} in expression")
    try:
        # ast.parse only builds a syntax tree (compile with PyCF_ONLY_AST); nothing is executed.
        # Parser warnings (e.g. "invalid decimal literal" for `1if`) are treated as syntax errors.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tree = ast.parse(_translate(text), mode="eval")
    except Warning as exc:
        raise ExpressionError(f"bad syntax in expression '{_short(text)}': {_short(str(exc))}") from None
    except SyntaxError as exc:
        reason = exc.msg or "invalid syntax"
        raise ExpressionError(f"bad syntax in expression '{_short(text)}': {reason}") from None
    except (ValueError, RecursionError, MemoryError, OverflowError):
        raise ExpressionError(f"bad syntax in expression '{_short(text)}': too complex or malformed") from None
    return tree.body


class _Evaluator:
    def __init__(self, text: str, variables: Mapping[str, float]):
        self.text = text
        self.variables = variables

    def where(self) -> str:
        return f"in expression '{_short(self.text)}'"

    def visit(self, node: ast.AST) -> float:
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ExpressionError(f"unsupported literal {_short(repr(value), 30)} {self.where()}")
            try:
                return _finite(float(value), f"literal {_short(repr(value), 30)}")
            except OverflowError:
                raise ExpressionError(f"number too large {self.where()}") from None
        if isinstance(node, ast.Name):
            return self.name(node.id)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return -self.visit(node.operand)
            if isinstance(node.op, ast.UAdd):
                return +self.visit(node.operand)
            raise ExpressionError(f"unsupported operator '{_OPERATOR_SYMBOLS.get(type(node.op), '?')}' {self.where()}")
        if isinstance(node, ast.BinOp):
            return self.binop(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise ExpressionError(f"unsupported construct ({_describe(node)}) {self.where()}")

    def name(self, name: str) -> float:
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in FUNCTIONS:
            raise ExpressionError(f"'{name}' is a function; call it as {name}(...) {self.where()}")
        if name in self.variables:
            value = self.variables[name]
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ExpressionError(f"variable '{name}' is not a number")
            return _finite(float(value), f"variable '{name}'")
        raise ExpressionError(f"undefined name '{name}' {self.where()}")

    def binop(self, node: ast.BinOp) -> float:
        op = type(node.op)
        if op not in (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow):
            raise ExpressionError(f"unsupported operator '{_OPERATOR_SYMBOLS.get(op, '?')}' {self.where()}")
        a = self.visit(node.left)
        b = self.visit(node.right)
        try:
            if op is ast.Add:
                r = a + b
            elif op is ast.Sub:
                r = a - b
            elif op is ast.Mult:
                r = a * b
            elif op is ast.Div:
                if b == 0.0:
                    raise ExpressionError(f"division by zero {self.where()}")
                r = a / b
            else:
                if a == 0.0 and b < 0.0:
                    raise ExpressionError(f"division by zero (0 raised to a negative power) {self.where()}")
                r = math.pow(a, b)
        except ExpressionError:
            raise
        except OverflowError:
            raise ExpressionError(f"numeric overflow {self.where()}") from None
        except ValueError:
            raise ExpressionError(f"math domain error ({a:g} ^ {b:g}) {self.where()}") from None
        return _finite(r, f"'{_OPERATOR_SYMBOLS[op]}' {self.where()}")

    def call(self, node: ast.Call) -> float:
        if not isinstance(node.func, ast.Name):
            raise ExpressionError(f"unsupported call ({_describe(node.func)}) {self.where()}")
        fname = node.func.id
        if fname not in FUNCTIONS:
            allowed = ", ".join(sorted(FUNCTIONS))
            raise ExpressionError(f"unknown function '{fname}' {self.where()} (allowed: {allowed})")
        if node.keywords:
            raise ExpressionError(f"keyword arguments are not supported {self.where()}")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise ExpressionError(f"starred arguments are not supported {self.where()}")
        func, arity = FUNCTIONS[fname]
        if len(node.args) != arity:
            raise ExpressionError(f"{fname}() takes {arity} argument{'s' if arity > 1 else ''}, "
                                  f"got {len(node.args)} {self.where()}")
        args = [self.visit(a) for a in node.args]
        try:
            r = func(*args)
        except ValueError:
            shown = ", ".join(f"{a:g}" for a in args)
            raise ExpressionError(f"math domain error in {fname}({shown}) {self.where()}") from None
        except OverflowError:
            raise ExpressionError(f"numeric overflow in {fname}() {self.where()}") from None
        return _finite(r, f"{fname}() {self.where()}")


def _describe(node: ast.AST) -> str:
    names = {
        ast.Attribute: "attribute access", ast.Subscript: "subscript", ast.Lambda: "lambda",
        ast.ListComp: "comprehension", ast.SetComp: "comprehension", ast.DictComp: "comprehension",
        ast.GeneratorExp: "comprehension", ast.Compare: "comparison", ast.BoolOp: "boolean operator",
        ast.IfExp: "conditional expression", ast.List: "list", ast.Tuple: "tuple", ast.Dict: "dict",
        ast.Set: "set", ast.JoinedStr: "f-string", ast.NamedExpr: "assignment expression",
        ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.Starred: "starred expression",
        ast.Slice: "slice",
    }
    return names.get(type(node), type(node).__name__)


def evaluate(expression: Union[str, int, float], variables: Optional[Mapping[str, float]] = None) -> float:
    """Evaluate `expression` (text, or a plain int/float) with the given variables; return a finite float.

    Raises `ExpressionError` on any problem: bad syntax, undefined name, unsupported operator or
    construct, wrong function arity, division by zero, math domain error, overflow, non-finite result.
    """
    if variables is None:
        variables = {}
    if isinstance(expression, bool):
        raise ExpressionError(f"expected a number or an expression, got boolean {expression}")
    if isinstance(expression, numbers.Real) and not isinstance(expression, str):
        try:
            value = float(expression)
        except (OverflowError, ValueError, TypeError):
            raise ExpressionError(f"not a usable number: {_short(repr(expression), 30)}") from None
        return _finite(value, "number")
    if not isinstance(expression, str):
        raise ExpressionError(f"expected a number or an expression, got {type(expression).__name__}")
    node = _parse(expression)
    try:
        return _Evaluator(expression, variables).visit(node)
    except RecursionError:
        raise ExpressionError(f"expression too deeply nested: '{_short(expression)}'") from None

