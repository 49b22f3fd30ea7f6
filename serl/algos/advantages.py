"""Advantage estimators over step rows, in a registry (verl ``core_algos`` style).

Every estimator has the signature::

    fn(data: AdvantageInput, cfg: AlgorithmConfig) -> torch.Tensor  # [rows]

and returns one advantage per step row; the trainer broadcasts it over the row's response
tokens, as verl-agent's ``compute_grpo_outcome_advantage`` does
(``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``). Estimators are pure functions of tensors and integer
index arrays, so they are tested on hand-computed cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Hashable, Optional, Sequence

import torch

from serl.algos.anchor_states import SIMILARITY_BACKENDS, anchor_group_sizes, anchor_groups  # noqa: F401 (re-exported)
from serl.errors import ConfigError

if TYPE_CHECKING:
    from serl.config import AlgorithmConfig, GiGPOConfig

ADVANTAGE_REGISTRY: dict[str, Callable] = {}
#: estimator name -> ``prepare(data, cfg) -> metrics``: run once per batch before the estimator
ADVANTAGE_PREPARE: dict[str, Callable] = {}


def register_advantage(name: str, prepare: Optional[Callable] = None):
    """Decorator registering an advantage estimator under ``name`` (``algorithm.adv_estimator``).
    ``prepare(data, cfg)``, if given, fills what the estimator and its metrics share (GiGPO's
    anchor groups) and returns the estimator's own metrics; see :func:`prepare_advantage_input`."""

    def deco(fn):
        ADVANTAGE_REGISTRY[name] = fn
        if prepare is not None:
            ADVANTAGE_PREPARE[name] = prepare
        return fn

    return deco


def prepare_advantage_input(name: str, data: "AdvantageInput", cfg: "AlgorithmConfig") -> dict[str, float]:
    """Run estimator ``name``'s ``prepare`` hook on ``data`` (in place) once per batch and return its
    metrics; ``{}`` for an estimator without one. The trainer calls it before the estimator."""
    prepare = ADVANTAGE_PREPARE.get(name)
    return prepare(data, cfg) if prepare is not None else {}


def get_advantage_fn(name: str) -> Callable:
    """Return the estimator ``name``; raises ``KeyError`` listing the valid names."""
    if name not in ADVANTAGE_REGISTRY:
        raise KeyError(f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGE_REGISTRY)}")
    return ADVANTAGE_REGISTRY[name]


#: estimators that need one row per env step (GiGPO: its step groups are anchor states, which a
#: one-row-per-trajectory layout lacks); :func:`serl.configure.check_config` checks the env's layout
STEP_ROW_ESTIMATORS = frozenset({"gigpo"})


def check_config(alg: "AlgorithmConfig") -> None:
    """Check the ``algorithm`` names this module owns: ``adv_estimator`` (in the registry),
    ``gigpo.mode`` and ``gigpo.similarity_backend``. Called by :func:`serl.configure.check_config`.

    Raises:
        ConfigError: ``"algorithm.<key>: unknown ...; valid: [...]"`` for the first unknown name.
    """
    g = alg.gigpo
    if alg.adv_estimator not in ADVANTAGE_REGISTRY:
        raise ConfigError(f"algorithm.adv_estimator: unknown estimator {alg.adv_estimator!r}; "
                          f"valid: {sorted(ADVANTAGE_REGISTRY)}")
    if g.mode not in GIGPO_MODES:
        raise ConfigError(f"algorithm.gigpo.mode: unknown mode {g.mode!r}; valid: {list(GIGPO_MODES)}")
    if g.similarity_backend not in SIMILARITY_BACKENDS:
        raise ConfigError(f"algorithm.gigpo.similarity_backend: unknown backend {g.similarity_backend!r}; "
                          f"valid: {list(SIMILARITY_BACKENDS)}")


