"""The step's traced values come from one table (train/hyper.py): each traced key fills its own place in `Hyper` and
nothing else, the table fills every place, and what a sweep may vary derives from it."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from configs import frozen_lake
from ragen_jax.train.build import build_env, build_tokenizer
from ragen_jax.train.hyper import HOST_RULES, SWEEPABLE, TRACED, TRACED_ENV, Hyper


def places(hyper: Hyper) -> dict[str, np.ndarray]:
    """{"group.field" or "field": value} of every traced leaf but the env's params."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(hyper.replace(env=None))
    return {".".join(getattr(k, "name", None) or str(getattr(k, "idx", k)) for k in path): np.asarray(leaf)
            for path, leaf in leaves}


def changed(value):
    return (not value) if isinstance(value, bool) else value * 0.5 + 0.125


@pytest.fixture(scope="module")
def config():
    return frozen_lake.get_config("tiny")


def test_every_traced_key_sets_its_own_place_and_no_other(config):
    base = places(Hyper.from_config(config, None))
    assert set(base) == set(TRACED.values())  # the table fills every place, each from one key
    for key, place in TRACED.items():
        section, name = key.split(".")
        other = config.copy_and_resolve_references()
        with other.unlocked():
            other[section][name] = changed(config[section][name])
        new = places(Hyper.from_config(other, None))
        differing = {p for p in base if not np.array_equal(base[p], new[p])}
        assert differing == {place}, key
        assert new[place] == pytest.approx(other[section][name])


def test_group_fields_are_named_after_the_table(config):
    hyper = Hyper.from_config(config, None)
    assert float(hyper.actor.entropy_coeff) == pytest.approx(config.algo.entropy_coeff)
    assert float(hyper.advantage.lam) == pytest.approx(config.algo.lam)
    assert hyper.filter_include_zero.dtype == np.bool_ and hyper.top_p.dtype == np.float32


def test_sweepable_keys_are_the_table_the_env_seed_and_host_rules_and_the_env_key_changes_its_params(config):
    assert SWEEPABLE == (*TRACED, *TRACED_ENV, "train.seed", *HOST_RULES)
    for key in HOST_RULES:
        section, name = key.split(".")
        assert name in config[section]
    tokenizer = build_tokenizer(config)
    slippery = config.copy_and_resolve_references()
    with slippery.unlocked():
        slippery.env.success_rate = 0.8
    plain, slip = build_env(config, tokenizer)[1], build_env(slippery, tokenizer)[1]
    assert jax.tree.structure(plain) == jax.tree.structure(slip)  # the same program, other values
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(slip)))
