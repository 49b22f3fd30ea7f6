"""The ``actor`` and ``algorithm`` sections of :class:`serl.config.Config` (``algorithm.gigpo``,
``algorithm.spear``, ``algorithm.serl``).

The names these sections select (``actor.policy_loss``, ``algorithm.adv_estimator``,
``algorithm.serl.sampling_mode`` ...) are checked by the registries that own them, through
:func:`serl.configure.check_config`. Imports nothing from serl but :mod:`serl.errors` and
:mod:`serl.config.model_env`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from serl.config.model_env import _check


#: the values of ``actor.token_mean_scope``
TOKEN_MEAN_SCOPES = ("micro_batch", "mini_batch")


@dataclass
class ActorConfig:
    """Policy update (verl ``actor_rollout_ref.actor``; the losses of
    ``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``)."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    #: step rows per optimizer step (verl counts rows, not trajectories)
    ppo_mini_batch_size: int = 256
    #: step rows per forward/backward (gradient accumulation inside a mini-batch)
    ppo_micro_batch_size: int = 8
    #: verl's name: micro-batches of the update formed by length (rows sorted by prompt +
    #: response length, packed up to ``ppo_max_token_len_per_gpu`` padded tokens and at most
    #: ``ppo_micro_batch_size`` rows) instead of consecutive rows: less padding. It regroups the
    #: rows, so with ``token_mean_scope=micro_batch`` a token-mean loss weighs tokens per
    #: micro-batch differently (as verl-agent)
    use_dynamic_bsz: bool = False
    #: padded-token budget of one update micro-batch with ``use_dynamic_bsz`` (verl's name; per
    #: process here)
    ppo_max_token_len_per_gpu: int = 16384
    #: rows per forward pass of the scoring passes (old log-probs, SERL teacher, KL reference):
    #: inference mode, rows grouped by length (verl's ``log_prob_micro_batch_size_per_gpu``).
    #: On CPU a larger micro-batch gains nothing and pads more (8 rows scored 20% slower than
    #: 4, BENCHMARKS.md); raise it on a GPU
    log_prob_micro_batch_size_per_gpu: int = 4
    ppo_epochs: int = 1
    #: policy loss registry name (``loss_mode`` in verl): vanilla (PPO clip + dual clip), ...
    policy_loss: str = "vanilla"
    clip_ratio: float = 0.2
    #: None = clip_ratio (clip-higher sets e.g. 0.2 / 0.28)
    clip_ratio_low: Optional[float] = None
    clip_ratio_high: Optional[float] = None
    #: dual-clip constant c > 1 for negative advantages (Ye et al. 2019)
    clip_ratio_c: float = 3.0
    #: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    loss_agg_mode: str = "token-mean"
    #: the tokens a ``token-mean`` loss averages over. ``micro_batch`` (verl-agent's, the original
    #: recipes'): each micro-batch's own response tokens, the micro-batches then weighted by their
    #: rows (``loss / gradient_accumulation``), so the micro-batch size changes the weighting: a
    #: micro-batch of one row weighs every row alike, whatever its length. ``mini_batch``: every
    #: loss token of the mini-batch (optimizer step) alike, Σ m·l / Σ m over the whole mini-batch,
    #: whatever its split into micro-batches or processes (current verl's ``global_batch_info``,
    #: verl-project/verl#5366), so ``ppo_micro_batch_size`` is a speed and memory setting only.
    #: The ``seq-mean-*`` modes are over the mini-batch's rows in both; Clip-Cov / KL-Cov still
    #: pick their tokens per micro-batch
    token_mean_scope: str = "micro_batch"
    entropy_coeff: float = 0.001
    use_invalid_action_penalty: bool = True
    invalid_action_penalty_coef: float = 0.1
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    #: KL estimator of the reference-KL loss (verl ``kl_penalty``): low_var_kl|k3, kl|k1, mse|k2, abs
    kl_loss_type: str = "low_var_kl"
    #: verl ``policy_loss.*`` keys live here (``policy_loss`` is the registry name).
    #: Clip-Cov (arXiv 2505.22617): share of response tokens whose gradient is cut, and the
    #: covariance band (lb, ub). Defaults = the verl yaml (the SPEAR scripts keep them on-policy)
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    #: KL-Cov (arXiv 2505.22617): share of tokens given the |Δlogπ| penalty, and its coefficient β
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    #: the same for SPEAR replay mini-batches; None = the original code fallbacks
    #: (clip_cov 0.002 / 1.0 / 40.0, kl_cov 0.8); SPEAR scripts: 0.02 / 2 / 60
    clip_cov_ratio_replay: Optional[float] = None
    clip_cov_lb_replay: Optional[float] = None
    clip_cov_ub_replay: Optional[float] = None
    kl_cov_ratio_replay: Optional[float] = None
    #: divisor L of loss_agg_mode=seq-mean-token-sum-norm; None = the padded response length of
    #: the loss tensor (verl pads to data.max_response_length; set that value when padding is
    #: dynamic so the Dr.GRPO normaliser stays constant, arXiv 2503.20783)
    loss_scale_factor: Optional[float] = None
    #: leave the rows whose every token has advantage 0 (a group whose rewards all agree, a
    #: Dr.BoT-filtered row) out of the update's forward/backward and old-log-prob passes, each
    #: micro-batch's loss keeping the normaliser of all its rows. Their policy-gradient term is
    #: exactly 0, so with entropy_coeff = 0 and no KL loss the gradient is the same up to float
    #: rounding; otherwise their entropy bonus and KL penalty are dropped (verl runs every row:
    #: False reproduces it). The actor/* metrics then cover the rows that train. One process,
    #: vanilla or gpg loss, no SPEAR replay (serl.train.update.PolicyUpdate)
    skip_zero_advantage_rows: bool = False

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``actor.<key>``: batch sizes, ``token_mean_scope``, a non-finite or
        non-positive ``lr``, clip ratios (``clip_ratio`` > 0, ``clip_ratio_low/high`` >= 0,
        dual-clip ``clip_ratio_c`` > 1), and the Clip-Cov / KL-Cov ranges. The names
        ``policy_loss`` / ``loss_agg_mode`` / ``kl_loss_type`` are checked by
        :func:`serl.algos.losses.check_config` (the loss registry owns them)."""
        _check(self.ppo_micro_batch_size >= 1, "actor.ppo_micro_batch_size", "must be >= 1")
        _check(self.ppo_mini_batch_size >= 1, "actor.ppo_mini_batch_size", "must be >= 1")
        _check(self.ppo_max_token_len_per_gpu >= 1, "actor.ppo_max_token_len_per_gpu", "must be >= 1")
        _check(self.log_prob_micro_batch_size_per_gpu >= 1, "actor.log_prob_micro_batch_size_per_gpu", "must be >= 1")
        _check(self.ppo_epochs >= 1, "actor.ppo_epochs", "must be >= 1")
        _check(self.token_mean_scope in TOKEN_MEAN_SCOPES, "actor.token_mean_scope",
               f"must be one of {list(TOKEN_MEAN_SCOPES)}, got {self.token_mean_scope!r}")
        _check(math.isfinite(self.lr) and self.lr > 0, "actor.lr", f"must be finite and > 0, got {self.lr}")
        _check(math.isfinite(self.clip_ratio) and self.clip_ratio > 0, "actor.clip_ratio",
               f"must be finite and > 0, got {self.clip_ratio}")
        _check(math.isfinite(self.weight_decay) and self.weight_decay >= 0, "actor.weight_decay",
               f"must be finite and >= 0, got {self.weight_decay}")
        _check(math.isfinite(self.grad_clip) and self.grad_clip > 0, "actor.grad_clip",
               f"must be finite and > 0 (the gradient-norm bound), got {self.grad_clip}")
        _check(math.isfinite(self.entropy_coeff), "actor.entropy_coeff", f"must be finite, got {self.entropy_coeff}")
        _check(math.isfinite(self.invalid_action_penalty_coef) and self.invalid_action_penalty_coef >= 0,
               "actor.invalid_action_penalty_coef", f"must be finite and >= 0, got {self.invalid_action_penalty_coef}")
        for key in ("clip_ratio_low", "clip_ratio_high"):
            v = getattr(self, key)
            _check(v is None or (math.isfinite(v) and v >= 0), f"actor.{key}",
                   f"must be finite and >= 0 (or null = clip_ratio), got {v}")
        _check(self.clip_ratio_c > 1.0, "actor.clip_ratio_c", "dual-clip constant must be > 1")
        _check(math.isfinite(self.kl_loss_coef) and self.kl_loss_coef >= 0, "actor.kl_loss_coef",
               f"must be finite and >= 0, got {self.kl_loss_coef}")
        for key in ("clip_cov_ratio", "kl_cov_ratio", "clip_cov_ratio_replay", "kl_cov_ratio_replay"):
            v = getattr(self, key)
            _check(v is None or 0.0 < v <= 1.0, f"actor.{key}", f"must be in (0, 1], got {v}")
        _check(self.clip_cov_lb < self.clip_cov_ub, "actor.clip_cov_lb", "must be < actor.clip_cov_ub")
        if self.clip_cov_lb_replay is not None and self.clip_cov_ub_replay is not None:
            _check(self.clip_cov_lb_replay < self.clip_cov_ub_replay, "actor.clip_cov_lb_replay",
                   "must be < actor.clip_cov_ub_replay")
        _check(self.ppo_kl_coef >= 0, "actor.ppo_kl_coef", "must be >= 0")
        _check(self.loss_scale_factor is None or self.loss_scale_factor > 0, "actor.loss_scale_factor", "must be > 0")


@dataclass
class SerlConfig:
    """SERL selective hindsight distillation (arXiv 2605.19447; the original's keys are
    ``actor_rollout_ref.actor.serl.*`` in ``OliverLeeXZ/SERL@5a2a85b:recipe/serl/config/serl_trainer.yaml``)."""

    #: turn SERL off to train plain GRPO / GiGPO
    enable: bool = True
    #: which privileged hindsight the teacher sees (see docs/concepts/serl-modes.md); default immediate_feedback
    sampling_mode: str = "immediate_feedback"
    #: response | observation_action (how S, U and judged rollouts are rendered)
    trajectory_format: str = "response"
    success_reward_threshold: float = 1.0
    #: λ0 in [0, 1] (the weight of the selective term)
    mixing_lambda: float = 0.5
    #: D: λ decays linearly to 0 over this many updates; 0 = constant λ0
    lambda_decay_steps: int = 50
    #: c: w is clamped to [1-c, 1+c]
    weight_clip: float = 0.2
    #: hard-copy policy -> teacher every this many updates (no EMA, as the original)
    teacher_sync_interval: int = 10
    #: teacher prompt token cap; 0 = data.max_prompt_length
    max_reprompt_len: int = 0
    #: privileged (ours, default): when the teacher prompt is too long, cut the privileged block
    #: from its start, keeping the chat template's closing turn (serl's departure).
    #: right: the original's tokenizer right-truncation (cuts the assistant header)
    reprompt_truncation: str = "privileged"
    #: student log-prob in Δ: current (live policy inside the update, as the original) | old
    #: (behaviour log-probs: deterministic; serl's option)
    student_logprob: str = "current"
    #: true (serl's default): the teacher does not score rows that train nothing (advantage
    #: exactly 0, or a Dr.BoT-masked response), where W·A = 0 whatever it says; the loss is the
    #: same and the serl_action_mask/* weight metrics cover the scored rows only. false: every
    #: row with a context is scored, as the original (and its metrics over all of them)
    skip_zero_advantage_rows: bool = True
    #: true (serl's default): on conversation-layout rows (env.prompt_layout=conversation) the
    #: teacher scores a row on the keys and values of its common prefix with the row before (the
    #: episode's chat up to the step's own turn), so a T-step episode costs it O(T) tokens, not
    #: O(T²); the same log-probs up to float rounding. false: every row's whole prompt runs
    teacher_prefix_reuse: bool = True
    dont_reprompt_on_self_success: bool = True
    remove_thinking_from_demonstration: bool = True
    #: cap on the steps rendered in a successful-sample / judge trajectory (0 = all)
    max_traj_context_steps: int = 0
    #: cap on the steps rendered in a future / anchor continuation (0 = all)
    max_future_context_steps: int = 0
    #: where the successful sample comes from (docs/concepts/serl-modes.md): group (the original: first
    #: other successful trajectory of the same group) | buffer (ours: the group first, else the
    #: newest success on the same task from earlier iterations)
    success_source: str = "group"
    #: buffer: successful trajectories kept per task, and tasks kept (oldest task evicted first)
    success_buffer_per_task: int = 1
    success_buffer_max_tasks: int = 4096
    #: anchor modes: cluster near-identical observations instead of exact equality;
    #: similarity = rapidfuzz ``fuzz.ratio / 100`` (the original used difflib's ratio)
    anchor_enable_similarity: bool = False
    #: strictly inside (0, 1)
    anchor_similarity_thresh: float = 0.95
    #: rapidfuzz (ours, fast) | difflib (the original's SequenceMatcher ratio)
    anchor_similarity_backend: str = "rapidfuzz"
    #: OpenAI-compatible base URL of the judge (``/chat/completions`` is appended)
    judge_api_url: str = "http://localhost:8000/v1"
    #: model name sent to the judge; "" = the first id listed by ``<judge_api_url>/models``
    judge_model: str = ""
    #: prefer the env var SERL_JUDGE_API_KEY (or OPENAI_API_KEY). A key given here is moved out
    #: of the config object when it is built (the field then reads "<redacted>"), so config
    #: dumps and logs never contain it; it is not restored on --resume: set the env var then
    judge_api_key: str = ""
    #: seconds per request attempt, and retries of a failed attempt (timeout / connection / 5xx)
    judge_timeout: float = 180.0
    judge_request_retries: int = 2
    #: seconds for all judge calls of one iteration; unfinished calls fall back (never a hang)
    judge_batch_timeout: float = 900.0
    judge_max_tokens: int = 4096
    #: retry budget when the judge ran out of tokens while reasoning (empty answer)
    judge_retry_max_tokens: int = 8192
    judge_temperature: float = 0.0
    #: sent as ``chat_template_kwargs.enable_thinking``; null = not sent (api.openai.com)
    judge_enable_thinking: Optional[bool] = False
    judge_max_concurrency: int = 32
    #: true: a failed judge call raises; false: that trajectory gets no context (counted in
    #: ``serl/judge_failure_fraction``, warned once per iteration)
    judge_request_strict: bool = False
    #: add the final immediate feedback to the judge's outcome summary
    judge_include_feedback: bool = True
    #: also call the judge on evaluation rollouts (the original did)
    judge_on_validation: bool = False
    #: per-row JSONL of student/teacher texts under ``<run>/teacher/<iteration>.jsonl``;
    #: off by default (the original wrote every row every step)
    dump_teacher_log: bool = False
    teacher_log_every_n_steps: int = 1
    #: cut each logged text to this many characters (0 = no cap)
    teacher_log_max_text_chars: int = 0
    #: rows logged per iteration, sampled with a seed = the iteration (0 = all rows)
    teacher_log_sample_rows: int = 16

    #: process-local home of a judge key given in the config (see ``judge_api_key``); a plain
    #: class attribute, not a config field
    _secret_store = {}

    def __post_init__(self) -> None:
        if self.judge_api_key and self.judge_api_key != "<redacted>":
            SerlConfig._secret_store["judge_api_key"] = self.judge_api_key
            self.judge_api_key = "<redacted>"

    def configured_judge_api_key(self) -> str:
        """The judge API key given in the config (the value behind ``"<redacted>"``), or ``""``
        (then :func:`serl.hindsight.judge.resolve_api_key` falls back to the environment)."""
        if self.judge_api_key and self.judge_api_key != "<redacted>":
            return self.judge_api_key
        return SerlConfig._secret_store.get("judge_api_key", "")

    def validate(self) -> None:
        """Check the ``algorithm.serl.*`` ranges that hold whatever the mode (called by
        :meth:`Config.validate`, before any model loads). The names ``sampling_mode``,
        ``trajectory_format`` and ``success_source``, and the judge keys of a judge mode, are
        checked by :func:`serl.hindsight.modes.check_config` (the mode registry owns them).

        Raises:
            ConfigError: the first bad value; the message names the full key.
        """

        def check(cond: bool, key: str, msg: str) -> None:
            _check(cond, f"algorithm.serl.{key}", msg)

        check(0.0 <= self.mixing_lambda <= 1.0, "mixing_lambda", f"must be in [0, 1], got {self.mixing_lambda}")
        check(self.lambda_decay_steps >= 0, "lambda_decay_steps", "must be >= 0")
        check(math.isfinite(self.success_reward_threshold), "success_reward_threshold",
              f"must be finite, got {self.success_reward_threshold}")
        check(self.teacher_sync_interval >= 0, "teacher_sync_interval", "must be >= 0 (0 = never re-sync)")
        check(self.max_reprompt_len >= 0, "max_reprompt_len", "must be >= 0 (0 = data.max_prompt_length)")
        check(0.0 <= self.weight_clip < 1.0, "weight_clip", f"must be in [0, 1), got {self.weight_clip}")
        check(self.reprompt_truncation in ("privileged", "right"), "reprompt_truncation", "must be 'privileged' or 'right'")
        check(self.student_logprob in ("current", "old"), "student_logprob", "must be 'current' or 'old'")
        check(self.max_traj_context_steps >= 0, "max_traj_context_steps", "must be >= 0 (0 = all steps)")
        check(self.max_future_context_steps >= 0, "max_future_context_steps", "must be >= 0 (0 = all steps)")
        check(self.success_buffer_per_task >= 1, "success_buffer_per_task", "must be >= 1")
        check(self.success_buffer_max_tasks >= 1, "success_buffer_max_tasks", "must be >= 1")
        if self.anchor_enable_similarity:
            t = self.anchor_similarity_thresh
            check(0.0 < t < 1.0, "anchor_similarity_thresh", f"must be strictly inside (0, 1), got {t}")
            bk = self.anchor_similarity_backend
            check(bk in ("rapidfuzz", "difflib"), "anchor_similarity_backend", f"must be rapidfuzz or difflib, got {bk!r}")
        check(self.teacher_log_every_n_steps >= 1, "teacher_log_every_n_steps", "must be >= 1")
        check(self.teacher_log_max_text_chars >= 0, "teacher_log_max_text_chars", "must be >= 0 (0 = no cap)")
        check(self.teacher_log_sample_rows >= 0, "teacher_log_sample_rows", "must be >= 0 (0 = no cap)")


@dataclass
class GiGPOConfig:
    """GiGPO step-level advantage (arXiv 2505.10978; verl-agent ``algorithm.gigpo.*``,
    ``langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py``)."""

    #: ω in A = A^E + ω·A^S (paper: 1.0)
    step_advantage_w: float = 1.0
    #: mean_norm (A = R − μ; paper "w/o std") | mean_std_norm (÷ (σ + 1e-6)); both terms
    mode: str = "mean_norm"
    #: cluster anchor observations by similarity instead of exact equality
    enable_similarity: bool = False
    #: strictly inside (0, 1)
    similarity_thresh: float = 0.95
    #: rapidfuzz (ours: Indel ratio = fuzz.ratio/100) | difflib (the original SequenceMatcher)
    similarity_backend: str = "rapidfuzz"

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``algorithm.gigpo.<key>``. ``mode`` and
        ``similarity_backend`` are checked by :func:`serl.algos.advantages.check_config`."""
        _check(0.0 < self.similarity_thresh < 1.0, "algorithm.gigpo.similarity_thresh", "must be strictly inside (0, 1)")
        _check(math.isfinite(self.step_advantage_w), "algorithm.gigpo.step_advantage_w",
               f"must be finite, got {self.step_advantage_w}")


