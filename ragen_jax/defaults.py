"""The full configuration schema with RAGEN-2's defaults (docs/rewards_and_objectives.md#defaults).

Every knob the system reads lives here, so a typo in an override fails loudly: `get_config()` returns a
*locked* `ml_collections.ConfigDict`. Task configs (one file per task in `configs/`; `configs/base.py` is this one
as a config file) start from this one and override what differs. Values people sweep (filter value, coefficients,
learning rates, temperature, env stochasticity) are turned into traced arrays by the trainer; everything else is
static structure.
"""
from __future__ import annotations

import ml_collections


def _model() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.arch = "transformer"  # architecture: a config.MODEL_ARCHS name (transformer = the Qwen2 / Llama-3 decoder)
    c.pretrained_path = ""  # folder with config.json + safetensors, or a .gguf file; "" = build from the sizes below
    c.preset = ""  # qwen2.5-{0.5b,1.5b,3b}: shapes, random weights; smollm2-135m-instruct: the installed GGUF
    c.vocab_size = 0  # 0 = take the tokenizer's vocabulary size
    c.d_model = 128  # hidden width
    c.num_layers = 4  # decoder blocks
    c.num_heads = 4  # query heads
    c.num_kv_heads = 2  # key/value heads (grouped-query attention)
    c.mlp_dim = 512  # SwiGLU inner width
    c.rope_theta = 10000.0  # RoPE base frequency
    c.qkv_bias = False  # q/k/v projection bias (Qwen2: True, Llama: False)
    c.tie_embeddings = True  # share the token embedding with the LM head
    c.norm_eps = 1e-6  # RMSNorm epsilon
    c.max_seq_len = 4096  # longest position the KV cache holds
    c.compute_dtype = "float32"  # float32 | bfloat16 (parameters stay float32)
    c.init_seed = 0  # parameter initialisation seed for from-scratch models
    return c


def _tokenizer() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.kind = "builtin"  # builtin | json (a HF tokenizer.json) | gguf (a GGUF file's) | qwen2.5 | qwen3.6
    c.path = ""  # kind json: folder or file holding tokenizer.json; kind gguf: the .gguf file ("" = the model's)
    c.chat_format = "plain"  # plain | chatml (Qwen) | llama3 | auto (kind gguf: the file's chat template)
    return c


def _env() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "sokoban"  # registered environment name (environments.registered())
    c.kwargs = ml_collections.ConfigDict()  # environment constructor overrides (size, num_boxes, ...)
    c.success_rate = 1.0  # probability that a move goes where intended (FrozenLake stochasticity)
    return c


def _rollout() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.num_groups = 8  # prompts per step (es_manager.train.env_groups)
    c.group_size = 16  # rollouts per prompt; a group shares its reset key
    c.max_turn = 5  # assistant turns per trajectory
    c.max_actions_per_turn = 2  # actions parsed from one answer
    c.max_actions_per_traj = 10  # actions executed in one trajectory
    c.format_penalty = -0.1  # added to the episode reward per turn without a fully valid answer
    c.response_length = 400  # new tokens generated per turn
    c.max_model_len = 3600  # tokens in one whole trajectory
    c.enable_think = True  # prefill "<think>" and parse <think>...</think><answer>...</answer>
    c.temperature = 1.0  # sampling temperature during training rollouts
    c.top_p = 1.0  # nucleus sampling threshold (1.0 = off)
    c.top_k = 0  # top-k sampling (0 = off)
    c.reward_normalization = "identity"  # identity | mean | mean_std | asym_clip (per group)
    c.val_num_groups = 512  # validation prompts
    c.val_group_size = 1  # rollouts per validation prompt
    c.val_temperature = 0.5  # validation sampling temperature
    c.val_seed = 123  # base reset seed of validation prompts (fixed across evaluations)
    return c


