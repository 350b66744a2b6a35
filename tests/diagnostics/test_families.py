"""The two sampling families (docs/diagnostics.md#sampling-families), signatures, the cadence gate and the end-to-end
glue."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.diagnostics import families

VOCAB, GROUPS, GROUP_SIZE, TURNS, LENGTH = 16, 4, 4, 3, 40
BATCH = GROUPS * GROUP_SIZE


def _spans(seed, group_prompt_len=5, same_group_prompts=True):
    """A random buffer: turn-1 prompt shared per group, then per turn (reasoning, answer/obs filler)."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((BATCH, LENGTH), np.int32)
    start = np.zeros((BATCH, TURNS), np.int32)
    length = np.zeros((BATCH, TURNS), np.int32)
    taken = np.zeros((BATCH, TURNS), bool)
    group_ids = np.repeat(np.arange(GROUPS), GROUP_SIZE)
    group_prompts = rng.integers(1, VOCAB, (GROUPS, group_prompt_len))
    group_prompts[3] = group_prompts[1]  # two groups with token-identical prompts
    for b in range(BATCH):
        pos = group_prompt_len
        tokens[b, :pos] = group_prompts[group_ids[b]] if same_group_prompts else rng.integers(1, VOCAB, pos)
        for t in range(int(rng.integers(1, TURNS + 1))):
            n = int(rng.integers(0, 5)) if rng.random() < 0.75 else 0
            taken[b, t], start[b, t], length[b, t] = True, pos, n
            tokens[b, pos:pos + n + 3] = rng.integers(1, VOCAB, n + 3)
            pos += n + 3 + 2  # reasoning, answer, next observation
    return families.ReasoningSpans(tokens=jnp.asarray(tokens), think_start=jnp.asarray(start),
                                   think_len=jnp.asarray(length), turn_taken=jnp.asarray(taken),
                                   group_ids=jnp.asarray(group_ids, jnp.int32))


_first = jax.jit(jax.vmap(families.first_turn_pairs, in_axes=(None, 0, None, None)), static_argnums=(2, 3))
_traj = jax.jit(jax.vmap(families.trajectory_uniform_pairs, in_axes=(None, 0, None)), static_argnums=2)


def test_first_turn_sampling_is_uniform_without_replacement():
    spans = _spans(0)
    valid = np.asarray(spans.valid_turn[:, 0])
    num_samples, draws = 6, 4000
    pairs = jax.tree.map(np.asarray, _first(spans, jax.random.split(jax.random.key(0), draws), num_samples, GROUPS))
    n_valid = valid.sum()
    assert (pairs.row_valid.sum(1) == min(num_samples, n_valid)).all()
    counts = np.zeros(BATCH)
    for d in range(draws):
        rows = pairs.reason_traj[d][pairs.row_valid[d]]
        assert len(set(rows)) == len(rows) and valid[rows].all()
        counts[rows] += 1
        for g in range(GROUPS):  # column g <-> first sampled row of group g
            members = np.flatnonzero(pairs.row_valid[d] & (pairs.true_col[d] == g))
            assert pairs.col_valid[d, g] == (len(members) > 0)
            if len(members):
                assert pairs.prompt_traj[d, g] == pairs.reason_traj[d, members[0]]
    p = min(num_samples, n_valid) / n_valid
    assert (counts[~valid] == 0).all()
    assert np.abs(counts[valid] / draws - p).max() < 5 * math.sqrt(p * (1 - p) / draws)


def test_first_turn_takes_every_valid_row_when_samples_exceed_them():
    spans = _spans(1)
    pairs = jax.tree.map(np.asarray, _first(spans, jax.random.split(jax.random.key(1), 2), 64, GROUPS))
    valid = np.flatnonzero(np.asarray(spans.valid_turn[:, 0]))
    assert sorted(pairs.reason_traj[0][pairs.row_valid[0]]) == list(valid)


