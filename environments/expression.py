"""In-graph evaluation of arithmetic expressions and integers given as bytes (jittable, vmappable).

`evaluate(buf, length)` reads `buf[:length]` (u8) as an expression over integer literals, `+ - * /`,
parentheses, unary `+`/`-` and whitespace, with Python's grammar and precedence, in ONE `lax.scan`
over the bytes. Instead of a shunting-yard with an operator stack, each parenthesis level keeps the
running sum of finished terms, the current term, the sign of that term, the pending multiplicative
operator and the pending unary sign; `(` pushes that state on a fixed-size stack and `)` pops it and
feeds the sub-expression's value into the enclosing level as a factor. Every byte is O(1).

Arithmetic is EXACT: values are unreduced fractions numerator/denominator in int32, combined in
Python's evaluation order (left-associative) with

    a/b + c/d = (a*d + c*b) / (b*d)      a/b * c/d = (a*c) / (b*d)      (a/b) / (c/d) = (a*d) / (b*c)

(denominator kept positive). So Countdown checks "equals the target" exactly instead of through
float rounding; RAGEN's Python check `abs(eval - target) < 1e-5` agrees except on float64 rounding
artifacts. An expression is INVALID when Python would reject it (syntax error, empty, unbalanced
parentheses, any byte outside digits/operators/parentheses/whitespace, a literal with a leading zero
such as `07`, division by zero) and also when it leaves our fixed capacities: a literal with more
than 9 digits, parenthesis nesting deeper than `max_depth`, or any product or sum in the formulas
above leaving int32 (|x| > 2^31 - 1; this rejects e.g. `99999*99999` which Python would evaluate).
Whitespace is space, tab, CR, LF, VT, FF (Python rejects a bare newline; we treat it as a space).

The literals of the expression are collected independently of its validity, as RAGEN does with
`re.findall(r"\\d+", expr)`: every maximal run of digits, in order of appearance (runs of more than 9
digits are recorded as -1, which never equals a Countdown number).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

INT_MAX = np.int32(2**31 - 1)
MAX_LITERAL_DIGITS = 9
_WHITESPACE = tuple(ord(c) for c in " \t\n\r\x0b\x0c")
# pending multiplicative operator of a level
_NONE, _MUL, _DIV = 0, 1, 2


@struct.dataclass
class Evaluation:
    """Result of `evaluate`.

    value: f32[] numerator / denominator (0.0 when invalid).
    numerator, denominator: i32[] the exact (unreduced) fraction; denominator > 0 when valid.
    valid: bool[] see the module docstring.
    literals: i32[L] the digit runs in order of appearance (-1 for more than 9 digits), padded with -2.
    num_literals: i32[] how many digit runs there are (may exceed L; then only L are stored).
    """

    value: jnp.ndarray
    numerator: jnp.ndarray
    denominator: jnp.ndarray
    valid: jnp.ndarray
    literals: jnp.ndarray
    num_literals: jnp.ndarray


def _mul(a, b):
    """(a*b, ok): int32 product and whether it is exact with |a*b| <= 2^31 - 1."""
    p = a * b
    exact = (a == 0) | (jax.lax.div(p, jnp.where(a == 0, 1, a)) == b)
    return p, exact & (p != -INT_MAX - 1)


def _add(a, b):
    s = a + b
    overflow = ((a ^ s) & (b ^ s)) < 0
    return s, ~overflow & (s != -INT_MAX - 1)


def _frac_add(an, ad, bn, bd):
    """a + b as an unreduced fraction, with an overflow-free flag."""
    x, ok1 = _mul(an, bd)
    y, ok2 = _mul(bn, ad)
    n, ok3 = _add(x, y)
    d, ok4 = _mul(ad, bd)
    return n, d, ok1 & ok2 & ok3 & ok4


def _feed_factor(level, vn, vd):
    """Combine the factor vn/vd (after the level's pending unary sign) into the level's term.

    level: dict of i32[] scalars (tot_n, tot_d, term_n, term_d, sign, mulop, neg).
    Returns (new level, ok) where ok is False on division by zero or overflow.
    """
    vn = vn * level["neg"]
    op = level["mulop"]
    mul_n, ok_a = _mul(level["term_n"], vn)
    mul_d, ok_b = _mul(level["term_d"], vd)
    div_n, ok_c = _mul(level["term_n"], vd)
    div_d, ok_d = _mul(level["term_d"], vn)
    flip = jnp.where(div_d < 0, -1, 1)
    n = jnp.select([op == _MUL, op == _DIV], [mul_n, div_n * flip], vn)
    d = jnp.select([op == _MUL, op == _DIV], [mul_d, div_d * flip], vd)
    ok = jnp.select([op == _MUL, op == _DIV], [ok_a & ok_b, ok_c & ok_d & (vn != 0)], True)
    return dict(level, term_n=n, term_d=d, neg=jnp.int32(1)), ok


def _close_sum(level):
    """The level's value tot + sign * term as (n, d, ok)."""
    return _frac_add(level["tot_n"], level["tot_d"], level["sign"] * level["term_n"], level["term_d"])


def _fresh_level():
    one, zero = jnp.int32(1), jnp.int32(0)
    return dict(tot_n=zero, tot_d=one, term_n=zero, term_d=one, sign=one, mulop=zero, neg=one)


_LEVEL_KEYS = tuple(_fresh_level())


def evaluate(buf: jnp.ndarray, length: jnp.ndarray, max_depth: int = 8, max_literals: int = 8) -> Evaluation:
    """Evaluate the expression in `buf[:length]` (see the module docstring).

    Args:
      buf: u8[C] bytes (anything past `length` is ignored); length: i32[] (clipped to [0, C]).
      max_depth: static maximum parenthesis nesting; max_literals: static L of `Evaluation.literals`.
    """
    cap = buf.shape[0]
    length = jnp.clip(jnp.asarray(length, jnp.int32), 0, cap)
    # bytes past `length` read as spaces (no-ops); the extra final space ends a trailing literal
    padded = jnp.concatenate([buf.astype(jnp.int32), jnp.zeros((1,), jnp.int32)])
    chars = jnp.where(jnp.arange(cap + 1) < length, padded, ord(" "))
    stack = {k: jnp.zeros((max_depth,), jnp.int32) for k in _LEVEL_KEYS}
    carry = dict(
        level=_fresh_level(),
        stack=stack,
        depth=jnp.int32(0),
        expect=jnp.bool_(True),  # an operand must come next
        ok=jnp.bool_(True),
        in_num=jnp.bool_(False),
        lit=jnp.int32(0),
        lit_zero=jnp.bool_(False),  # the literal began with '0'
        lit_digits=jnp.int32(0),  # digits of the current run so far (leading zeros count)
        lit_big=jnp.bool_(False),
        lits=jnp.full((max_literals,), -2, jnp.int32),
        nlits=jnp.int32(0),
    )

    def step(c, ch):
        digit = (ch >= ord("0")) & (ch <= ord("9"))
        d = ch - ord("0")

        # -- literal bookkeeping (independent of validity, like re.findall(r"\d+")) --
        start_num = digit & ~c["in_num"]
        big = c["lit_big"] | (digit & c["in_num"] & (c["lit_digits"] >= MAX_LITERAL_DIGITS))
        lit_digits = jnp.where(start_num, 1, c["lit_digits"] + digit.astype(jnp.int32))
        lit = jnp.where(start_num, d, jnp.where(big, c["lit"], c["lit"] * 10 + d))
        lit_zero = jnp.where(start_num, d == 0, c["lit_zero"])
        bad_zero = digit & c["in_num"] & c["lit_zero"] & (d != 0)  # Python rejects "07"
        end_num = c["in_num"] & ~digit
        recorded = jnp.where(c["lit_big"], -1, c["lit"])
        lits = jnp.where(
            end_num & (jnp.arange(max_literals) == c["nlits"]), recorded, c["lits"]
        )
        nlits = c["nlits"] + end_num.astype(jnp.int32)

        ok = c["ok"] & ~(start_num & ~c["expect"]) & ~bad_zero
        expect = jnp.where(start_num, False, c["expect"])

        # -- a finished literal is a factor of the current level --
        level = c["level"]
        fed, fed_ok = _feed_factor(level, c["lit"], jnp.int32(1))
        ok &= ~end_num | (fed_ok & ~c["lit_big"])
        level = jax.tree.map(lambda a, b: jnp.where(end_num, a, b), fed, level)

        # -- the operator / parenthesis / end at this position (not a digit) --
        is_ws = jnp.zeros((), bool)
        for w in _WHITESPACE:
            is_ws |= ch == w
        plus, minus, star, slash = (ch == ord(op) for op in "+-*/")
        lpar, rpar = ch == ord("("), ch == ord(")")
        other = ~digit & ~is_ws & ~plus & ~minus & ~star & ~slash & ~lpar & ~rpar
        ok &= ~other

        unary = (plus | minus) & expect
        binary_add = (plus | minus) & ~expect
        ok &= ~((star | slash) & expect) & ~(lpar & ~expect) & ~(rpar & expect)

        # binary + / -: close the current term into the sum
        sn, sd, s_ok = _close_sum(level)
        ok &= ~binary_add | s_ok
        level = jax.tree.map(
            lambda a, b: jnp.where(binary_add, a, b),
            dict(level, tot_n=sn, tot_d=sd, sign=jnp.where(minus, -1, 1), mulop=jnp.int32(_NONE)),
            level,
        )
        level = dict(level, neg=jnp.where(unary & minus, -level["neg"], level["neg"]))
        level = dict(level, mulop=jnp.select([star & ~expect, slash & ~expect], [_MUL, _DIV], level["mulop"]))

        # '(' pushes the current level, ')' pops and feeds the sub-expression as a factor
        depth = c["depth"]
        ok &= ~(lpar & (depth >= max_depth)) & ~(rpar & (depth == 0))
        push = lpar & ok
        slot = jnp.clip(depth, 0, max_depth - 1)
        pop_slot = jnp.clip(depth - 1, 0, max_depth - 1)
        stack = {
            k: jnp.where(push, c["stack"][k].at[slot].set(level[k]), c["stack"][k]) for k in _LEVEL_KEYS
        }
        parent = {k: c["stack"][k][pop_slot] for k in _LEVEL_KEYS}
        parent_fed, parent_ok = _feed_factor(parent, sn, sd)
        pop = rpar & ok
        ok &= ~pop | (s_ok & parent_ok)
        level = jax.tree.map(
            lambda fresh, popped, cur: jnp.where(push, fresh, jnp.where(pop, popped, cur)),
            _fresh_level(),
            parent_fed,
            level,
        )
        depth = depth + push.astype(jnp.int32) - pop.astype(jnp.int32)

        expect = jnp.where(plus | minus | star | slash | lpar, True, jnp.where(rpar, False, expect))
        new = dict(
            level=level, stack=stack, depth=depth, expect=expect, ok=ok, in_num=digit, lit=lit,
            lit_zero=lit_zero, lit_digits=lit_digits, lit_big=big & ~start_num, lits=lits, nlits=nlits,
        )
        return new, None

    out, _ = jax.lax.scan(step, carry, chars)
    # end of input: no operand may be pending (empty input, dangling operator), no '(' open
    n, den, sum_ok = _close_sum(out["level"])
    valid = out["ok"] & ~out["expect"] & (out["depth"] == 0) & sum_ok
    value = jnp.where(valid, n.astype(jnp.float32) / jnp.where(valid, den, 1).astype(jnp.float32), 0.0)
    return Evaluation(
        value=value,
        numerator=jnp.where(valid, n, 0),
        denominator=jnp.where(valid, den, 1),
        valid=valid,
        literals=out["lits"],
        num_literals=out["nlits"],
    )


def equals_integer(ev: Evaluation, target: jnp.ndarray) -> jnp.ndarray:
    """bool[]: the expression is valid and its exact value is the integer `target` (i32[])."""
    den = jnp.maximum(ev.denominator, 1)
    return ev.valid & (ev.numerator % den == 0) & (ev.numerator // den == target)


def parse_integer(buf: jnp.ndarray, length: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Parse `buf[:length]` as `[ws] [+|-] digits [ws]` (at most 9 digits, leading zeros allowed).

    Returns (value i32[], valid bool[]); value is 0 when invalid. Vectorised, no loop.
    """
    cap = buf.shape[0]
    pos = jnp.arange(cap)
    ch = buf.astype(jnp.int32)
    inside = pos < jnp.clip(length, 0, cap)
    ws = jnp.zeros((cap,), bool)
    for w in _WHITESPACE:
        ws |= ch == w
    digit = (ch >= ord("0")) & (ch <= ord("9")) & inside
    content = inside & ~ws
    first = jnp.where(content.any(), jnp.argmax(content), cap)
    last = jnp.where(content.any(), cap - 1 - jnp.argmax(content[::-1]), -1)
    sign_at_first = (ch[jnp.clip(first, 0, cap - 1)] == ord("+")) | (ch[jnp.clip(first, 0, cap - 1)] == ord("-"))
    digits_from = first + sign_at_first.astype(jnp.int32)
    body = (pos >= digits_from) & (pos <= last)
    num_digits = body.sum()
    valid = (num_digits > 0) & (num_digits <= 9) & jnp.all(~body | digit)
    # place value 10^(last - pos) for the digit positions
    exponent = jnp.clip(last - pos, 0, 8)
    weights = jnp.asarray([10**k for k in range(9)], jnp.int32)[exponent]
    magnitude = jnp.sum(jnp.where(body & valid, (ch - ord("0")) * weights, 0))
    negative = ch[jnp.clip(first, 0, cap - 1)] == ord("-")
    value = jnp.where(negative, -magnitude, magnitude)
    return jnp.where(valid, value, 0).astype(jnp.int32), valid