def _algo() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "ppo"  # ppo | dapo | grpo | drgrpo (presets, docs/rewards_and_objectives.md#presets)
    c.adv_estimator = "gae"  # gae (critic) | grpo (critic-free)
    c.gamma = 1.0  # GAE discount
    c.lam = 1.0  # GAE lambda
    c.bi_level_gae = False  # turn-level + token-level GAE (docs/rewards_and_objectives.md#bi-level-gae)
    c.high_level_gamma = 0.95  # turn-level discount of bi-level GAE
    c.norm_adv_by_std = True  # GRPO divides by the group std; False = Dr.GRPO
    c.grpo_length_weight = False  # divide GRPO advantages by relative length (docs/rewards_and_objectives.md)
    c.clip_ratio_low = 0.2  # PPO lower clip epsilon
    c.clip_ratio_high = 0.28  # PPO upper clip epsilon (clip-higher)
    c.clip_ratio_c = 3.0  # dual-clip bound for negative advantages
    c.value_clip = 0.5  # critic value clip range
    c.loss_agg_mode = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    c.entropy_coeff = 0.001  # entropy bonus coefficient
    c.use_kl_loss = False  # add a KL(actor || reference) loss term
    c.kl_loss_coef = 0.0  # its coefficient
    c.kl_loss_type = "kl"  # kl/k1 | abs | mse/k2 | low_var_kl/k3 (hyphens allowed)
    c.use_kl_in_reward = False  # subtract beta * KL from token rewards instead
    c.kl_coef = 0.0  # that beta
    c.kl_penalty = "kl"  # estimator of the reward penalty
    c.ppo_epochs = 1  # passes over the batch per step
    c.ppo_mini_batch_size = 32  # trajectories per optimizer step
    c.ppo_micro_batch_size = 0  # rows per gradient-accumulation chunk (0 = the whole minibatch)
    c.soft_advantage_reweight = False  # scale advantages by group std / max std (docs/filtering.md)
    c.zero_task_advantage = False  # ablation: regulariser gradients only
    c.critic_warmup = 0  # steps that update only the critic
    c.score_width_tiers = 0  # most static widths the training forwards score at: fewer = less to compile (0 = all)
    return c


def _filter() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.strategy = "top_p"  # top_p | top_k | top_k_abs | min_p
    c.value = 1.0  # p, fraction k, absolute k, or min-p ratio (1.0 top_p + include_zero = off)
    c.type = "largest"  # keep the largest or the smallest scores
    c.include_zero = True  # False drops groups whose score is ~0 before selecting
    c.top_p_mode = "linear"  # linear score mass | softmax probability mass
    c.eps = 0.01  # epsilon subtracted from the linear top-p threshold
    c.metric = "reward_variance"  # reward_variance | reward | reward_sum | entropy | entropy_variance | length
    c.loss_scaling = "none"  # none | linear | sqrt: scale advantages by the kept ratio
    c.empty_stop_steps = 5  # stop after this many consecutive empty steps (0 = never)
    c.rv_collapse_window = 10  # steps in the reward-variance base and sliding window (0 = never stop)
    c.rv_collapse_ratio = 0.1  # stop when every windowed std < ratio * base
    c.val_success_floor = 0.01  # validation success below this counts as low
    c.val_success_patience = 5  # stop after this many low evaluations in a row (0 = never)
    return c


def _diagnostics() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.collapse_every = 1  # collapse metrics every N steps (RAGEN: 5, plus step 1); 0 = off
    c.first_turn_enabled = True  # collapse_first_turn_sample/* family
    c.multi_turn_enabled = True  # collapse_trajectory_sample/* family
    c.num_samples = 64  # (x, z) pairs scored per family
    c.score_width_tiers = 4  # static widths the cross log-probs pad to: fewer = less to compile, more padding
    c.std_eps = 1e-3  # epsilon of the MI z-score
    c.faithfulness_prompts = 0  # validation prompts whose reasoning is scored against their facts (0 = off)
    c.ema_decay = 0.9  # decay of the marginal-std EMA
    c.grad_analysis_every = 0  # gradient-component analysis every N steps (0 = off; RAGEN: 50)
    c.grad_analysis_bucket_mode = "quantile"  # quantile | fixed_rv
    c.grad_analysis_num_buckets = 6  # reward-variance buckets
    c.grad_analysis_num_groups = 0  # groups of a separate analysis batch (0 = the training batch)
    c.grad_analysis_group_size = 0  # its rollouts per group (0 = rollout.group_size)
    return c


