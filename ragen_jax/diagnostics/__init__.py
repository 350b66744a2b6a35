"""Collapse diagnostics (MI proxies of reasoning collapse) and gradient-component analysis (docs/diagnostics.md).

- `collapse.collapse_metrics` / `collapse.init_ema`: the MI proxies of one cross log-prob matrix.
- `cross_logprobs.cross_log_probs`: l[i, j] = log p(z_i | x_j) with each prompt prefilled once into a KV cache
  (`cross_log_probs_naive`: the full-sequence reference).
- `families.collapse_diagnostics(_every)`: both sampling families on the unfiltered batch, from
  `families.ReasoningSpans`, with `families.CollapseOptions` and `families.should_compute`.
- `gradients.gradient_analysis`: task / entropy / KL gradient norms per reward-variance bucket.
- `schedule.runs_at`: the one step-schedule rule behind `families.should_compute` and `gradients.should_run`.
"""
from ragen_jax.diagnostics import collapse, cross_logprobs, families, gradients, schedule

__all__ = ["collapse", "cross_logprobs", "families", "gradients", "schedule"]