@dataclass
class SpearConfig:
    """SPEAR self-imitation replay (arXiv 2509.22601;
    ``TencentYoutuResearch/SPEAR@7e84315:verl-agent``). SPEAR's
    ``actor_rollout_ref.actor.<key>`` lives at ``algorithm.spear.<key>``."""

    enable_trajectory_replay: bool = False
    #: the buffer is "full" when its counted size exceeds 1.5 × this; also caps a replay batch
    trajectory_buffer_size: int = 2048
    #: g_mean values kept in the FIFO baseline history (P50 recalibration)
    baseline_buffer_size: int = 10240
    #: entries older than this many steps (vs trajectory_staleness_reference) are dropped.
    #: The original silently capped it at 10; here the value is used as given
    trajectory_tolerate_steps: int = 10
    #: newest_entry (the original: age vs the newest buffer entry) | current_step (age vs the
    #: global step: nothing older than tolerate_steps survives gaps without admissions)
    trajectory_staleness_reference: str = "newest_entry"
    #: <= 0 or > 1: P50-baseline recalibration (SPEAR scripts: -1); in (0, 1]: multiply the
    #: stored advantages by it (yaml default 0.1)
    weight_decay_trajectory_replay: float = 0.1
    #: admit a sample when its on-policy advantage is > this. Dead in the original (which
    #: admits A > 0 whatever the yaml's 1 says); 0.0 reproduces it
    trajectory_score_threshold: float = 0.0
    #: P50 replay keeps rows whose recalibrated advantage is >= 0 (SPEAR's verl-agent tree);
    #: true = > 0 only (SPEAR's math tree, ``ray_trainer_hybrid.py``)
    replay_keep_strictly_positive: bool = False
    #: c and T of the cosine-warmed replay coefficient γ_t (SPEAR, arXiv 2509.22601)
    replay_loss_coef: float = 0.001
    max_replay_loss_steps: int = 200

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``algorithm.spear.<key>``.
        ``trajectory_staleness_reference`` is checked by :func:`serl.algos.spear.check_config`."""
        _check(self.trajectory_buffer_size >= 1, "algorithm.spear.trajectory_buffer_size", "must be >= 1")
        _check(self.baseline_buffer_size >= 1, "algorithm.spear.baseline_buffer_size", "must be >= 1")
        _check(self.trajectory_tolerate_steps >= 0, "algorithm.spear.trajectory_tolerate_steps", "must be >= 0")
        _check(math.isfinite(self.replay_loss_coef) and self.replay_loss_coef >= 0, "algorithm.spear.replay_loss_coef",
               f"must be finite and >= 0, got {self.replay_loss_coef}")
        for key in ("weight_decay_trajectory_replay", "trajectory_score_threshold"):
            v = getattr(self, key)
            _check(math.isfinite(v), f"algorithm.spear.{key}", f"must be finite, got {v}")


@dataclass
class FilterGroupsConfig:
    """Dynamic sampling (DAPO, arXiv 2503.14476; verl-agent's ``algorithm.filter_groups``): play
    more batches of tasks until ``data.train_batch_size`` groups whose episodes differ in ``metric``
    are kept (:mod:`serl.algos.dynamic_sampling`)."""

    enable: bool = False
    #: what must differ within a kept group: episode_reward (verl-agent) | won (DAPO's ``acc``)
    metric: str = "episode_reward"
    #: cap on the batches played per iteration; the last one goes in unfiltered. verl-agent's
    #: yaml default 0 would play nothing, so here it must be >= 1
    max_num_gen_batches: int = 10
    #: keep only the first data.train_batch_size kept groups (verl's DAPO recipe); false keeps
    #: them all, as verl-agent does (an update may then hold more groups)
    trim: bool = False

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``algorithm.filter_groups.<key>``. ``metric`` is
        checked by :func:`serl.algos.dynamic_sampling.check_config`."""
        _check(self.max_num_gen_batches >= 1, "algorithm.filter_groups.max_num_gen_batches", "must be >= 1")


@dataclass
class AlgorithmConfig:
    #: advantage estimator registry name: grpo, ...
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = True
    #: pool all step rows of a group in GRPO statistics (verl-agent default);
    #: False = one value per trajectory
    compute_mean_std_cross_steps: bool = True
    #: discount γ of GiGPO's step returns (arXiv 2505.10978; GiGPO recipes 0.95)
    gamma: float = 1.0
    gigpo: GiGPOConfig = field(default_factory=GiGPOConfig)
    #: SPEAR intrinsic tool-call reward (arXiv 2509.22601): none | constant | cosine, or SPEAR's
    #: Qwen3 reward constant_qwen3 | cosine_qwen3 (a correct answer with a tool call gets the full ratio)
    use_toolcall_reward: str = "none"
    #: T_tool: the cosine bonus decays to 0 over this many global steps (yaml 100, SPEAR 200)
    max_toolcall_steps: int = 100
    #: Dr.BoT response filters (SPEAR, arXiv 2509.22601): a flagged row's response_mask is zeroed
    filter_overlong_responses: bool = False
    filter_incomplete_responses: bool = False
    filter_repetitive_responses: bool = False
    filter_unreadable_responses: bool = False
    spear: SpearConfig = field(default_factory=SpearConfig)
    serl: SerlConfig = field(default_factory=SerlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``algorithm.<key>``; validates the ``gigpo``,
        ``spear`` and ``serl`` subsections too. ``adv_estimator`` is checked by
        :func:`serl.algos.advantages.check_config`, ``use_toolcall_reward`` by
        :func:`serl.algos.spear.check_config`."""
        _check(0.0 <= self.gamma <= 1.0, "algorithm.gamma", f"must be in [0, 1], got {self.gamma}")
        _check(self.max_toolcall_steps > 0, "algorithm.max_toolcall_steps", "must be > 0")
        self.gigpo.validate()
        self.spear.validate()
        self.serl.validate()
        self.filter_groups.validate()
