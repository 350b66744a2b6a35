"""Prefix scoring (`scoring.scored_prefix`): a batch padded far past its longest row is scored over a short prefix
tier, and gives what the same rows give without the padding (the independent reference: no trimming can happen at
that length), in log-probs, values and a whole actor update."""
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.algos import scoring, update_inputs
from ragen_jax.models import lm
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.transformer import DecoderLM
from ragen_jax.train import update

MODEL = DecoderLM(ModelConfig(vocab_size=40, d_model=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8,
                              mlp_dim=32, max_seq_len=512))
ROWS, SHORT, LONG = 8, 100, 400  # rows of up to SHORT tokens right-padded to LONG (tiers 128, 256, 399)


def as_batch(tokens, positions, real, loss_mask, noise) -> update_inputs.UpdateBatch:
    """These rows as an UpdateBatch, with draws of `noise()` f32[B, L-1] as log-probs, advantages and values."""
    return update_inputs.UpdateBatch(tokens=jnp.asarray(tokens, jnp.int32), positions=jnp.asarray(positions, jnp.int32),
                              attention_mask=jnp.asarray(real), loss_mask=jnp.asarray(loss_mask),
                              old_logp=jnp.asarray(noise() - 3.0) * loss_mask, advantages=jnp.asarray(noise()),
                              ref_logp=jnp.asarray(noise() - 3.0) * loss_mask, returns=jnp.asarray(noise()),
                              old_values=jnp.asarray(noise()))


def padded_batch(length: int, seed: int = 0) -> update_inputs.UpdateBatch:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(SHORT // 2, SHORT + 1, ROWS)
    lengths[0] = SHORT
    positions = np.broadcast_to(np.arange(length), (ROWS, length))
    real = positions < lengths[:, None]
    tokens = np.where(real, rng.integers(0, 40, (ROWS, LONG))[:, :length], 0)
    loss_mask = (real[:, 1:] & (positions[:, 1:] > 20)).astype(np.float32)
    noise = lambda: rng.normal(size=(ROWS, LONG - 1))[:, :length - 1].astype(np.float32)  # noqa: E731
    return as_batch(tokens, positions, real, loss_mask, noise)


def test_the_prefix_tier_is_the_smallest_that_holds_every_real_target():
    batch = padded_batch(LONG)
    assert scoring.prefix_widths(batch.tokens) == (128, 256, 399)
    assert int(scoring.needed_width(batch.attention_mask)) == SHORT - 1
    assert int(scoring.needed_width(jnp.zeros((2, 9), bool))) == -1


def test_padded_rows_score_as_the_unpadded_rows_and_zero_after_them():
    params = MODEL.init_params(jax.random.key(0))
    long, short = padded_batch(LONG), padded_batch(SHORT)
    score = jax.jit(lambda b: scoring.token_logprobs(MODEL, params, b.tokens, b.positions, b.attention_mask, 1.0))
    (logp, entropy), (ref_logp, ref_entropy) = score(long), score(short)
    np.testing.assert_allclose(logp[:, :SHORT - 1], ref_logp, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(entropy[:, :SHORT - 1], ref_entropy, rtol=2e-5, atol=2e-6)
    assert not np.any(np.asarray(logp[:, 128:])) and not np.any(np.asarray(entropy[:, 128:]))
    critic = MODEL.init_value_params(jax.random.key(1), params)
    critic["value_head"]["kernel"] = jnp.ones_like(critic["value_head"]["kernel"])
    values = jax.jit(lambda b: scoring.token_values(MODEL.values, critic, b.tokens, b.positions, b.attention_mask))
    np.testing.assert_allclose(values(long)[:, :SHORT - 1], values(short), rtol=2e-5, atol=2e-6)


def test_an_actor_update_on_padded_rows_equals_the_update_on_the_unpadded_rows():
    params = MODEL.init_params(jax.random.key(0))
    config = update.UpdateConfig(minibatch_size=4, micro_batch_size=2, use_kl_loss=True, kl_loss_type="low_var_kl")
    hyper = update_inputs.ActorHyper(*(jnp.float32(v) for v in (1e-2, 0.2, 0.28, 3.0, 0.01, 0.1, 1.0)))
    run = jax.jit(lambda b: update.actor_update(MODEL, params, update.optimizer_init(params, config), b, 6, hyper,
                                                config))
    (long_params, _, long_metrics), (short_params, _, short_metrics) = run(padded_batch(LONG)), run(padded_batch(SHORT))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), long_params, short_params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), long_metrics, short_metrics)
    assert float(long_metrics["actor/num_updates"]) == 2.0


