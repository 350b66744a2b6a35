"""`select_groups` / `group_scores` against the worked examples of docs/filtering.md (table and RAGEN's own cases)
and a numpy reference of its selection rules."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.config import FILTER_METRICS
from ragen_jax.filtering import group_scores, select_groups


@functools.cache
def batched_select(strategy, filter_type, include_zero, top_p_mode):
    """One compiled function per static combination, vmapped over (scores, value, eps)."""
    fn = functools.partial(select_groups, strategy=strategy, filter_type=filter_type, include_zero=include_zero,
                           top_p_mode=top_p_mode)
    return jax.jit(jax.vmap(lambda s, v, e: fn(s, value=v, eps=e)))


def select(scores, strategy, value, filter_type="largest", include_zero=True, top_p_mode="linear", eps=0.01):
    fn = batched_select(strategy, filter_type, include_zero, top_p_mode)
    mask = fn(jnp.asarray([scores], jnp.float32), jnp.asarray([value], jnp.float32), jnp.asarray([eps], jnp.float32))
    return set(np.nonzero(np.asarray(mask[0]))[0].tolist())


S = [4.9, 3.0, 2.0, 0.5, 0, 0, 0, 0]


@pytest.mark.parametrize(
    "args, kept",
    [
        (("top_p", 0.9, "largest", False, "linear"), {0, 1, 2}),
        (("top_p", 0.9, "largest", True, "linear"), {0, 1, 2}),
        (("top_p", 0.9, "largest", True, "softmax"), {0, 1}),
        (("top_p", 0.9, "largest", False, "softmax"), {0, 1}),
        (("top_p", 1.0, "largest", False, "linear"), {0, 1, 2, 3}),
        (("top_p", 0.9, "smallest", False, "linear"), {3, 2, 1, 0}),
        (("top_k", 0.25), {0, 1}),
        (("top_k_abs", 3), {0, 1, 2}),
        (("min_p", 0.5), {0, 1}),
        (("min_p", 0.5, "smallest", False), {3}),
    ],
)
def test_spec_c4_table(args, kept):
    assert select(S, *args) == kept


def test_spec_c4_all_zero_scores():
    zeros = [0.0] * 8
    assert select(zeros, "top_p", 0.9, "largest", True, "linear") == set()
    assert select(zeros, "top_p", 0.9, "largest", True, "softmax") == set(range(8))
    assert select(zeros, "top_p", 0.9, "largest", False, "softmax") == set()
    assert select(zeros, "top_k", 0.25, "largest", True) == {0, 1}


@pytest.mark.parametrize(
    "scores, value, include_zero, mode, kept",
    [  # RAGEN tests/test_rollout_filter.py
        ([4, 3, 2, 1], 0.6, True, "linear", {0, 1}),
        ([1, 1, 1], 0.6, True, "softmax", {0, 1}),
        ([10, 1, 0, 0], 0.9, False, "softmax", {0}),
        ([4, 2, 0, 0], 0.9, False, "softmax", {0, 1}),
        ([1, 1, 1, 0], 0.6, False, "softmax", {0, 1}),
        ([10, 1, 0, 0], 0.9, False, "linear", {0}),
        ([4, 2, 0, 0], 0.9, False, "linear", {0, 1}),
        ([3, 1, 1, 0], 0.9, False, "linear", {0, 1, 2}),
        ([0, 0, 0, 0], 1.0, True, "linear", {0, 1, 2, 3}),
        ([0, 0, 0, 0], 1.0, True, "softmax", {0, 1, 2, 3}),
        ([5, 0, 2, 0], 1.0, True, "linear", {0, 1, 2, 3}),
    ],
)
def test_ragen_repository_cases(scores, value, include_zero, mode, kept):
    assert select(scores, "top_p", value, "largest", include_zero, mode) == kept


def test_spec_c10_items():
    # 2: top_p = 1 with include_zero=False drops exactly the zero-std groups.
    assert select([0.0, 2.0, 0.0, 1e-12, 3.0], "top_p", 1.0, "largest", False) == {1, 4}
    # 4: uniform scores in softmax mode: N=8 at p=0.9 keeps all 8, N=3 at p=0.6 keeps 2.
    assert select([0.7] * 8, "top_p", 0.9, "largest", True, "softmax") == set(range(8))
    assert select([0.7] * 3, "top_p", 0.6, "largest", True, "softmax") == {0, 1}
    # 5: eps effect: [1, 0.0001] @ 0.9 -> thr = 0.90009 - 0.01 < 1 keeps only group 0; without eps, both.
    assert select([1.0, 0.0001], "top_p", 0.9, "largest", False, "linear") == {0}
    assert select([1.0, 0.1], "top_p", 0.95, "largest", False, "linear", eps=0.0) == {0, 1}
    # Linear + smallest + a zero score with include_zero=True is empty (docs/filtering.md, group selection); the web
    # figure's A/C/B.
    assert select([1.0, 0.0, 2.0], "top_p", 0.5, "smallest", True, "linear") == set()
    assert select([9.0, 1.0, 5.0], "top_p", 0.9, "largest", True, "linear") == {0, 2}


# ---------------------------------------------------------------------------------------------
# numpy reference of docs/filtering.md#group-selection (stable sorts: ties by lower index), float32 like RAGEN's
# tensors.


def reference(scores, strategy, value, ftype, include_zero, mode, eps):
    scores = np.asarray(scores, np.float32)
    value = np.float32(value)
    n = len(scores)
    idx = np.arange(n)
    if not include_zero:
        keep = np.abs(scores) > 1e-10
        scores, idx = scores[keep], idx[keep]
        if len(idx) == 0:
            return set()
    best_first = np.argsort(-scores if ftype == "largest" else scores, kind="stable")
    if strategy == "top_p":
        if value >= 1.0:
            return set(idx.tolist())
        if mode == "softmax":
            logits = scores if ftype == "largest" else -scores
            w = np.exp(logits - logits.max())
            p = w / w.sum()
            order = np.argsort(-p, kind="stable")
            c = np.cumsum(p[order])
            k = min(int(np.searchsorted(c, value, side="left")) + 1, len(idx))
            return set(idx[order[:k]].tolist())
        thr = value * scores.sum(dtype=np.float32) - np.float32(eps)
        cum, count = np.float32(0), 0
        for s in scores[best_first]:
            if cum >= thr or s <= 0:
                break
            cum = np.float32(cum + s)
            count += 1
        return set(idx[best_first[:count]].tolist()) if cum >= thr else set()
    if strategy in ("top_k", "top_k_abs"):
        k = int(np.floor(value * np.float32(n))) if strategy == "top_k" else int(np.floor(value))
        k = max(min(k, len(idx)), 1)
        return set(idx[best_first[:k]].tolist())
    if ftype == "largest":
        return set(idx[scores >= scores.max() * value - 1e-10].tolist())
    return set(idx[scores <= scores.min() / (value + 1e-10) + 1e-10].tolist())


def random_cases(rng, n, count):
    """Score vectors with ties, zeros and negatives, plus all-zero and all-equal rows."""
    rows = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            rows.append(rng.choice([0.0, 0.5, 1.0, 2.0, 3.0], size=n))
        elif kind == 1:
            rows.append(np.where(rng.random(n) < 0.3, 0.0, rng.gamma(1.5, 1.5, n)))
        elif kind == 2:
            rows.append(rng.normal(0.0, 2.0, n))
        else:
            rows.append(np.full(n, rng.choice([0.0, 1.3])))
    return np.asarray(rows, np.float32)


def random_values(rng, strategy, n, count):
    if strategy == "top_k_abs":
        return rng.integers(1, n + 3, count).astype(np.float32)
    if strategy == "top_p":
        return rng.choice([0.3, 0.5, 0.6, 0.8, 0.9, 0.95, 1.0], count).astype(np.float32)
    return rng.choice([0.1, 0.25, 0.5, 0.75, 1.0, rng.random()], count).astype(np.float32)


COMBOS = [
    (strategy, ftype, include_zero, mode)
    for strategy, ftype, include_zero in itertools.product(("top_p", "top_k", "top_k_abs", "min_p"),
                                                          ("largest", "smallest"), (True, False))
    for mode in (("linear", "softmax") if strategy == "top_p" else ("linear",))
]


@pytest.mark.parametrize("strategy, ftype, include_zero, mode", COMBOS)
def test_select_groups_matches_numpy_reference(strategy, ftype, include_zero, mode):
    rng = np.random.default_rng(abs(hash((strategy, ftype, include_zero, mode))) % 2**32)
    fn = batched_select(strategy, ftype, include_zero, mode)
    shapes = ((8, 48), (1, 6)) if ftype == "largest" else ((8, 48),)  # a regular batch and a single group
    for n, count in shapes:
        scores = random_cases(rng, n, count)
        values = random_values(rng, strategy, n, count)
        eps = np.full(count, 0.01, np.float32)
        got = np.asarray(fn(jnp.asarray(scores), jnp.asarray(values), jnp.asarray(eps)))
        for row, v, mask in zip(scores, values, got):
            want = reference(row, strategy, v, ftype, include_zero, mode, 0.01)
            assert set(np.nonzero(mask)[0].tolist()) == want, (row.tolist(), float(v))


def test_new_value_does_not_recompile_and_vmap_equals_separate_calls():
    traces = []

    def traced_select(scores, value):
        traces.append(None)  # runs once per trace
        return select_groups(scores, "top_p", value, "largest", False, "linear")

    fn = jax.jit(traced_select)
    scores = jnp.asarray(S)
    values = [0.3, 0.6, 0.9, 0.95, 1.0]
    separate = [fn(scores, jnp.float32(v)) for v in values]
    assert len(traces) == 1 and fn._cache_size() == 1
    assert [set(np.nonzero(np.asarray(m))[0].tolist()) for m in separate[:3]] == [{0}, {0, 1}, {0, 1, 2}]
    for strategy, grid in (("top_p", values), ("top_k", [0.1, 0.25, 0.5, 1.0]), ("top_k_abs", [1.0, 2.0, 5.0]),
                           ("min_p", [0.2, 0.5, 0.9])):
        one = jax.jit(lambda v: select_groups(scores, strategy, v, top_p_mode="softmax"))
        sweep = jax.jit(jax.vmap(one))(jnp.asarray(grid))
        for v, mask in zip(grid, sweep):
            np.testing.assert_array_equal(mask, one(jnp.float32(v)))


def test_invalid_static_choices_name_the_option():
    with pytest.raises(ValueError, match="filter.strategy"):
        select_groups(jnp.zeros(3), "top_q", 0.5)
    with pytest.raises(ValueError, match="filter.top_p_mode"):
        select_groups(jnp.zeros(3), "top_p", 0.5, top_p_mode="exp")
    with pytest.raises(ValueError, match="filter.metric"):
        group_scores(jnp.zeros((2, 3)), "reward_std")


def test_group_scores_per_metric():
    values = np.array([[1.0, 0.0, 0.0, 1.0], [10.5, -1.0, 10.7, -1.0]], np.float32)
    expected = {
        "reward_variance": values.std(1, ddof=1), "entropy_variance": values.std(1, ddof=1),
        "reward": values.mean(1), "entropy": values.mean(1), "length": values.mean(1), "reward_sum": values.sum(1),
    }
    assert set(expected) == set(FILTER_METRICS)
    for metric, want in expected.items():
        np.testing.assert_allclose(group_scores(jnp.asarray(values), metric), want, rtol=1e-6)
    assert float(group_scores(jnp.asarray(values[:1]), "reward_variance")[0]) == pytest.approx(0.5774, abs=1e-4)
    sokoban = np.array([[10.5, -1, 10.7, -1] + [-1] * 12], np.float32)  # docs/filtering.md: mean 0.45, std 3.962
    assert float(group_scores(jnp.asarray(sokoban), "reward_variance")[0]) == pytest.approx(3.962, abs=1e-3)
    assert float(group_scores(jnp.asarray(sokoban), "reward")[0]) == pytest.approx(0.45, abs=1e-5)