@dataclass
class AdvantageInput:
    """Per-row inputs of an advantage estimator (all tensors have shape ``[rows]``).

    Attributes:
        scores: scalar score of each row: the episode reward (+ shaping such as SPEAR's tool-call
            bonus) minus the invalid-action penalty of that row (verl-agent's episode reward manager and
            ``apply_invalid_action_penalty``, ``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/ray_trainer.py``).
        group_index: integer id of the row's group (``uid``).
        traj_index: integer id of the row's trajectory (``traj_uid``).
        step_rewards: env reward of each row's own step, ``[rows]`` (GiGPO's discounted returns).
        step_index: 0-based step id of each row inside its trajectory.
        anchor_index: integer id of the row's anchor-state group (GiGPO), or None.
        invalid: bool, row's action failed the format check.
        step_returns: optional precomputed discounted step return ``R_t`` of each row, ``[rows]``
            float, built from the raw env rewards *before* any row was dropped (verl-agent computes them
            right after the rollout, before any filter; ``langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py``; see
            :func:`discounted_step_returns`). GiGPO uses it instead of recomputing from
            ``step_rewards`` — required whenever the group std filter (SPEAR's Dr.BoT, arXiv 2509.22601) dropped rows,
            since a dropped terminal step would otherwise erase its trajectory's returns.
        penalty: optional ``[rows]`` float >= 0: the invalid-action penalty that was already
            subtracted from ``scores`` (0 for valid rows; see :func:`invalid_action_penalty`).
            GiGPO subtracts it from that row's ``R_t`` too (``apply_invalid_action_penalty``). None = no penalty
            in ``R_t`` (pass it whenever ``actor.use_invalid_action_penalty`` is on).
        anchor_obs: optional list (length ``rows``) of the raw current observation of each row
            (``Step.observation``); GiGPO groups rows by it when ``anchor_index`` is None.
        response_length: optional ``[rows]`` number of unmasked response tokens of each row;
            the token weights of ``reinforce_plus_plus_baseline``'s batch whitening (1 per row
            when None).
    """

    scores: torch.Tensor
    group_index: torch.Tensor
    traj_index: torch.Tensor
    step_rewards: Optional[torch.Tensor] = None
    step_index: Optional[torch.Tensor] = None
    anchor_index: Optional[torch.Tensor] = None
    invalid: Optional[torch.Tensor] = None
    step_returns: Optional[torch.Tensor] = None
    penalty: Optional[torch.Tensor] = None
    anchor_obs: Optional[Sequence[Hashable]] = None
    response_length: Optional[torch.Tensor] = None


