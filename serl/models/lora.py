"""LoRA (Hu et al., arXiv 2106.09685) through PEFT: one base model, several named adapters.

``serl sft`` and ``serl train`` wrap the policy with :func:`apply_lora` (only the adapter
matrices then train). ``serl train`` keeps SERL's lagged teacher as a second adapter
(:data:`TEACHER_ADAPTER`) on the same base, and scores the KL reference with the adapters
disabled, as TRL does (``huggingface/trl`` ``DPOTrainer.null_ref_context``: ``disable_adapter()``,
or ``set_adapter(ref_adapter_name)`` for a reference adapter). So one base is in memory, never
two full copies.

Adapter weights are named here by their *canonical* key: the PEFT parameter name without the
adapter name (``...q_proj.lora_A.weight``, as PEFT's own ``adapter_model.safetensors``), so the
policy's and the teacher's adapters have the same keys.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Optional
import warnings

import torch

from serl.errors import ConfigError
from serl.models.casting import to_dtype

if TYPE_CHECKING:
    from serl.config import ModelLoraConfig

#: PEFT's name of the first (the trained) adapter
POLICY_ADAPTER = "default"
#: the adapter holding SERL's lagged teacher snapshot
TEACHER_ADAPTER = "teacher"


def lora_config(lo: "ModelLoraConfig", inference_mode: bool = False):
    """The ``peft.LoraConfig`` of ``model.lora.*`` (``inference_mode``: the adapter is frozen)."""
    from peft import LoraConfig

    return LoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, target_modules=list(lo.target_modules),
                      task_type="CAUSAL_LM", inference_mode=inference_mode)


@contextmanager
def peft_wrapping() -> Iterator[None]:
    """Around building a ``peft.PeftModel`` (``get_peft_model``, ``PeftModel.from_pretrained``):
    ignore the one ``FutureWarning`` PEFT's own code causes there, nothing else.

    A last resort, not a fix: peft 0.21.2 (the newest release) reads
    ``getattr(model, "is_gradient_checkpointing", True)`` in ``PeftModel.__init__``
    (``peft/peft_model.py`` line 184; ``peft/mixed_model.py`` line 39 likewise), a property that
    transformers >= 5.23 deprecated for ``is_activation_checkpointing`` and that warns on every
    read (``transformers/modeling_utils.py``, ``PreTrainedModel.is_gradient_checkpointing``).
    serl never reads it; no argument of serl's avoids PEFT's read. The filter matches only that
    message raised from ``transformers.modeling_utils``; drop it once PEFT reads
    ``is_activation_checkpointing``.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning,
                                module=r"transformers\.modeling_utils$")
        yield


def apply_lora(model, lo: "ModelLoraConfig"):
    """Wrap ``model`` with LoRA adapters (``peft.get_peft_model``); only they train afterwards.

    The adapters are initialised as PEFT does (``lora_B = 0``), so the wrapped model computes
    exactly the base model's outputs until the first update.

    Raises:
        ConfigError: bad ``model.lora.*`` values (``r`` must be > 0 here), or no module of the
            model matches ``model.lora.target_modules``.
    """
    lo.validate()
    if lo.r <= 0:
        raise ConfigError("model.lora.r: must be > 0 to apply LoRA")
    from peft import get_peft_model

    try:
        with peft_wrapping():
            return get_peft_model(model, lora_config(lo))
    except ValueError as e:  # peft: "Target modules ... not found in the base model"
        raise ConfigError(f"model.lora.target_modules: {e}") from e


def is_peft_model(model) -> bool:
    """True if ``model`` is a PEFT-wrapped model (has named adapters)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def adapter_parameters(model, name: str) -> dict[str, torch.nn.Parameter]:
    """The parameters of adapter ``name`` of a PEFT model, by canonical key (adapter name removed).

    Raises:
        ValueError: the model has no adapter ``name``.
    """
    tag = f".{name}."
    out = {k.replace(tag, "."): p for k, p in model.named_parameters() if tag in k and ".lora_" in k}
    if not out:
        raise ValueError(f"the model has no LoRA adapter named {name!r}")
    return out


@torch.no_grad()
def copy_adapter(model, src: str, dst: str) -> None:
    """Copy adapter ``src``'s weights into adapter ``dst`` (same config) of the same PEFT model.

    Raises:
        ValueError: either adapter is missing or their keys differ.
    """
    a, b = adapter_parameters(model, src), adapter_parameters(model, dst)
    if a.keys() != b.keys():
        raise ValueError(f"adapters {src!r} and {dst!r} have different modules")
    for k, p in b.items():
        p.copy_(a[k].detach().to(p.dtype))


def add_frozen_adapter_copy(model, src: str, dst: str) -> None:
    """Add adapter ``dst`` to a PEFT model with ``src``'s config, frozen (``requires_grad=False``),
    holding a copy of ``src``'s weights; ``src`` stays the active, trained adapter."""
    import copy

    cfg = copy.deepcopy(model.peft_config[src])
    cfg.inference_mode = True
    model.add_adapter(dst, cfg)
    copy_adapter(model, src, dst)
    for p in adapter_parameters(model, dst).values():
        p.requires_grad_(False)


