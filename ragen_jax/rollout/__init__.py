"""Generation: the KV-cache sampler (sampler.py) and the multi-turn rollout built on it."""