# ---------------------------------------------------------------------------------------------- grouped scoring
GROUPS, GROUP_SIZE, PROMPTS = 3, 4, (37, 45, 41)  # each group's rows share their first PROMPTS[g] tokens
GROUPED_LONG = 600  # windows of 64 (at most an eighth of the length), prefixes of 256, 512, 599


def grouped_batch(length: int = GROUPED_LONG, seed: int = 0) -> update_inputs.UpdateBatch:
    """GROUPS groups of GROUP_SIZE rows: a shared prompt, then each row's own 5-59 tokens, right-padded to `length`."""
    rng = np.random.default_rng(seed)
    rows = GROUPS * GROUP_SIZE
    tokens = rng.integers(1, 40, (rows, length))
    real = np.ones((rows, length), bool)
    for g, prompt in enumerate(PROMPTS):
        group = slice(g * GROUP_SIZE, (g + 1) * GROUP_SIZE)
        tokens[group, :prompt] = tokens[g * GROUP_SIZE, :prompt]
        real[group] = np.arange(length) < prompt + rng.integers(5, 60, (GROUP_SIZE, 1))
        tokens[group, prompt] = (tokens[g * GROUP_SIZE, prompt] + np.arange(1, GROUP_SIZE + 1)) % 40  # rows differ
    tokens = np.where(real, tokens, 0)
    positions = np.maximum(np.cumsum(real, axis=1) - 1, 0)
    loss_mask = (real[:, 1:] & (np.arange(1, length) > 30)).astype(np.float32)
    noise = lambda: rng.normal(size=(rows, length - 1)).astype(np.float32)  # noqa: E731
    return as_batch(tokens, positions, real, loss_mask, noise)


def test_each_groups_split_is_its_shared_prompt_and_the_window_holds_the_rest():
    b = grouped_batch()
    inputs = (b.tokens[:, :-1], b.positions[:, :-1], b.attention_mask[:, :-1])
    assert scoring.group_split(*inputs, GROUP_SIZE).tolist() == list(PROMPTS)
    assert scoring.group_split(*inputs, 2).tolist() == [p for p in PROMPTS for _ in (0, 1)]  # halves of a group
    rows_differ = jnp.asarray(b.tokens).at[1, 3].add(1)  # row 1 leaves its group at position 3
    assert scoring.group_split(rows_differ[:, :-1], *inputs[1:], GROUP_SIZE).tolist() == [3, *PROMPTS[1:]]
    index, tiers = scoring.scoring_tiers(b.tokens, b.positions, b.attention_mask, GROUP_SIZE)
    Tier = scoring.ScoreTier
    assert tiers == (Tier(64, True), Tier(256, False), Tier(512, False), Tier(599, False)) and int(index) == 0
    ends = np.asarray(b.attention_mask).sum(axis=1) - 1  # per row: the input positions whose targets may be real
    shared = np.repeat(np.array(PROMPTS) - 1, GROUP_SIZE)  # targets: the next tokens
    assert np.max(ends - shared) <= 64  # the first tier: the window
    longer = grouped_batch().attention_mask.at[0, :300].set(True)  # row 0 needs 300 - 36 after its group's prompt
    index, _ = scoring.scoring_tiers(b.tokens, b.positions, longer, GROUP_SIZE)
    assert int(index) == 2  # a prefix of 512 holds it
    assert scoring.scoring_tiers(b.tokens, b.positions, b.attention_mask, 1)[1] == (256, 512, 599)
    # at most two tiers (algo.score_width_tiers 2): the window and the whole length; the 512 pick takes the latter
    index, tiers = scoring.scoring_tiers(b.tokens, b.positions, longer, GROUP_SIZE, max_tiers=2)
    assert tiers == (Tier(64, True), Tier(599, False)) and int(index) == 1
    assert int(scoring.scoring_tiers(b.tokens, b.positions, b.attention_mask, GROUP_SIZE, max_tiers=2)[0]) == 0
    assert scoring.scoring_tiers(b.tokens, b.positions, b.attention_mask, 1, max_tiers=1)[1] == (599,)
    assert scoring.prefix_widths(b.tokens, max_tiers=2) == (256, 599)