def test_trajectory_uniform_sampling_probabilities():
    spans = _spans(2)
    valid_turn = np.asarray(spans.valid_turn)
    per_traj = valid_turn.sum(1)
    num_samples, draws = 8, 3000
    pairs = jax.tree.map(np.asarray, _traj(spans, jax.random.split(jax.random.key(2), draws), num_samples))
    assert (pairs.col_valid == pairs.row_valid).all()
    assert (pairs.true_col == np.arange(num_samples)).all()
    counts = np.zeros((BATCH, TURNS))
    start, length = np.asarray(spans.think_start), np.asarray(spans.think_len)
    for d in range(draws):
        for s in np.flatnonzero(pairs.row_valid[d]):
            m = pairs.reason_traj[d, s]
            t = int(np.flatnonzero(start[m] == pairs.reason_start[d, s])[0])
            assert valid_turn[m, t] and pairs.reason_len[d, s] == length[m, t]
            counts[m, t] += 1
    expected = np.where(valid_turn, 1.0 / (BATCH * np.maximum(per_traj, 1))[:, None], 0.0)  # Pr(m, t)
    freq = counts / (draws * min(num_samples, valid_turn.sum()))
    assert (counts[~valid_turn] == 0).all()
    assert np.abs(freq - expected).max() < 5 * math.sqrt(expected.max() / (draws * num_samples))
    wasted = (per_traj == 0).mean()  # draws of trajectories without a valid turn are dropped
    assert pairs.row_valid.mean() == pytest.approx(1 - wasted, abs=0.02)


def test_prompt_signatures_match_exact_token_tuples():
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(0, 3, (6, 12)), jnp.int32)
    traj = jnp.asarray(rng.integers(0, 6, 20), jnp.int32)
    length = jnp.asarray(rng.integers(0, 4, 20), jnp.int32)
    valid = jnp.asarray(rng.random(20) < 0.8)
    prompts, kept = families.gather_prompts(tokens, traj, length, 12)
    sig = np.asarray(families.prompt_signatures(prompts, valid))
    tuples = [tuple(np.asarray(tokens)[m, :n]) for m, n in zip(np.asarray(traj), np.asarray(length))]
    for j in range(20):
        same = [k for k in range(20) if bool(valid[k]) and tuples[k] == tuples[j]]
        if bool(valid[j]):
            assert sig[j] == same[0]
    narrow, narrow_len = families.gather_prompts(tokens, traj, length, 2)  # keeps the LAST tokens
    for j in range(20):
        n = int(narrow_len[j])
        assert list(np.asarray(narrow[j, :n])) == list(tuples[j][len(tuples[j]) - n:])


@pytest.mark.parametrize("every,steps", [(5, [1, 5, 10]), (1, list(range(1, 12))), (0, [])])
def test_should_compute_schedule(every, steps):
    got = [s for s in range(12) if bool(families.should_compute(jnp.int32(s), every))]
    assert got == steps


# ---------------------------------------------------------------- end to end with an analytic "policy"
_W = np.random.default_rng(7).normal(0, 2.0, (VOCAB, VOCAB))


def _bigram_score(prompts, prompt_len, reasoning, reasoning_len):
    """log p(z | x) under p(z_t | z_<t, x) = softmax(W[previous token]), the previous of z_0 = x's last token."""
    logq = jax.nn.log_softmax(jnp.asarray(_W, jnp.float32), axis=-1)
    last = jnp.take_along_axis(prompts, jnp.maximum(prompt_len - 1, 0)[:, None], axis=1)[:, 0]  # [C]
    prev = jnp.concatenate([jnp.broadcast_to(last[None, :, None], (reasoning.shape[0], last.shape[0], 1)),
                            jnp.broadcast_to(reasoning[:, None, :-1], (reasoning.shape[0], last.shape[0],
                                                                       reasoning.shape[1] - 1))], axis=2)
    token_logp = logq[prev, reasoning[:, None, :]]  # [R, C, Z]
    mask = jnp.arange(reasoning.shape[1]) < reasoning_len[:, None, None]
    total = jnp.sum(jnp.where(mask, token_logp, 0.0), -1)
    return total / jnp.maximum(reasoning_len, 1)[:, None], total