def group_mean_std(
    values: torch.Tensor, group_index: torch.Tensor, unit_index: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and unbiased std of ``values`` over the row's group.

    Args:
        values: ``[rows]`` float.
        group_index: ``[rows]`` int, the group of each row.
        unit_index: ``[rows]`` int or None. If given, each group's statistics use one value per
            distinct unit (the first row's value of each trajectory: episode-level GRPO);
            if None, every row counts (verl-agent ``compute_mean_std_cross_steps=True``).

    Returns:
        ``(mean, std)``, each ``[rows]`` float32. A group with a single value gets mean 0 and
        std 1 (verl-agent's ``compute_grpo_outcome_advantage``, ``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``).

    The statistics are computed in float64 and cast back: the float32 mean of ``n`` identical
    values can miss the value by ~1e-8, which ``/ (std + 1e-6)`` turns into an advantage of
    ~1e-2 for a group whose rows all scored the same. In float64 the mean of identical float32
    values is exact, so such a group gets advantage exactly 0.
    """
    vals = values.to(torch.float64)
    mean = torch.zeros(vals.shape[0], dtype=torch.float64)
    std = torch.ones(vals.shape[0], dtype=torch.float64)
    for g in torch.unique(group_index):
        rows = (group_index == g).nonzero(as_tuple=True)[0]
        if unit_index is None:
            pool = vals[rows]
        else:
            seen: dict[int, float] = {}
            for r in rows.tolist():
                seen.setdefault(int(unit_index[r]), float(vals[r]))
            pool = torch.tensor(list(seen.values()), dtype=torch.float64)
        if pool.numel() > 1:
            mean[rows] = pool.mean()
            std[rows] = pool.std(unbiased=True)
    return mean.to(torch.float32), std.to(torch.float32)


@register_advantage("grpo")
def grpo_advantage(data: AdvantageInput, cfg: AlgorithmConfig) -> torch.Tensor:
    """GRPO outcome advantage over step rows (GRPO, arXiv 2402.03300; multi-turn form of
    verl-agent's ``compute_grpo_outcome_advantage``, ``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``, which SERL, arXiv 2605.19447, uses unchanged).

    ``A_i = (R_i - mean_g) / (std_g + 1e-6)`` with ``norm_adv_by_std_in_grpo``, else
    ``A_i = R_i - mean_g`` (Dr.GRPO). Statistics pool every step row of the group
    (``compute_mean_std_cross_steps=True``, the verl-agent default) or one value per trajectory.

    Args:
        data: ``scores``, ``group_index``, ``traj_index`` ``[rows]``.
        cfg: the ``algorithm`` config section.

    Returns:
        ``[rows]`` float32 advantages.
    """
    unit = None if cfg.compute_mean_std_cross_steps else data.traj_index
    mean, std = group_mean_std(data.scores.float(), data.group_index, unit)
    adv = data.scores.float() - mean
    if cfg.norm_adv_by_std_in_grpo:
        adv = adv / (std + 1e-6)
    return adv


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def _pooled_values(
    values: torch.Tensor, group_index: torch.Tensor, unit_index: Optional[torch.Tensor]
) -> tuple[dict[int, list[int]], dict[int, torch.Tensor]]:
    """Rows of each group and the pool of values its statistics use.

    The pool is every row's value (``unit_index`` None: verl-agent's cross-step statistics) or
    the first row's value of each distinct unit (trajectory), exactly as
    :func:`group_mean_std`. Returns ``(rows_by_group, pool_by_group)``, keyed by group id; the
    pools are float64 (see :func:`group_mean_std` for why).
    """
    rows_by_group: dict[int, list[int]] = {}
    for r, g in enumerate(group_index.tolist()):
        rows_by_group.setdefault(int(g), []).append(r)
    pools: dict[int, torch.Tensor] = {}
    vals = values.to(torch.float64)
    for g, rows in rows_by_group.items():
        if unit_index is None:
            pools[g] = vals[rows]
        else:
            seen: dict[int, float] = {}
            for r in rows:
                seen.setdefault(int(unit_index[r]), float(vals[r]))
            pools[g] = torch.tensor(list(seen.values()), dtype=torch.float64)
    return rows_by_group, pools


def _check_rows(data: AdvantageInput) -> int:
    """Number of rows; raises ``ValueError`` if the per-row tensors disagree in length."""
    n = int(data.scores.shape[0])
    for name in ("group_index", "traj_index", "step_rewards", "step_index", "anchor_index",
                 "step_returns", "penalty", "response_length"):
        t = getattr(data, name)
        if t is not None and int(t.shape[0]) != n:
            raise ValueError(f"AdvantageInput.{name} has {int(t.shape[0])} rows, scores has {n}")
    if data.anchor_obs is not None and len(data.anchor_obs) != n:
        raise ValueError(f"AdvantageInput.anchor_obs has {len(data.anchor_obs)} rows, scores has {n}")
    return n


def invalid_action_penalty(invalid: torch.Tensor, coef: float, enabled: bool = True) -> torch.Tensor:
    """Per-row invalid-action penalty (``actor.invalid_action_penalty_coef``; verl-agent's
    ``apply_invalid_action_penalty``, ``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/ray_trainer.py``).

    Args:
        invalid: ``[rows]`` bool, the row's action failed the format check
            (``not Step.action_valid``).
        coef: penalty in reward units (0.1 in every recipe).
        enabled: ``actor.use_invalid_action_penalty``; False gives zeros.

    Returns:
        ``[rows]`` float32 ``coef · invalid`` (>= 0). The trainer subtracts it from the row's
        scalar score (``AdvantageInput.scores``) and passes it as ``AdvantageInput.penalty`` so
        GiGPO also subtracts it from that row's step return ``R_t``. It touches only that row:
        no propagation to earlier steps' returns or to the trajectory's other rows.
    """
    if not enabled:
        return torch.zeros(invalid.shape[0], dtype=torch.float32)
    return invalid.to(torch.float32) * float(coef)


# --------------------------------------------------------------------------------------------
# Dr.GRPO, RLOO, REINFORCE++-baseline (verl-agent's core_algos.py, same row structure)
# --------------------------------------------------------------------------------------------


@register_advantage("drgrpo")
def drgrpo_advantage(data: AdvantageInput, cfg: AlgorithmConfig) -> torch.Tensor:
    """Dr.GRPO: ``A_i = R_i − mean_g`` whatever ``norm_adv_by_std_in_grpo`` says (Dr.GRPO,
    arXiv 2503.20783; equal to ``grpo`` with ``algorithm.norm_adv_by_std_in_grpo=False``, the
    setting of SPEAR's Dr.BoT and SPEAR scripts, ``TencentYoutuResearch/SPEAR@7e84315:verl-agent/examples/grpo_trainer/run_alfworld_drbot.sh``). Statistics pool as in :func:`grpo_advantage`; a single-value group
    has mean 0, so its rows get ``A = R``.

    Returns:
        ``[rows]`` float32.
    """
    _check_rows(data)
    unit = None if cfg.compute_mean_std_cross_steps else data.traj_index
    mean, _ = group_mean_std(data.scores.float(), data.group_index, unit)
    return data.scores.float() - mean


@register_advantage("rloo")
def rloo_advantage(data: AdvantageInput, cfg: AlgorithmConfig) -> torch.Tensor:
    """RLOO, leave-one-out baseline (verl-agent's ``compute_rloo_outcome_advantage``, ``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``).

    ``A_i = n/(n−1) · (R_i − mean_g)`` = ``R_i − mean of the other n−1 pooled values``, with
    ``n`` the number of values pooled for the group: every step row of the group with
    ``algorithm.compute_mean_std_cross_steps=True`` (verl-agent default), else one value per
    trajectory. A group with a single value keeps ``A_i = R_i`` (verl: no baseline available).

    Args:
        data: ``scores``, ``group_index``, ``traj_index``, each ``[rows]``.
        cfg: the ``algorithm`` section (``compute_mean_std_cross_steps``).

    Returns:
        ``[rows]`` float32 advantages (reward units).
    """
    _check_rows(data)
    unit = None if cfg.compute_mean_std_cross_steps else data.traj_index
    rows_by_group, pools = _pooled_values(data.scores, data.group_index, unit)
    adv = data.scores.to(torch.float64)
    for g, rows in rows_by_group.items():
        n = pools[g].numel()
        if n > 1:
            adv[rows] = (adv[rows] - pools[g].mean()) * (n / (n - 1))
    return adv.to(torch.float32)


@register_advantage("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantage(data: AdvantageInput, cfg: AlgorithmConfig) -> torch.Tensor:
    """REINFORCE++ with a group baseline, whitened over the batch (verl-agent's
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``, ``langfengQ/verl-agent@d0b9724:verl/trainer/ppo/core_algos.py``).

    ``x_i = R_i − mean_g`` (pooling as :func:`grpo_advantage`; a single-value group has
    mean 0), then token-level whitening over the whole batch as verl's ``masked_whiten``:
    with token weights ``w_i`` = the row's response-token count
    (``data.response_length``; 1 per row if None), ``W = Σ w``,
    ``μ = Σ w·x / W``, ``var = Σ w·(x − μ)² / W · W/(W−1)`` (unbiased), and
    ``A_i = (x_i − μ) / sqrt(var + 1e-8)``. If ``W <= 1`` the variance is undefined and the
    advantage is ``x − μ`` (not scaled).

    Returns:
        ``[rows]`` float32 (dimensionless after whitening).
    """
    _check_rows(data)
    unit = None if cfg.compute_mean_std_cross_steps else data.traj_index
    mean, _ = group_mean_std(data.scores.float(), data.group_index, unit)
    # the whitening statistics in float64 too (see group_mean_std)
    x = data.scores.to(torch.float64) - mean.to(torch.float64)
    if data.response_length is None:
        w = torch.ones_like(x)
    else:
        w = data.response_length.to(torch.float64)
    total = float(w.sum())
    if total <= 0:
        return torch.zeros_like(x, dtype=torch.float32)
    mu = (w * x).sum() / total
    if total <= 1:
        return (x - mu).to(torch.float32)
    var = (w * (x - mu) ** 2).sum() / total * (total / (total - 1.0))
    return ((x - mu) * torch.rsqrt(var + 1e-8)).to(torch.float32)


# --------------------------------------------------------------------------------------------
# GiGPO (arXiv 2505.10978; langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py)
# --------------------------------------------------------------------------------------------

GIGPO_MODES = ("mean_norm", "mean_std_norm")


def discounted_step_returns(step_rewards: torch.Tensor, traj_index: torch.Tensor, gamma: float,
                            step_index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-step discounted return ``R_t = Σ_{k>=t} γ^{k−t} r_k`` inside each trajectory
    (GiGPO, arXiv 2505.10978 Eq. 5; ``langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py``; ``algorithm.gamma``).

    Args:
        step_rewards: ``[rows]`` float, the raw env reward of each row's own step (no SPEAR
            tool-call bonus, no invalid-action penalty: those enter elsewhere, as in verl-agent).
        traj_index: ``[rows]`` int, trajectory id of each row.
        gamma: discount γ in [0, 1].
        step_index: ``[rows]`` int, position of the row inside its trajectory; None = the rows
            of a trajectory appear in step order (verl-agent's batch order).

    Returns:
        ``[rows]`` float32 returns in reward units (ALFWorld: ``10·γ^{T−t}`` on a winning
        trajectory, else 0).

    Raises:
        ValueError: two rows of one trajectory share a ``step_index`` (e.g. rows duplicated to
            pad a batch), or ``gamma`` outside [0, 1].
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    rewards = step_rewards.to(torch.float32)
    out = torch.zeros_like(rewards)
    rows_by_traj: dict[int, list[int]] = {}
    for r, t in enumerate(traj_index.tolist()):
        rows_by_traj.setdefault(int(t), []).append(r)
    for t, rows in rows_by_traj.items():
        if step_index is not None:
            steps = [int(step_index[r]) for r in rows]
            if len(set(steps)) != len(steps):
                raise ValueError(f"trajectory {t} has duplicated step_index values {sorted(steps)}")
            rows = [r for _, r in sorted(zip(steps, rows))]
        running = 0.0
        for r in reversed(rows):
            running = float(rewards[r]) + gamma * running
            out[r] = running
    return out


def _cluster_mean_std(values: torch.Tensor, cluster: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and unbiased std over the row's cluster; a single-row cluster has mean =
    its own value and std 1 (GiGPO ``step_norm_reward``: its step advantage is 0). Computed in
    float64 and cast back to float32, as :func:`group_mean_std`."""
    vals = values.to(torch.float64)
    mean = vals.clone()
    std = torch.ones_like(mean)
    rows_by: dict[int, list[int]] = {}
    for r, c in enumerate(cluster.tolist()):
        rows_by.setdefault(int(c), []).append(r)
    for rows in rows_by.values():
        if len(rows) > 1:
            pool = vals[rows]
            mean[rows] = pool.mean()
            std[rows] = pool.std(unbiased=True)
    return mean.to(torch.float32), std.to(torch.float32)


def gigpo_step_returns(data: AdvantageInput, gamma: float) -> torch.Tensor:
    """``R_t`` used by GiGPO's step advantage: ``data.step_returns`` if given, else
    :func:`discounted_step_returns` of ``data.step_rewards``; minus ``data.penalty`` when given
    (as verl-agent's ``apply_invalid_action_penalty`` does to ``step_rewards``). ``[rows]`` float32.

    Raises:
        ValueError: neither ``step_returns`` nor ``step_rewards`` is given.
    """
    if data.step_returns is not None:
        ret = data.step_returns.to(torch.float32).clone()
    elif data.step_rewards is not None:
        ret = discounted_step_returns(data.step_rewards, data.traj_index, gamma, data.step_index)
    else:
        raise ValueError("gigpo needs AdvantageInput.step_returns or AdvantageInput.step_rewards")
    if data.penalty is not None:
        ret = ret - data.penalty.to(torch.float32)
    return ret


def gigpo_anchor_index(data: AdvantageInput, gigpo_cfg: GiGPOConfig) -> torch.Tensor:
    """The anchor-state group of every row (GiGPO, arXiv 2505.10978 Eq. 6): ``data.anchor_index`` if given,
    else :func:`anchor_groups` of ``data.anchor_obs`` inside each ``data.group_index`` — exact, or
    with ``gigpo_cfg.enable_similarity`` by ``similarity_thresh`` / ``similarity_backend``.

    The trainer calls it once and stores the result in ``data.anchor_index`` so that the step-group
    metrics and :func:`gigpo_advantage` share one clustering.

    Returns:
        ``[rows]`` long cluster ids.

    Raises:
        ValueError: neither ``anchor_index`` nor ``anchor_obs`` is given.
    """
    if data.anchor_index is not None:
        return data.anchor_index
    if data.anchor_obs is None:
        raise ValueError("gigpo needs AdvantageInput.anchor_index or AdvantageInput.anchor_obs")
    thresh = gigpo_cfg.similarity_thresh if gigpo_cfg.enable_similarity else None
    return torch.tensor(
        anchor_groups(list(data.anchor_obs), data.group_index.tolist(), thresh, backend=gigpo_cfg.similarity_backend),
        dtype=torch.long,
    )


def gigpo_prepare(data: AdvantageInput, cfg: AlgorithmConfig) -> dict[str, float]:
    """GiGPO's ``prepare`` hook: cluster the anchor states once (:func:`gigpo_anchor_index`, stored in
    ``data.anchor_index``, which :func:`gigpo_advantage` then reuses) and return the step-group metrics
    ``gigpo/{step_groups,size1_group_fraction,mean_group_size}`` (arXiv 2505.10978, appendix E)."""
    data.anchor_index = gigpo_anchor_index(data, cfg.gigpo)
    sizes = anchor_group_sizes(data.anchor_index.tolist())
    return {"gigpo/step_groups": float(len(sizes)), "gigpo/size1_group_fraction": sum(1 for k in sizes if k == 1) / len(sizes),
            "gigpo/mean_group_size": sum(sizes) / len(sizes)}


@register_advantage("gigpo", prepare=gigpo_prepare)
def gigpo_advantage(data: AdvantageInput, cfg: AlgorithmConfig) -> torch.Tensor:
    """GiGPO: episode-level plus anchor-state step-level relative advantage (GiGPO,
    arXiv 2505.10978 Eqs. 3, 5–8; ``langfengQ/verl-agent@d0b9724:gigpo/core_gigpo.py``).

    1. Episode term (Eq. 3): ``A^E = R − μ_g`` (``mean_norm``) or
       ``(R − μ_g)/(σ_g + 1e-6)`` (``mean_std_norm``), with ``R = data.scores`` and the same
       pooling and single-value rule as :func:`grpo_advantage`
       (``algorithm.compute_mean_std_cross_steps``). ``algorithm.gigpo.mode`` decides the std,
       not ``norm_adv_by_std_in_grpo``.
    2. Step returns (Eq. 5, less the invalid-action penalty): :func:`gigpo_step_returns` with ``algorithm.gamma``.
    3. Anchor groups (Eq. 6): ``data.anchor_index`` if given, else
       :func:`anchor_groups` of ``data.anchor_obs`` inside each ``group_index``, exact or, with
       ``algorithm.gigpo.enable_similarity``, by ``similarity_thresh`` / ``similarity_backend``.
    4. Step term (Eq. 7): within each anchor group ``A^S = R_t − μ_s`` or
       ``(R_t − μ_s)/(σ_s + 1e-6)`` (same ``mode``; unbiased σ); a single-row group gets 0.
    5. ``A = A^E + ω · A^S`` with ``ω = algorithm.gigpo.step_advantage_w`` (Eq. 8).

    Args:
        data: ``scores``, ``group_index``, ``traj_index`` and ``step_returns`` or
            ``step_rewards`` (+ ``step_index``), ``anchor_index`` or ``anchor_obs``, optional
            ``penalty``; all ``[rows]``.
        cfg: the ``algorithm`` section (``gamma``, ``gigpo.*``, ``compute_mean_std_cross_steps``).

    Returns:
        ``[rows]`` float32; the trainer broadcasts each over its row's response tokens.

    Raises:
        ValueError: unknown mode, missing step rewards, missing anchors, bad lengths.
    """
    _check_rows(data)
    gcfg = cfg.gigpo
    if gcfg.mode not in GIGPO_MODES:
        raise ValueError(f"algorithm.gigpo.mode: unknown mode {gcfg.mode!r}; valid: {list(GIGPO_MODES)}")
    use_std = gcfg.mode == "mean_std_norm"
    unit = None if cfg.compute_mean_std_cross_steps else data.traj_index
    mean, std = group_mean_std(data.scores.float(), data.group_index, unit)
    episode = data.scores.float() - mean
    if use_std:
        episode = episode / (std + 1e-6)

    returns = gigpo_step_returns(data, cfg.gamma)
    anchors = gigpo_anchor_index(data, gcfg)
    s_mean, s_std = _cluster_mean_std(returns, anchors)
    step = returns - s_mean
    if use_std:
        step = step / (s_std + 1e-6)
    return episode + float(gcfg.step_advantage_w) * step