def _optim() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.actor_lr = 1e-6  # actor AdamW learning rate
    c.critic_lr = 1e-5  # critic AdamW learning rate
    c.b1 = 0.9  # Adam beta1
    c.b2 = 0.999  # Adam beta2
    c.weight_decay = 0.01  # decoupled weight decay
    c.grad_clip = 1.0  # global-norm gradient clip; a non-finite norm skips the step
    c.warmup_steps = 0  # linear learning-rate warm-up (0 = constant schedule)
    return c


def _train() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.total_steps = 200  # training steps (RAGEN base: 200; paper scripts: 400)
    c.seed = 0  # master PRNG seed
    c.test_freq = 10  # validate before training, every N steps and at the end (0 = never)
    c.sft_steps = 0  # supervised warm-start steps on environment oracles before RL
    c.sft_lr = 1e-3  # warm-start learning rate
    c.sft_batch_size = 0  # distinct prompts per warm-start batch (0 = rollout.num_groups * rollout.group_size)
    c.sft_micro_batch_size = 0  # rows per gradient-accumulation chunk of a warm-start step (0 = the whole batch)
    c.sft_oracle_prob = 1.0  # q: a demonstrated answer is the oracle's with probability q, else a random valid one
    c.sft_reasoning = "env"  # a demonstration's reasoning: env (describes the observation) | own (the model's sample)
    return c


def _checkpoint() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.dir = ""  # checkpoint folder ("" = no checkpoints; --workdir=DIR: DIR/checkpoints)
    c.save_freq = 50  # save every N steps
    c.max_to_keep = 3  # checkpoints kept on disk
    c.resume = True  # continue from the newest checkpoint in dir; False starts over (drops its checkpoints and metrics)
    return c


def _logging() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.dir = ""  # metrics folder (metrics.jsonl + TensorBoard events; "" = console only; --workdir=DIR: DIR)
    c.every = 1  # write metrics every N steps
    c.tensorboard = True  # also write TensorBoard event files
    c.progress_bar = True  # a tqdm bar on a terminal console (else, and when off: one summary line per step)
    c.samples_every = 10  # a few decoded validation and training trajectories to samples/ every N steps (0 = never)
    c.phase_timings = False  # run the step as 4 timed programs (timing_s/rollout, ...; train/phases.py), same metrics
    c.compilation_cache = "auto"  # persistent XLA cache folder ("auto": ~/.cache/ragen_jax/xla, "": off)
    return c


def _mesh() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.data = -1  # data-parallel axis size (-1 = all devices left after fsdp and sweep; else the first devices)
    c.fsdp = 1  # parameter-sharding axis size (also splits the batch, with data)
    c.sweep = 1  # vectorised-sweep axis size (ragen_jax.train.sweep; a single run needs 1)
    c.sweep_loop_phases = ""  # sweep phases run member after member, e.g. "prepare,update" (needs sweep = 1)
    return c


def get_config() -> ml_collections.ConfigDict:
    """Returns the locked base config; task configs override fields of it."""
    config = ml_collections.ConfigDict()
    config.model = _model()
    config.tokenizer = _tokenizer()
    config.env = _env()
    config.rollout = _rollout()
    config.algo = _algo()
    config.filter = _filter()
    config.diagnostics = _diagnostics()
    config.optim = _optim()
    config.train = _train()
    config.checkpoint = _checkpoint()
    config.logging = _logging()
    config.mesh = _mesh()
    config.lock()
    return config
