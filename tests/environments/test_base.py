"""TextEnv's contract on two toy envs written here, against a plain-Python simulation of the rules."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from environments import registry
from environments.base import TextEnv
from environments.pieces import PieceTable
from tests.environments.helpers import batched, encode, obs_text, take

SIZE = 5
WORDS = ("Left", "Right", "Jump")
BUDGET = 3
R = 48  # response tokens
N = 48  # envs per batched call (one compiled reset and step per env)


@struct.dataclass
class LineState:
    pos: jnp.ndarray


@struct.dataclass
class LineParams:
    goal_reward: jnp.ndarray


class Line(TextEnv):
    """A player on cells 0..SIZE-1 walks to the goal at the right end; "Jump" is valid only on cell 0
    (it goes to cell 2)."""

    Params = LineParams
    default_params = LineParams(goal_reward=jnp.float32(1.0))

    def __init__(self, tokenizer, size=SIZE, **kwargs):
        self.size = size
        pieces = PieceTable(tokenizer, ["Row: ", "P", "_", "G", "\nAt ", *map(str, range(size))])
        self._cell = pieces.indices(["P", "_", "G"])
        self._digit = pieces.indices(list(map(str, range(size))))
        capacity = pieces.token_len("Row: ") + size * pieces.max_len(["P", "_", "G"]) + pieces.token_len("\nAt ")
        capacity += pieces.max_len(list(map(str, range(size))))
        super().__init__(tokenizer, pieces=pieces, action_words=WORDS, obs_capacity=capacity,
                         instruction="Walk right.", **kwargs)

    def init_state(self, key, params):
        return LineState(pos=jax.random.randint(key, (), 0, self.size - 1))

    def observation_pieces(self, s):
        cells = jnp.arange(self.size)
        kind = jnp.where(cells == s.pos, 0, jnp.where(cells == self.size - 1, 2, 1))
        return jnp.concatenate([jnp.array([self.pieces.index("Row: ")]), jnp.asarray(self._cell)[kind],
                                jnp.array([self.pieces.index("\nAt ")]), jnp.asarray(self._digit)[s.pos][None]])

    def success(self, s):
        return s.pos == self.size - 1

    def action_valid(self, s, action):
        return (action != 2) | (s.pos == 0)

    def apply_action(self, key, s, action, params):
        new = jnp.clip(s.pos + jnp.array([-1, 1, 2])[action], 0, self.size - 1)
        at_goal = new == self.size - 1
        return LineState(pos=new), jnp.where(at_goal, params.goal_reward, 0.0), at_goal, new != s.pos


def line_text(pos):
    return "Row: " + "".join("P" if c == pos else "G" if c == SIZE - 1 else "_" for c in range(SIZE)) + f"\nAt {pos}"


def simulate(pos, actions_left, done, parts, goal_reward=1.0):
    """Python rules of the base turn for Line: parts are the answer's action strings (<= 2 kept)."""
    parts = parts[:2]
    lookup = {w.lower(): i for i, w in enumerate(WORDS)}
    ids = [lookup.get(p.lower(), -1) for p in parts]
    valid = [a for a in ids if a >= 0 and (a != 2 or pos == 0)]
    format_ok = bool(parts) and len(valid) == len(parts)
    reward, executed, effective, terminated = 0.0, 0, False, False
    for a in (valid[: actions_left] if not done else []):
        new = min(max(pos + [-1, 1, 2][a], 0), SIZE - 1)
        effective, pos, executed = new != pos, new, executed + 1
        if pos == SIZE - 1:
            reward, terminated = reward + goal_reward, True
            break
    actions_left -= executed
    return dict(pos=pos, reward=reward, format_ok=format_ok, executed=executed, effective=effective,
                num_valid=len(valid), terminated=terminated, done=done or terminated or actions_left <= 0,
                actions_left=actions_left)


@functools.cache
def line_env(tokenizer):
    """One Line env per tokenizer, so its compiled batched reset and step are shared by the tests."""
    return Line(tokenizer, max_actions_per_traj=BUDGET)


def test_render_decodes_to_render_text(tokenizer):
    env = line_env(tokenizer)
    obs, state = batched(env).reset(jax.random.split(jax.random.key(0), N), env.default_params)
    for i in range(N):
        s = take(state, i)
        text = env.render_text(s)
        assert text == line_text(int(s.env.pos))
        assert obs_text(tokenizer, obs, i) == text