def test_windows_are_at_most_an_eighth_of_the_length_or_one_of_at_most_half_in_short_rows():
    def windows(length):
        return scoring.group_windows(np.zeros((1, length), np.int32))

    assert windows(GROUPED_LONG) == (64,) and windows(768) == (64,) and windows(3600) == (64, 128, 256)
    # rows too short for a window of an eighth: one window of at most half the length
    assert windows(512) == (128,) and windows(320) == (128,) and windows(200) == (64,) and windows(128) == ()


def test_grouped_scoring_equals_scoring_every_row_in_full():
    """Log-probs, entropies and their gradient with each group's prompt computed once equal those of the plain
    forward of every row (the independent reference); outputs after the window are 0."""
    params = MODEL.init_params(jax.random.key(0))
    b = grouped_batch()

    def score(params, group_size, width=None):
        return scoring.token_logprobs(MODEL, params, b.tokens, b.positions, b.attention_mask, 1.0, width=width,
                                     group_size=group_size)

    score_jit = jax.jit(score, static_argnums=(1, 2))
    (logp, entropy), (ref_logp, ref_entropy) = score_jit(params, GROUP_SIZE), score_jit(params, 1)
    real = np.asarray(b.attention_mask[:, 1:])
    np.testing.assert_allclose(np.where(real, logp, 0), np.where(real, ref_logp, 0), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.where(real, entropy, 0), np.where(real, ref_entropy, 0), rtol=2e-5, atol=2e-5)
    for g, prompt in enumerate(PROMPTS):  # each row's window: 64 targets after its group's shared ones
        assert not np.any(np.asarray(logp[g * GROUP_SIZE:(g + 1) * GROUP_SIZE, prompt - 1 + 64:]))

    def loss(params, group_size, width):
        logp, entropy = score(params, group_size, width)
        return jnp.sum((logp + 0.1 * entropy) * b.loss_mask * b.advantages)

    gradient = jax.jit(jax.grad(loss), static_argnums=(1, 2))
    grads, ref_grads = gradient(params, GROUP_SIZE, scoring.ScoreTier(64, True)), gradient(params, 1, 256)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * float(jnp.abs(r).max()))


def test_the_seams_default_grouped_forward_is_the_full_forward_cut_at_the_window():
    params = MODEL.init_params(jax.random.key(0))
    b = grouped_batch()
    starts = jnp.asarray(PROMPTS, jnp.int32)
    args = (params, b.tokens, b.positions, b.attention_mask, GROUP_SIZE, starts, 64)
    (fast_group, fast_window), (group, window) = (jax.jit(MODEL.grouped_hidden_states, static_argnums=(4, 6))(*args),
                                                  lm.CausalLM.grouped_hidden_states(MODEL, *args))
    assert group.shape == (GROUPS, GROUPED_LONG - 64, 16) and window.shape == (GROUPS * GROUP_SIZE, 64, 16)
    for g, prompt in enumerate(PROMPTS):
        np.testing.assert_allclose(fast_group[g, :prompt], group[g, :prompt], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(fast_window, window, rtol=2e-5, atol=2e-5)
    full = MODEL.hidden_states(params, b.tokens, b.positions, b.attention_mask)
    np.testing.assert_array_equal(window[4], full[4, PROMPTS[1]:PROMPTS[1] + 64])  # row 4 is group 1's first


def test_an_actor_update_with_grouped_scoring_equals_the_plain_update():
    params = MODEL.init_params(jax.random.key(0))
    hyper = update_inputs.ActorHyper(*(jnp.float32(v) for v in (1e-2, 0.2, 0.28, 3.0, 0.01, 0.1, 1.0)))
    results = []
    for group_size in (GROUP_SIZE, 1):
        config = update.UpdateConfig(minibatch_size=4, micro_batch_size=2, use_kl_loss=True,
                                     kl_loss_type="low_var_kl", group_size=group_size)
        results.append(jax.jit(lambda b, c=config: update.actor_update(
            MODEL, params, update.optimizer_init(params, c), b, 10, hyper, c))(grouped_batch()))
    (grouped, _, grouped_metrics), (plain, _, plain_metrics) = results
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grouped, plain)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grouped_metrics, plain_metrics)
