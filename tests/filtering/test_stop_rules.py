"""Early-stop state machines (docs/filtering.md#early-stops) against a transcription of RAGEN's trainer bookkeeping
on synthetic sequences."""
import collections

import jax
import numpy as np

from ragen_jax.filtering import (
    empty_stop_init,
    empty_stop_update,
    reward_variance_base,
    reward_variance_init,
    reward_variance_update,
    validation_success_init,
    validation_success_update,
)


class RagenBookkeeping:
    """RAGEN agent_trainer.fit's early-stop state, written as the trainer does it (lists and a deque)."""

    def __init__(self, empty_stop_steps, window=10, ratio=0.1):
        self.empty_stop_steps, self.window, self.ratio = empty_stop_steps, window, ratio
        self.first, self.base, self.recent = [], None, collections.deque(maxlen=window)
        self.consecutive_empty = 0

    def step(self, kept, rv):
        if kept == 0:
            self.consecutive_empty += 1
            return 0 < self.empty_stop_steps <= self.consecutive_empty
        self.consecutive_empty = 0
        if len(self.first) < self.window:
            self.first.append(rv)
            if len(self.first) == self.window:
                self.base = sum(self.first) / self.window
                self.recent.clear()
            return False
        self.recent.append(rv)
        return len(self.recent) == self.window and all(v < self.ratio * self.base for v in self.recent)


def run_machines(kept_seq, rv_seq, empty_stop_steps, window, ratio):
    empty_update = jax.jit(empty_stop_update)
    rv_update = jax.jit(reward_variance_update)
    empty_state, rv_state = empty_stop_init(), reward_variance_init(window)
    stops = []
    for kept, rv in zip(kept_seq, rv_seq):
        empty_state, stop_empty = empty_update(empty_state, kept, empty_stop_steps)
        rv_state, stop_rv = rv_update(rv_state, rv, kept > 0, ratio)
        stops.append(bool(stop_empty) or bool(stop_rv))
    return stops, empty_state, rv_state


def test_synthetic_sequences_match_ragen_bookkeeping():
    rng = np.random.default_rng(0)
    for trial in range(4):
        length = 45
        kept = rng.choice([0, 0, 1, 3, 8], size=length) if trial < 2 else rng.choice([1, 8], size=length)
        rv = np.where(np.arange(length) < 15, rng.uniform(1.0, 3.0, length), rng.uniform(0.0, 0.25, length))
        rv = rv.astype(np.float32)
        for empty_stop_steps in (0, 2, 5):
            ref = RagenBookkeeping(empty_stop_steps, window=5, ratio=0.1)
            want = [ref.step(int(k), float(v)) for k, v in zip(kept, rv)]
            got, _, _ = run_machines(kept, rv, empty_stop_steps, 5, 0.1)
            assert got == want, (trial, empty_stop_steps)


def test_reward_variance_collapse_timeline():
    # window 3: steps 1-3 build the base (mean 2.0); an empty step is ignored; then 3 collapsed values stop.
    kept = [8, 8, 8, 0, 8, 8, 8]
    rv = np.array([1.0, 2.0, 3.0, 0.0, 0.1, 0.15, 0.19], np.float32)
    stops, empty_state, rv_state = run_machines(kept, rv, 5, 3, 0.1)
    assert stops == [False] * 6 + [True]
    assert float(reward_variance_base(rv_state)) == 2.0
    assert int(rv_state.window_count) == 3 and int(empty_state.consecutive_empty) == 0
    # one value at the threshold (0.2 is not < 0.2) prevents the stop
    at_threshold = rv.copy()
    at_threshold[6] = 0.2
    stops, _, _ = run_machines(kept, at_threshold, 5, 3, 0.1)
    assert stops == [False] * 7
    assert np.isnan(float(reward_variance_base(reward_variance_init(3))))


def test_empty_steps_counter_and_disable():
    stops, state, _ = run_machines([0, 0, 8, 0, 0, 0], [0.0] * 6, 3, 3, 0.1)
    assert stops == [False, False, False, False, False, True]
    assert int(state.consecutive_empty) == 3
    stops, _, _ = run_machines([0] * 8, [0.0] * 8, 0, 3, 0.1)
    assert not any(stops)
    disabled_state = reward_variance_init(0)
    _, stop = reward_variance_update(disabled_state, 0.0, True, 0.1)
    assert not bool(stop)


def test_validation_success_counters_per_key():
    update = jax.jit(validation_success_update)
    state = validation_success_init(2)
    sequence = [[0.0, 0.5], [0.005, 0.0], [0.0, 0.3], [0.009, 0.0], [0.0, 0.0]]
    stops = []
    for success in sequence:
        state, stop = update(state, np.asarray(success, np.float32), 0.01, 5)
        stops.append(bool(stop))
    assert stops == [False, False, False, False, True]  # key 0 low five times in a row
    np.testing.assert_array_equal(state.low_counts, [5, 2])
    state, stop = update(state, np.asarray([0.5, 0.0], np.float32), 0.01, 5)
    np.testing.assert_array_equal(state.low_counts, [0, 3])
    _, stop = update(validation_success_init(1), np.zeros(1, np.float32), 0.01, 0)
    assert not bool(stop)