def _np_bigram(prompt, reasoning):
    logq = _W - np.log(np.exp(_W).sum(1, keepdims=True))
    prev = [prompt[-1]] + list(reasoning[:-1])
    total = sum(logq[p, z] for p, z in zip(prev, reasoning))
    return total / len(reasoning), total


def _expected_family(spans, pairs, reference):
    """Numpy: the family's matrix from python token tuples, then the reference metrics."""
    tokens = np.asarray(spans.tokens)
    p = jax.tree.map(np.asarray, pairs)
    rows = np.flatnonzero(p.row_valid & p.col_valid[p.true_col])
    cols = np.flatnonzero(p.col_valid)
    prompts = [tuple(tokens[p.prompt_traj[j], :p.prompt_len[j]]) for j in cols]
    reasons = [tokens[p.reason_traj[i], p.reason_start[i]:p.reason_start[i] + p.reason_len[i]] for i in rows]
    lp = np.array([[_np_bigram(x, z)[0] for x in prompts] for z in reasons])
    lps = np.array([[_np_bigram(x, z)[1] for x in prompts] for z in reasons])
    col_of = {c: k for k, c in enumerate(cols)}
    return reference(lp, lps, np.array([col_of[c] for c in p.true_col[rows]]), prompts)


@pytest.fixture(scope="module")
def gated_fn():
    """The gated entry point (every 5 steps), compiled once for every test below."""
    options = families.CollapseOptions(num_groups=GROUPS, num_samples=8, max_reasoning_len=6, every=5)
    return jax.jit(lambda step, spans, key, state: families.collapse_diagnostics_every(
        step, _bigram_score, spans, key, state, options))


@pytest.fixture(scope="module")
def diagnostics_fn(gated_fn):
    return lambda spans, key, state: gated_fn(jnp.int32(5), spans, key, state)


@pytest.mark.parametrize("seed", [4, 5])
def test_collapse_diagnostics_end_to_end(diagnostics_fn, seed, collapse_reference):
    spans = _spans(seed)
    key = jax.random.key(seed)
    metrics, state = diagnostics_fn(spans, key, families.init_state())
    k_first, k_traj = jax.random.split(key)
    for prefix, pairs in ((families.FIRST_TURN, families.first_turn_pairs(spans, k_first, 8, GROUPS)),
                          (families.TRAJECTORY, families.trajectory_uniform_pairs(spans, k_traj, 8))):
        want = _expected_family(spans, pairs, collapse_reference)
        for name in want:
            assert float(metrics[f"{prefix}/{name}"]) == pytest.approx(float(want[name]), rel=1e-4, abs=1e-4), name
        assert bool(state[prefix]["initialised"])
    valid_turn, taken = np.asarray(spans.valid_turn), np.asarray(spans.turn_taken)
    assert float(metrics["collapse/valid_thinking_rate"]) == pytest.approx(valid_turn.sum() / taken.sum())
    assert float(metrics["collapse/first_turn_valid_rate"]) == pytest.approx(valid_turn[:, 0].mean())
    assert float(metrics["collapse/first_turn_prompt_mismatch"]) == 0.0


def test_first_turn_family_dropped_when_group_prompts_differ(diagnostics_fn):
    metrics, state = diagnostics_fn(_spans(6, same_group_prompts=False), jax.random.key(0), families.init_state())
    assert float(metrics["collapse/first_turn_prompt_mismatch"]) > 0
    assert math.isnan(float(metrics[f"{families.FIRST_TURN}/mi_estimate"]))
    assert not bool(state[families.FIRST_TURN]["initialised"])
    assert not math.isnan(float(metrics[f"{families.TRAJECTORY}/mi_estimate"]))


def test_gate_skips_without_touching_state(gated_fn):
    spans, state = _spans(4), families.init_state()
    skipped, same = gated_fn(jnp.int32(3), spans, jax.random.key(0), state)
    assert all(math.isnan(float(v)) for v in skipped.values())
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), same, state))
    ran, new = gated_fn(jnp.int32(5), spans, jax.random.key(0), state)
    assert set(ran) == set(skipped) and not math.isnan(float(ran[f"{families.TRAJECTORY}/mi_estimate"]))
    assert bool(new[families.TRAJECTORY]["initialised"])
