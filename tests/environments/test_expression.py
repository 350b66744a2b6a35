"""The in-graph expression evaluator and integer parser against Python references (ast / re)."""
import ast
import re

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from environments.expression import evaluate, parse_integer
from tests.environments.helpers import jit

CAP = 40
MAX_DEPTH = 4
MAX_LITERALS = 6
INT_MAX = 2**31 - 1
WS = " \t\n\r\x0b\x0c"

_evaluate = jit(lambda b, n: evaluate(b, n, max_depth=MAX_DEPTH, max_literals=MAX_LITERALS))
_parse_integer = jit(parse_integer)


def _buf(text: bytes):
    out = np.zeros((CAP,), np.uint8)
    out[: len(text)] = np.frombuffer(text[:CAP], np.uint8)
    return out, np.int32(min(len(text), CAP))


class Invalid(Exception):
    pass


def _checked(x):
    if abs(x) > INT_MAX:
        raise Invalid("int32 overflow")
    return x


def _frac(node):
    """Unreduced int32 fraction of an ast node, per the documented arithmetic (Python ints)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value, 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        n, d = _frac(node.operand)
        return (-n if isinstance(node.op, ast.USub) else n), d
    if isinstance(node, ast.BinOp):
        an, ad = _frac(node.left)
        bn, bd = _frac(node.right)
        if isinstance(node.op, (ast.Add, ast.Sub)):
            sign = 1 if isinstance(node.op, ast.Add) else -1
            x, y = _checked(an * bd), _checked(sign * bn * ad)
            return _checked(x + y), _checked(ad * bd)
        if isinstance(node.op, ast.Mult):
            return _checked(an * bn), _checked(ad * bd)
        if isinstance(node.op, ast.Div):
            if bn == 0:
                raise Invalid("division by zero")
            n, d = _checked(an * bd), _checked(ad * bn)
            return (-n, -d) if d < 0 else (n, d)
    raise Invalid(f"not arithmetic: {ast.dump(node)}")


def reference(text: str):
    """(numerator, denominator) or None, following the rules in environments/expression.py."""
    if any(ch not in "0123456789+-*/()" + WS for ch in text):
        return None
    if any(len(run) > 9 for run in re.findall(r"\d+", text)):
        return None
    depth = max_depth = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        max_depth = max(max_depth, depth)
    if max_depth > MAX_DEPTH:
        return None
    try:
        tree = ast.parse(re.sub(f"[{WS}]", " ", text).strip(), mode="eval")
        return _frac(tree.body)
    except (SyntaxError, Invalid):
        return None


def reference_literals(text: str):
    return [int(r) if len(r) <= 9 else -1 for r in re.findall(r"\d+", text)]


def check(text: str):
    ev = jax.device_get(_evaluate(*_buf(text.encode())))
    want = reference(text)
    assert bool(ev.valid) == (want is not None), (text, want)
    if want is not None:
        n, d = want
        assert (int(ev.numerator), int(ev.denominator)) == (n, d), text
        assert ev.value == np.float32(n) / np.float32(d), text
        assert abs(float(ev.value) - eval(re.sub(f"[{WS}]", " ", text).strip())) <= 1e-6 * max(1.0, abs(n / d))
    lits = reference_literals(text)
    assert int(ev.num_literals) == len(lits), text
    k = min(len(lits), MAX_LITERALS)
    assert ev.literals[:k].tolist() == lits[:k], text
    assert (ev.literals[k:] == -2).all()


def test_worked_examples():
    for text in ["1+2*3", "(1+2)*3", "-3*-2", "8/(3-8/3)", "2*(3+4)*5-6/7", "- - 3", "00+1", " 7 ",
                 "", "()", "(3", "3)", "2 3", "07", "1/0", "1/(2-2)", "99999*99999", "12a", "3 - ",
                 "(((((1)))))", "((((1))))", "1234567890", "123456789", "0000000000", "0000000001",
                 "000000000", "1+0000000002", "6//2", "2**3", "(2)(3)", "+"]:
        check(text)
    ev = _evaluate(*_buf(b"8/(3-8/3)"))
    assert (int(ev.numerator), int(ev.denominator)) == (24, 1)  # exact, where float64 gives 23.99999999999999


_ws = st.text(alphabet=" \t", max_size=1)


def _expressions():
    literal = st.integers(0, 30).map(str)
    return st.recursive(
        literal,
        lambda sub: st.one_of(
            st.tuples(sub, _ws, st.sampled_from("+-*/"), _ws, sub).map("".join),
            st.tuples(st.sampled_from("-+"), sub).map("".join),
            sub.map(lambda e: f"({e})"),
        ),
        max_leaves=5,
    ).filter(lambda e: len(e) <= CAP)


@settings(max_examples=120, deadline=None)
@given(_expressions())
def test_well_formed_expressions_match_python(text):
    check(text)


@settings(max_examples=120, deadline=None)
@given(st.text(alphabet="0123456789+-*/() \tx", max_size=CAP))
def test_garbage_matches_reference(text):
    check(text)


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=CAP), st.integers(-5, CAP + 5))
def test_random_bytes_never_crash(data, length):
    buf, _ = _buf(data)
    ev = jax.device_get(_evaluate(buf, np.int32(length)))
    assert np.isfinite(ev.value) and ev.denominator >= 1
    if not ev.valid:
        assert ev.value == 0.0


def reference_integer(text: str):
    m = re.fullmatch(f"[{WS}]*([+-]?[0-9]{{1,9}})[{WS}]*", text)
    return int(m.group(1)) if m else None


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet=" \t+-0123456789x", max_size=14))
def test_parse_integer_matches_regex_reference(text):
    value, valid = jax.device_get(_parse_integer(*_buf(text.encode())))
    want = reference_integer(text)
    assert bool(valid) == (want is not None), text
    assert int(value) == (want if want is not None else 0), text
