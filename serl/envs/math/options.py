"""The math env's options (``env.math.*``, ``env.sandbox.*``, the math splits), their defaults, and
their check when a config is loaded.

Registered as the ``math`` env's config check (``serl.envs.base.ENV_CONFIG_CHECKS``), so
:func:`serl.envs.base.check_config` runs :func:`check_config` when ``env.name=math``, before any
model, data file or sandbox is touched. Imports no model code; :mod:`serl.sandbox` and
:mod:`serl.envs.math.data` are light.

Defaults are serl's CPU scale (a 135M model on 2 cores); the original's values
(SPEAR's math recipe, ``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/``, on
``volcengine/verl``'s tool agent loop) are named next to each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from serl.envs.math.data import DATASETS, PROMPT_STYLES
from serl.envs.math.scoring import SCORERS
from serl.errors import ConfigError
from serl.sandbox import PRELUDES, SANDBOX_BACKENDS
from serl.sandbox.messages import MODES as TOOL_MESSAGE_MODES

if TYPE_CHECKING:
    from serl.config import EnvConfig

TRUNCATE_SIDES = ("middle", "left", "right")

#: ``env.math`` keys and their defaults (the original's value in the comment)
MATH_DEFAULTS: dict[str, Any] = {
    # "spear": the question + SPEAR's \boxed{} answer format (the original) | "plain": the question
    "prompt_style": "spear",
    # "" = the dataset's default (gsm8k: normalized; math500, aime, dapo: math_verify) | strict
    # (SPEAR's exact last-\boxed{} match) | normalized | math_verify
    "scorer": "",
    # assistant turns per episode, so at most max_turns - 1 executed tool calls (SPEAR: 8)
    "max_turns": 4,
    # new tokens per assistant turn; 0 = only the response budget data.max_response_length limits
    # a turn (SPEAR: 0, budget 16384 or 4096)
    "max_turn_tokens": 160,
    # characters of one tool output the model sees (SPEAR: 16384) ...
    "tool_response_max_chars": 256,
    # ... cut in the middle (SPEAR), or keeping the head (left) or the tail (right)
    "tool_response_truncate_side": "middle",
    # "original": SPEAR's tool messages (stderr hides stdout) | "stdout_and_stderr": serl's fix
    "tool_message_mode": "original",
    # a <tool_call> whose JSON does not parse: false = the episode ends silently (SPEAR); true =
    # the model is told so in a tool turn and the episode goes on
    "malformed_call_feedback": False,
    # training problems kept: those whose GSM8K worked solution has at most this many calculator
    # steps (<<a*b=c>> annotations); 0 = all (the original). A curriculum for a weak policy: it
    # applies to env.train_split only (a GSM8K split), never to the evaluation split
    "max_solution_steps": 0,
}

_TYPES: dict[str, tuple[type, ...]] = {
    "prompt_style": (str,), "scorer": (str,), "max_turns": (int,), "max_turn_tokens": (int,),
    "tool_response_max_chars": (int,), "tool_response_truncate_side": (str,), "tool_message_mode": (str,),
    "malformed_call_feedback": (bool,), "max_solution_steps": (int,),
}


def math_options(env_cfg: "EnvConfig") -> dict[str, Any]:
    """``env.math`` over :data:`MATH_DEFAULTS` (no check; :func:`check_config` checks)."""
    return {**MATH_DEFAULTS, **dict(env_cfg.math or {})}


def parse_split(split: str) -> tuple[str, str]:
    """A math split name as ``(dataset, split)``: ``"gsm8k:train"`` -> ``("gsm8k", "train")``; a bare
    dataset name takes its only split, or ``test`` (``"math500"`` -> ``("math500", "test")``).

    Raises:
        ConfigError: unknown dataset or split; the message lists the valid names.
    """
    dataset, sep, part = str(split).partition(":")
    spec = DATASETS.get(dataset)
    if spec is None:
        raise ConfigError(f"unknown math split {split!r}: dataset {dataset!r} is not one of {sorted(DATASETS)} "
                          "(write DATASET:SPLIT, e.g. gsm8k:train)")
    if not sep:
        part = next(iter(spec.files)) if len(spec.files) == 1 else "test"
    if part not in spec.files:
        raise ConfigError(f"unknown math split {split!r}: {dataset} has splits {sorted(spec.files)}")
    return dataset, part


def check_config(env_cfg: "EnvConfig") -> None:
    """Check ``env.math.*`` (known keys, types, ranges, names), ``env.sandbox.backend`` /
    ``prelude`` / ``url`` and the math splits ``env.train_split`` / ``env.eval_split``.

    Raises:
        ConfigError: naming the key (``env.math.max_turns: must be >= 1, got 0``).
    """
    unknown = sorted(set(env_cfg.math or {}) - set(MATH_DEFAULTS))
    if unknown:
        raise ConfigError(f"env.math.{unknown[0]}: unknown option; valid: {sorted(MATH_DEFAULTS)}")
    opts = math_options(env_cfg)
    for key, types in _TYPES.items():
        v = opts[key]
        if not isinstance(v, types) or (types == (int,) and isinstance(v, bool)):
            raise ConfigError(f"env.math.{key}: must be {types[0].__name__}, got {v!r}")
    choices = {"prompt_style": PROMPT_STYLES, "tool_response_truncate_side": TRUNCATE_SIDES,
               "tool_message_mode": TOOL_MESSAGE_MODES}
    for key, valid in choices.items():
        if opts[key] not in valid:
            raise ConfigError(f"env.math.{key}: must be one of {list(valid)}, got {opts[key]!r}")
    if opts["scorer"] and opts["scorer"] not in SCORERS:
        raise ConfigError(f"env.math.scorer: must be one of {list(SCORERS)} or '' (the dataset's default), "
                          f"got {opts['scorer']!r}")
    if opts["max_turns"] < 1:
        raise ConfigError(f"env.math.max_turns: must be >= 1, got {opts['max_turns']}")
    if opts["max_turn_tokens"] < 0:
        raise ConfigError(f"env.math.max_turn_tokens: must be >= 0 (0 = only the response budget), "
                          f"got {opts['max_turn_tokens']}")
    if opts["tool_response_max_chars"] < 1:
        raise ConfigError(f"env.math.tool_response_max_chars: must be >= 1, got {opts['tool_response_max_chars']}")
    if opts["max_solution_steps"] < 0:
        raise ConfigError(f"env.math.max_solution_steps: must be >= 0 (0 = all problems), got {opts['max_solution_steps']}")
    if opts["max_solution_steps"] and str(env_cfg.train_split).partition(":")[0] != "gsm8k":
        raise ConfigError(f"env.math.max_solution_steps: counts GSM8K's annotated solution steps, but "
                          f"env.train_split is {env_cfg.train_split!r}; set it to 0 or train on gsm8k:train")
    sb = env_cfg.sandbox
    if sb.backend not in SANDBOX_BACKENDS:
        raise ConfigError(f"env.sandbox.backend: must be one of {sorted(SANDBOX_BACKENDS)}, got {sb.backend!r}")
    if sb.prelude not in PRELUDES:
        raise ConfigError(f"env.sandbox.prelude: must be one of {sorted(PRELUDES)}, got {sb.prelude!r}")
    if sb.backend == "sandbox_fusion" and not sb.url:
        raise ConfigError("env.sandbox.url: the sandbox_fusion backend needs the server's run_code URL, "
                          "e.g. env.sandbox.url=http://127.0.0.1:8080/run_code")
    for key in ("train_split", "eval_split"):
        try:
            parse_split(getattr(env_cfg, key))
        except ConfigError as e:
            raise ConfigError(f"env.{key}: {e}") from None
