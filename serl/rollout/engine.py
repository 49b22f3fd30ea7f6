"""Rollout engines: sample responses for a batch of prompt token ids.

``hf`` (the only engine so far) runs transformers ``generate`` batched with left padding on the
policy's own weights (on CPU, bf16 HF generate is the fastest batched path with exact
log-probs). Engines are registered in :data:`ENGINE_REGISTRY`; :func:`make_engine` builds one
by name, and ``auto`` picks the fastest available for the device (:func:`resolve_engine_name`).
A vLLM engine for GPUs would implement the same :class:`RolloutEngine` protocol and register
itself with a higher ``priority``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class SamplingParams:
    """Sampling settings of one ``generate`` call.

    Attributes:
        max_new_tokens: response length cap (tokens).
        temperature: > 0; ignored when ``do_sample`` is False (greedy).
        top_p: nucleus mass in (0, 1].
        top_k: -1 = off.
        do_sample: False = greedy decoding.
        seed: if set, the torch RNG is seeded before sampling (reproducible evaluation).
    """

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    seed: int | None = None


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Sample one response per prompt; returns the response ids (EOS included if sampled,
        no padding), in the order of ``prompts``."""
        ...


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

    Prompts are sorted by length before batching so each micro-batch carries little padding;
    results come back in the caller's order. A static cache and a compiled decode step were
    measured against the default on CPU (``benchmarks/throughput.py``, BENCHMARKS.md) and are
    off by default: with serl's decode attention (models loaded by ``serl.models.loading``), a
    batch-8 bf16 decode step with ~700 cached tokens took 95 CPU-ms with the dynamic cache and
    147 with the static one, whose attention spans the whole preallocated length.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, micro_batch_size: int = 32,
                 cache_implementation: Optional[str] = None, compile_decode: bool = False):
        if compile_decode and cache_implementation != "static":
            raise ValueError("compile_decode needs cache_implementation='static' (a compilable cache)")
        self.model = model
        self.tokenizer = tokenizer
        self.micro_batch_size = max(1, micro_batch_size)
        self.cache_implementation = cache_implementation
        self.compile_decode = compile_decode
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = self._eos_ids(model, tokenizer)

    @staticmethod
    def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
        ids = {tokenizer.eos_token_id}
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
        finally:
            self.model.train(was_training)
        return out  # type: ignore[return-value]

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
        build: ``build(model, tokenizer, micro_batch_size)`` → a :class:`RolloutEngine`.
        available: ``available(device)`` → True if the engine can run on ``device`` here
            (its package installed, the device supported).
        priority: ``auto`` takes the available engine with the highest priority (the fastest
            measured on that device kind).
    """

    build: Callable[..., RolloutEngine]
    available: Callable[[str], bool]
    priority: int


#: name → :class:`EngineSpec`; ``hf`` runs everywhere
ENGINE_REGISTRY: dict[str, EngineSpec] = {
    "hf": EngineSpec(build=lambda model, tokenizer, micro_batch_size: HFEngine(model, tokenizer, micro_batch_size),
                     available=lambda device: True, priority=0),
}


def resolve_engine_name(name: str, device: str) -> str:
    """The engine that ``name`` means on ``device``: ``auto`` = the available registered engine
    with the highest priority; any other name is returned as is.

    Raises:
        ValueError: an unknown name, or a named engine not available on ``device``.
    """
    if name == "auto":
        ok = [(spec.priority, n) for n, spec in ENGINE_REGISTRY.items() if spec.available(device)]
        return max(ok)[1]
    if name not in ENGINE_REGISTRY:
        raise ValueError(f"unknown rollout engine {name!r}; valid: {['auto', *ENGINE_REGISTRY]}")
    if not ENGINE_REGISTRY[name].available(device):
        raise ValueError(f"rollout engine {name!r} is not available on device {device!r}")
    return name


def make_engine(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, micro_batch_size: int,
                device: str) -> tuple[RolloutEngine, str]:
    """Build the rollout engine ``name`` (or ``auto``) for ``device``.

    Returns:
        ``(engine, resolved_name)``.

    Raises:
        ValueError: see :func:`resolve_engine_name`.
    """
    resolved = resolve_engine_name(name, device)
    return ENGINE_REGISTRY[resolved].build(model, tokenizer, micro_batch_size), resolved
