"""The models of a training run: :class:`PolicyModels` and :func:`load_models`.

Holds the tokenizer, the float32 policy (master weights), its rollout copy in the inference dtype,
SERL's frozen teacher and the KL reference, and the two things done to them between iterations:
re-syncing the rollout copy after an update, and naming what a checkpoint stores. Not here: the
optimizer and the update (:mod:`serl.train.update`), the process group (:mod:`serl.train.distributed`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Optional

import torch

from serl.config import Config
from serl.models.loading import load_causal_lm, load_tokenizer, pick_dtype, resolve_model_path
from serl.models.lora import POLICY_ADAPTER, AdapterView, adapter_scalings, apply_lora, merged_copy, merged_weights
from serl.models.teacher import AdapterReference, AdapterTeacher, Teacher
from serl.rollout.engine import sync_engine_weights
from serl.train.grad_ckpt import prepare_checkpointing


@dataclass
class PolicyModels:
    """The run's models (see the module docstring).

    Attributes:
        model_path: the resolved model folder.
        tokenizer: the policy's tokenizer.
        device: ``cpu`` or ``cuda``.
        infer_dtype: dtype of rollout, teacher and reference scoring (``model.dtype``).
        autocast_dtype: the update's autocast dtype (``model.train_dtype`` bf16), None = float32.
        policy: the trained model (fp32 master weights; with LoRA a PEFT model whose base is frozen).
        rollout_model: the model the hf engine samples from: a copy in ``infer_dtype``, or the policy.
        teacher: SERL's lagged teacher (SERL on), else None.
        ref: the frozen KL reference θ0 (``actor.use_kl_loss``), else None; never checkpointed.
        lora: the policy is a LoRA adapter on a frozen base (``model.lora.r > 0``).
        lora_scalings: with LoRA and ``rollout.merge_lora``, the policy's
            :func:`~serl.models.lora.adapter_scalings` (the rollout model is then a merged copy).
    """

    model_path: str
    tokenizer: Any
    device: str
    infer_dtype: torch.dtype
    autocast_dtype: Optional[torch.dtype]
    policy: Any
    rollout_model: Any
    teacher: Optional[Any]
    ref: Optional[Any]
    lora: bool = False
    lora_scalings: Optional[dict[str, float]] = None

    def autocast(self):
        """The update's autocast context (a no-op in float32)."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device, dtype=self.autocast_dtype)

    def checkpointed(self) -> tuple[Any, Any]:
        """What a checkpoint holds of the models: ``(policy, teacher or None)``; with LoRA the
        policy adapter and the teacher adapter only (:class:`AdapterView`), never the base."""
        teacher = self.teacher.model if self.teacher else None
        if self.lora:
            return AdapterView(self.policy, POLICY_ADAPTER), teacher
        return self.policy, teacher

    @torch.no_grad()
    def sync_rollout_model(self, full_parameters, engine) -> None:
        """Copy the policy into the rollout model (if it is a copy), then let the engine take the
        weights (vLLM: pushed in memory, :func:`~serl.rollout.engine.sync_engine_weights`).
        ``full_parameters(policy)`` gives its full ``{name: tensor}`` (FSDP: all-gathered)."""
        if self.rollout_model is not self.policy:
            src = full_parameters(self.policy)
            if self.lora_scalings is not None:  # a merged copy: W + s·B·A of the policy adapter
                src = merged_weights(src, self.lora_scalings)
            for name, p in self.rollout_model.named_parameters():
                p.copy_(src[name].detach().to(p.dtype))
        sync_engine_weights(engine)


def _load_policy_base(cfg: Config, path: str, dtype: torch.dtype, device: str):
    """The model of ``path`` (with ``model.adapter`` merged) in ``dtype`` on ``device``, activation
    checkpointing installed unless ``model.gradient_checkpointing=false`` (``auto`` switches it per
    micro-batch, :class:`~serl.train.grad_ckpt.GradCheckpointing`), no KV cache in training forwards."""
    model = load_causal_lm(path, dtype, device, cfg.model.trust_remote_code, cfg.model.adapter)
    prepare_checkpointing(model, cfg.model.gradient_checkpointing)  # on, off or per micro-batch
    model.config.use_cache = False
    return model


def load_models(cfg: Config, device: str) -> PolicyModels:
    """The tokenizer, the fp32 policy (master weights), its rollout copy, SERL's teacher and the
    KL reference; with ``model.lora.r > 0`` one base model in memory (:func:`_lora_models`).

    Raises:
        serl.models.loading.ModelLoadError: the model or adapter cannot be loaded.
    """
    path = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
    tokenizer = load_tokenizer(path)
    infer_dtype = pick_dtype(cfg.model.dtype, device)
    train_dtype = pick_dtype(cfg.model.train_dtype, device)
    # fp32 master weights; bf16 training = autocast
    autocast_dtype = train_dtype if train_dtype != torch.float32 else None
    if cfg.model.lora.r > 0:
        return _lora_models(cfg, path, tokenizer, device, infer_dtype, autocast_dtype)
    policy = _load_policy_base(cfg, path, torch.float32, device)
    # a bf16 copy for sampling, re-synced after every update (fast batched bf16 generate)
    rollout_model = Teacher(policy, infer_dtype).model if infer_dtype != torch.float32 else policy
    teacher = Teacher(policy, infer_dtype) if cfg.algorithm.serl.enable else None
    # the KL reference: a frozen copy of the initial policy θ0 (verl's ``ref``). Built before a
    # resume loads the checkpoint, so it is θ0 on resume too; never saved.
    ref = Teacher(policy, infer_dtype) if cfg.actor.use_kl_loss else None
    return PolicyModels(path, tokenizer, device, infer_dtype, autocast_dtype, policy, rollout_model, teacher, ref)


def _lora_models(cfg: Config, path: str, tokenizer, device: str, infer_dtype: torch.dtype,
                 autocast_dtype: Optional[torch.dtype]) -> PolicyModels:
    """LoRA (``model.lora.r > 0``, PEFT): one base model in memory. The policy trains its float32
    adapter only; the frozen base is held in the inference dtype when training autocasts to that
    dtype anyway (bf16 on CPUs with native bf16), else in float32. The policy itself samples the
    rollouts (no copy); SERL's teacher is a second adapter (:class:`AdapterTeacher`), the KL
    reference the base with adapters disabled (:class:`AdapterReference`). serl's design; verl's
    LoRA trains the same way (frozen base)."""
    base_dtype = infer_dtype if autocast_dtype == infer_dtype else torch.float32
    policy = apply_lora(_load_policy_base(cfg, path, base_dtype, device), cfg.model.lora)
    policy.eval()  # train mode only inside the update (get_peft_model leaves it in train mode)
    # rollout.merge_lora: the hf engine samples from a plain copy with the adapter merged in (one
    # GEMM per linear layer instead of PEFT's three), re-merged after every update
    merge = cfg.rollout.merge_lora and cfg.rollout.engine != "vllm"
    rollout_model = merged_copy(policy, infer_dtype) if merge else policy
    teacher = AdapterTeacher(policy) if cfg.algorithm.serl.enable else None
    ref = AdapterReference(policy) if cfg.actor.use_kl_loss else None
    return PolicyModels(path, tokenizer, device, infer_dtype, autocast_dtype, policy, rollout_model, teacher, ref,
                        lora=True, lora_scalings=adapter_scalings(policy) if merge else None)
