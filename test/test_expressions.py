"""Tests of the safe expression evaluator used by mechanism files."""

import ast
import builtins
import math

import pytest

from mbfg_ros.model.expressions import ExpressionError, evaluate


@pytest.mark.parametrize("text, expected", [
    ("1", 1.0),
    ("2.5", 2.5),
    ("1e-3", 1e-3),
    ("1 + 2 * 3", 7.0),
    ("(1 + 2) * 3", 9.0),
    ("7 - 2 - 1", 4.0),
    ("8 / 2 / 2", 2.0),
    ("1/3", 1.0 / 3.0),
    ("2^3", 8.0),
    ("2**3", 8.0),
    ("2^3^2", 512.0),          # right-associative, as in mathematics
    ("-2^2", -4.0),            # unary minus binds looser than power
    ("(-2)^2", 4.0),
    ("2^-1", 0.5),
    ("-3", -3.0),
    ("+3", 3.0),
    ("--3", 3.0),
    ("1 - -1", 2.0),
    ("2*-3", -6.0),
    ("3*2^2", 12.0),
    ("(1/3)*2*3^2", 6.0),
    ("pi", math.pi),
    ("sin(pi/2)", 1.0),
    ("cos(0)", 1.0),
    ("tan(pi/4)", 1.0),
    ("sqrt(16)", 4.0),
    ("atan2(1, -1)", 3 * math.pi / 4),
    ("deg2rad(180)", math.pi),
    ("2.0*cos(deg2rad(45.0))", math.sqrt(2.0)),
    ("  1 +\n 2 ", 3.0),
])
def test_values(text, expected):
    assert evaluate(text) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_plain_numbers_pass_through():
    assert evaluate(3) == 3.0
    assert isinstance(evaluate(3), float)
    assert evaluate(-0.25) == -0.25


def test_variables():
    v = {"L": 2.0, "x1": 1.5, "mass": 3.0, "length": 2.0}
    assert evaluate("L*2", v) == 4.0
    assert evaluate("x1 + 5*cos(45*pi/180)", v) == pytest.approx(1.5 + 5 * math.sqrt(0.5))
    assert evaluate("(1/3)*mass*length^2", v) == pytest.approx(4.0)


def test_pi_is_a_constant_not_overridable():
    assert evaluate("pi", {"pi": 3.0}) == math.pi


@pytest.mark.parametrize("text, fragment", [
    ("xx + 1", "undefined name 'xx'"),
    ("1 +", "bad syntax"),
    ("(1", "bad syntax"),
    ("", "empty expression"),
    ("   ", "empty expression"),
    ("1 % 2", "unsupported operator '%'"),
    ("7 // 2", "unsupported operator '//'"),
    ("1 & 2", "unsupported operator '&'"),
    ("1 << 2", "unsupported operator '<<'"),
    ("~1", "unsupported operator '~'"),
    ("not 1", "unsupported operator 'not'"),
    ("1 < 2", "comparison"),
    ("1 if 1 else 2", "conditional"),
    ("1 and 2", "boolean operator"),
    ("1/0", "division by zero"),
    ("1/(2-2)", "division by zero"),
    ("0^-1", "division by zero"),
    ("sqrt(-1)", "math domain error"),
    ("(-8)^(1/3)", "math domain error"),
    ("9^9^9", "overflow"),
    ("10.0^400", "overflow"),
    ("1e308*10", "non-finite"),
    ("1e400", "non-finite"),
    ("sin", "is a function"),
    ("sin(1, 2)", "takes 1 argument"),
    ("atan2(1)", "takes 2 arguments"),
    ("sin(x=1)", "keyword arguments"),
    ("foo(1)", "unknown function 'foo'"),
    ("abs(-1)", "unknown function 'abs'"),
    ("'a'", "unsupported literal"),
    ("None", "unsupported literal"),
    ("True", "unsupported literal"),
    ("1j", "unsupported literal"),
    ("1 \u2217 2", "U+2217"),
    ("(1, 2)", "tuple"),
    ("[1]", "list"),
    ("1if 1 else 2", "bad syntax"),
])
def test_errors(text, fragment):
    with pytest.raises(ExpressionError) as info:
        evaluate(text, {"x1": 1.0})
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_error_is_a_value_error():
    assert issubclass(ExpressionError, ValueError)


@pytest.mark.parametrize("text, fragment", [
    ("__import__('os')", "unknown function '__import__'"),
    ("__import__('os').system('false')", "unsupported call"),
    ("().__class__", "attribute access"),
    ("sin.__globals__", "attribute access"),
    ("math.pi", "attribute access"),
    ("(lambda: 1)()", "unsupported call"),
    ("lambda: 1", "lambda"),
    ("[x for x in (1, 2)]", "comprehension"),
    ("(x for x in (1, 2))", "comprehension"),
    ("{1: 2}", "dict"),
    ("f'{1}'", "f-string"),
    ("(y := 2)", "assignment expression"),
    ("x1[0]", "subscript"),
    ("open('/etc/passwd')", "unknown function 'open'"),
    ("eval('1')", "unknown function 'eval'"),
    ("import os", "bad syntax"),
    ("1; 2", "bad syntax"),
    ("x = 1", "bad syntax"),
])
def test_dangerous_input_is_rejected(text, fragment):
    with pytest.raises(ExpressionError) as info:
        evaluate(text, {"x1": 1.0})
    assert fragment in str(info.value)


def test_rejects_non_expression_types():
    for bad in (None, [1], {"a": 1}, True, False, object(), float("nan"), float("inf")):
        with pytest.raises(ExpressionError):
            evaluate(bad)


def test_non_numeric_variable_rejected():
    with pytest.raises(ExpressionError, match="not a number"):
        evaluate("a + 1", {"a": "1"})


def test_too_long_and_too_deep():
    with pytest.raises(ExpressionError, match="too long"):
        evaluate("1+" * 600 + "1")
    with pytest.raises(ExpressionError):
        evaluate("(" * 300 + "1" + ")" * 300)
    assert evaluate("+".join(["1"] * 400)) == 400.0
    assert evaluate("-" * 200 + "1") == 1.0


def test_never_executes_code(monkeypatch):
    """eval/exec are never called, and compile is only used to build an AST (what ast.parse does)."""
    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec must never be called")

    real_compile = builtins.compile

    def checked_compile(source, filename, mode, flags=0, *args, **kwargs):
        assert flags & ast.PyCF_ONLY_AST, "compile() may only be used to build a syntax tree"
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    monkeypatch.setattr(builtins, "compile", checked_compile)
    assert evaluate("(1/3)*mass*length^2", {"mass": 3.0, "length": 1.0}) == pytest.approx(1.0)
    with pytest.raises(ExpressionError):
        evaluate("__import__('os').system('echo pwned')")