def test_turns_follow_the_python_rules(builtin_tokenizer):
    """The built-in tokenizer only: the BPE path of rendering and parsing is tested elsewhere."""
    tokenizer = builtin_tokenizer
    env = line_env(tokenizer)
    reset, step = batched(env)
    rng = np.random.default_rng(1)
    n = N
    pos = rng.integers(0, SIZE, n)
    left = rng.integers(0, BUDGET + 1, n)
    done = rng.random(n) < 0.15
    parts = [list(rng.choice(["Left", "Right", "Jump", "Fly", "right"], size=rng.integers(0, 4))) for _ in range(n)]
    texts = [f"<think>t</think><answer>{' || '.join(p)}</answer>" if i % 9 else " || ".join(p) for i, p in enumerate(parts)]
    state = reset(jax.random.split(jax.random.key(0), n), env.default_params)[1]
    state = state.replace(env=state.env.replace(pos=pos.astype(np.int32)), actions_left=left.astype(np.int32),
                          done=done)
    params = env.default_params.replace(goal_reward=jnp.float32(2.5))
    out = step(jax.random.split(jax.random.key(1), n), state, *encode(tokenizer, texts, R), params)
    obs, new, reward, is_done, info = jax.device_get(out)
    for i in range(n):
        want = simulate(int(pos[i]), int(left[i]), bool(done[i]), [p.strip() for p in parts[i]] if i % 9 else [],
                        goal_reward=2.5)
        assert int(new.env.pos[i]) == want["pos"], (i, texts[i])
        assert float(reward[i]) == pytest.approx(want["reward"])
        assert bool(info["format_ok"][i]) == want["format_ok"]
        assert int(info["num_actions"][i]) == want["executed"]
        assert int(info["num_valid_actions"][i]) == want["num_valid"]
        assert bool(info["action_is_effective"][i]) == want["effective"]
        assert bool(info["action_is_valid"][i]) == (want["executed"] > 0)
        assert bool(info["terminated"][i]) == want["terminated"]
        assert bool(is_done[i]) == bool(new.done[i]) == want["done"]
        assert int(new.actions_left[i]) == want["actions_left"]
        assert bool(info["success"][i]) == (want["pos"] == SIZE - 1)
        assert obs_text(tokenizer, obs, i) == line_text(want["pos"])


@struct.dataclass
class EchoState:
    target: jnp.ndarray
    solved: jnp.ndarray


class Echo(TextEnv):
    """Free-text toy: answer the two-digit target shown."""

    Params = LineParams
    default_params = LineParams(goal_reward=jnp.float32(1.0))

    def __init__(self, tokenizer, **kwargs):
        pieces = PieceTable(tokenizer, [f"{i:02d}" for i in range(100)])
        super().__init__(tokenizer, pieces=pieces, action_words=(), obs_capacity=pieces.max_len(),
                         instruction="Repeat the number.", **kwargs)

    def init_state(self, key, params):
        return EchoState(target=jax.random.randint(key, (), 0, 100), solved=jnp.bool_(False))

    def observation_pieces(self, s):
        return (s.target + 1)[None]

    def success(self, s):
        return s.solved

    def apply_answer(self, key, s, text, text_len, params):
        digits = (text[:2] >= ord("0")) & (text[:2] <= ord("9"))
        valid = (text_len == 2) & digits.all()
        value = (text[0].astype(jnp.int32) - 48) * 10 + text[1].astype(jnp.int32) - 48
        right = valid & (value == s.target)
        return s.replace(solved=right), jnp.where(right, params.goal_reward, 0.0), right, valid, right


def test_free_text_answers(builtin_tokenizer):
    tokenizer = builtin_tokenizer
    env = Echo(tokenizer, enable_think=False)
    reset, step = batched(env)
    _, state = reset(jax.random.split(jax.random.key(3), 5), env.default_params)
    targets = np.asarray(state.env.target)
    t, other = targets[0], (targets[1] + 1) % 100  # row 1 gets a wrong number
    texts = [f"<answer> {t:02d} || 7</answer>", f"<answer>{other:02d}</answer>", "<answer>x1</answer>",
             f"{targets[3]:02d}", "<answer> || </answer>"]
    out = step(jax.random.split(jax.random.key(0), 5), state, *encode(tokenizer, texts, R), env.default_params)
    _, new, reward, done, info = out
    np.testing.assert_array_equal(reward, [1.0, 0.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(info["format_ok"], [True, True, False, False, False])
    np.testing.assert_array_equal(info["success"], [True, False, False, False, False])
    np.testing.assert_array_equal(done, [True, False, False, False, False])
    np.testing.assert_array_equal(new.actions_left, [BUDGET * 0 + 9, 9, 10, 10, 10])


def test_registry_routes_overrides(monkeypatch, builtin_tokenizer):
    registry.registered()  # load the env modules first: loading into the patched copy would lose them afterwards
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("test_line", Line, max_actions_per_traj=4)
    assert "test_line" in registry.registered()
    env, params = registry.make("test_line", builtin_tokenizer, goal_reward=3.0, size=7, max_actions_per_turn=3)
    assert (env.size, env.max_actions_per_turn, env.max_actions_per_traj) == (7, 3, 4)
    assert float(params.goal_reward) == 3.0
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        registry.make("nope", builtin_tokenizer)
    with pytest.raises(TypeError, match="test_line"):
        registry.make("test_line", builtin_tokenizer, colour="red")


def test_pieces_reject_tokenizers_that_add_tokens(builtin_tokenizer):
    class WithBos:
        vocab_size, pad_id = builtin_tokenizer.vocab_size, builtin_tokenizer.pad_id
        token_bytes = builtin_tokenizer.token_bytes

        def encode(self, text):
            return [builtin_tokenizer.eos_id, *builtin_tokenizer.encode(text)]

        def decode(self, ids):
            return builtin_tokenizer.decode(ids)

    with pytest.raises(ValueError, match="'Row: ' does not round-trip"):
        PieceTable(WithBos(), ["Row: "])