@contextmanager
def adapter_active(model, name: Optional[str]) -> Iterator[None]:
    """Within the block the PEFT ``model`` computes with adapter ``name`` only (frozen), or with
    every adapter disabled for ``name=None`` (the base model); the previously active adapter and
    its ``requires_grad`` flags are restored after."""
    if name is None:
        with model.disable_adapter():
            yield
        return
    prev = model.active_adapter
    if name == prev:
        yield
        return
    trainable = {k for k, p in model.named_parameters() if p.requires_grad}
    model.set_adapter(name, inference_mode=True)
    try:
        yield
    finally:
        model.set_adapter(prev)
        for k, p in model.named_parameters():
            p.requires_grad_(k in trainable)


class AdapterView:
    """One adapter of a PEFT model seen as a model: calling it runs the shared base with that
    adapter active (``adapter=None``: adapters disabled, the base model alone), always in eval
    mode, and
    ``state_dict`` / ``load_state_dict`` read and write that adapter's weights only (canonical
    keys), as the checkpoint functions expect of a model.

    Args:
        model: the PEFT model (shared, not copied).
        adapter: an adapter name, or None for the base model (no weights of its own).
    """

    _tied_weights_keys = None

    def __init__(self, model, adapter: Optional[str]):
        self.peft_model = model
        self.adapter = adapter

    def __call__(self, *args: Any, **kwargs: Any):
        """The shared model's forward with this adapter, in eval mode (no dropout, as a frozen
        copy would be); the model's train/eval mode is restored after."""
        was_training = self.peft_model.training
        self.peft_model.eval()
        try:
            with adapter_active(self.peft_model, self.adapter):
                return self.peft_model(*args, **kwargs)
        finally:
            self.peft_model.train(was_training)

    def parameters(self):
        """The shared model's parameters (for its device and dtype)."""
        return self.peft_model.parameters()

    def eval(self) -> "AdapterView":
        self.peft_model.eval()
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter's weights by canonical key (detached, on their device).

        Raises:
            ValueError: a view of the base model (``adapter=None``) has no weights of its own.
        """
        if self.adapter is None:
            raise ValueError("the base-model view has no adapter weights")
        return {k: p.detach() for k, p in adapter_parameters(self.peft_model, self.adapter).items()}

    @torch.no_grad()
    def load_state_dict(self, sd: dict[str, torch.Tensor], strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy ``sd`` (canonical keys) into the adapter; returns ``(missing, unexpected)`` keys.

        Raises:
            RuntimeError: ``strict`` and the keys differ, or a tensor of another shape.
        """
        own = adapter_parameters(self.peft_model, self.adapter)
        missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
        if strict and (missing or unexpected):
            raise RuntimeError(f"adapter {self.adapter!r}: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for k in set(own) & set(sd):
            if own[k].shape != sd[k].shape:
                raise RuntimeError(f"adapter {self.adapter!r}: {k} has shape {tuple(sd[k].shape)}, "
                                   f"expected {tuple(own[k].shape)} (was model.lora changed?)")
            own[k].copy_(sd[k].to(own[k].device, own[k].dtype))
        return missing, unexpected


def merged_lora_model(model, lo: "ModelLoraConfig", adapter_sd: dict[str, torch.Tensor]):
    """``model`` with a LoRA adapter of ``model.lora`` config ``lo`` whose weights are
    ``adapter_sd`` (canonical keys, e.g. a ``serl train`` checkpoint's ``policy.safetensors``)
    merged into its weights (``merge_and_unload``): a plain model.

    Raises:
        ConfigError: bad ``lo``. RuntimeError: ``adapter_sd`` does not match ``lo``.
    """
    peft_model = apply_lora(model, lo)
    AdapterView(peft_model, POLICY_ADAPTER).load_state_dict(adapter_sd, strict=True)
    return peft_model.merge_and_unload()


def _lora_layers(model) -> Iterator[tuple[str, Any]]:
    """``(name, module)`` of each PEFT LoRA layer of ``model`` (a module with a ``base_layer`` and a
    per-adapter ``scaling`` dict)."""
    for name, m in list(model.named_modules()):
        if hasattr(m, "base_layer") and isinstance(getattr(m, "scaling", None), dict):
            yield name, m


def adapter_scalings(policy, adapter: str = POLICY_ADAPTER) -> dict[str, float]:
    """``{plain-model module name: scaling}`` of every LoRA layer of a PEFT model for ``adapter``
    (``lora_alpha / r``, as PEFT's ``LoraLayer.scaling``). The names are those of the unwrapped
    model (``model.layers.0.self_attn.q_proj``), the keys :func:`merged_weights` needs.

    Raises:
        ValueError: a LoRA layer uses DoRA or ``fan_in_fan_out`` (not merged here).
    """
    prefix = "base_model.model."
    out = {}
    for name, m in _lora_layers(policy):
        if adapter in m.scaling:
            if getattr(m, "fan_in_fan_out", False) or getattr(m, "use_dora", {}).get(adapter, False):
                raise ValueError(f"{name}: DoRA / fan_in_fan_out LoRA layers are not merged by serl")
            out[name.removeprefix(prefix)] = float(m.scaling[adapter])
    return out


def merged_weights(params: dict[str, torch.Tensor], scalings: dict[str, float],
                   adapter: str = POLICY_ADAPTER) -> dict[str, torch.Tensor]:
    """The parameters of the plain model that a PEFT LoRA policy computes with ``adapter`` active.

    For a LoRA linear layer ``X`` (``y = W x + s · B A x``, Hu et al., arXiv 2106.09685 Eq. 3) the
    merged weight is ``W + s · B @ A``, computed in float32; other adapters (SERL's teacher) are
    left out; every other parameter is passed through under its plain name.

    Args:
        params: the PEFT model's ``{name: tensor}`` (``base_model.model.X.base_layer.weight``,
            ``...X.lora_A.<adapter>.weight`` ``[r, in]``, ``...X.lora_B.<adapter>.weight`` ``[out, r]``).
        scalings: :func:`adapter_scalings` of the model.

    Returns:
        ``{plain name: tensor}`` (``X.weight`` ``[out, in]`` float32 for the merged layers; the
        others as given).

    Raises:
        KeyError: a layer of ``scalings`` lacks its base weight or one of its adapter matrices.
    """
    prefix = "base_model.model."
    out: dict[str, torch.Tensor] = {}
    for name, t in params.items():
        plain = name.removeprefix(prefix)
        if ".lora_" in plain or ".base_layer." in plain:
            continue
        out[plain] = t
    for layer, s in scalings.items():
        w = params[f"{prefix}{layer}.base_layer.weight"].float()
        a = params[f"{prefix}{layer}.lora_A.{adapter}.weight"].float()
        b = params[f"{prefix}{layer}.lora_B.{adapter}.weight"].float()
        out[f"{layer}.weight"] = torch.addmm(w, b, a, alpha=s)
        bias = params.get(f"{prefix}{layer}.base_layer.bias")
        if bias is not None:
            out[f"{layer}.bias"] = bias
    return out


def merged_copy(policy, dtype: torch.dtype):
    """A plain (non-PEFT) copy of a LoRA policy in ``dtype`` with its adapter merged into the
    weights: what the hf engine samples from with ``rollout.merge_lora`` (one GEMM per linear
    layer instead of three). Refresh it after an update with :func:`merged_weights`."""
    import copy

    base = policy.get_base_model()
    plain = copy.deepcopy(base)
    # unwrap the LoRA layers of the copy: each becomes its base nn.Linear
    for name, m in _lora_layers(plain):
        parent_name, _, child = name.rpartition(".")
        setattr(plain.get_submodule(parent_name) if parent_name else plain, child, m.base_layer)
    plain = to_dtype(plain, dtype).eval().requires_grad_(False)
    if getattr(plain.config, "use_cache", None) is False:
        plain.config.use_cache = True
    with torch.no_grad():
        src = merged_weights({k: p.detach() for k, p in policy.named_parameters()}, adapter_scalings(policy))
        for name, p in plain.named_parameters():
            p.copy_(src[name].to(p.dtype))
    return plain
