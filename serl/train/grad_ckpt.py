"""Activation (gradient) checkpointing on, off, or per micro-batch (``model.gradient_checkpointing``).

Checkpointing frees each decoder layer's activations after the forward and recomputes them in
the backward: about a third more compute for far less memory. With ``auto`` a micro-batch is
checkpointed only when :func:`serl.models.memory.model_activation_bytes` (its activation memory
without checkpointing) exceeds the budget :func:`serl.models.memory.activation_budget_bytes`
(``trainer.activation_memory_gb``; null = half the memory available when the update starts).
The switch flips transformers' per-layer ``gradient_checkpointing`` flags (the checkpoint
function is installed once by ``activation_checkpointing_enable``), so it costs nothing per
micro-batch and does not change the gradients (the recomputation is exact). serl's design:
verl and TRL set ``enable_gradient_checkpointing`` once per run.
"""

from __future__ import annotations

from typing import Optional, Union

from serl.models.memory import activation_budget_bytes, model_activation_bytes


def prepare_checkpointing(model, mode: Union[bool, str]) -> None:
    """Install activation checkpointing on a freshly loaded model unless ``mode`` is False
    (``auto`` installs it too; :class:`GradCheckpointing` then switches it per micro-batch)."""
    if mode is False:
        return
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def set_checkpointing(modules: list, on: bool) -> None:
    """Set the ``gradient_checkpointing`` flag of ``modules`` (those of a model that have it)."""
    for m in modules:
        m.gradient_checkpointing = on


class GradCheckpointing:
    """Per-micro-batch activation checkpointing of ``model`` (see the module docstring).

    Args:
        model: the trained model (a transformers model, possibly PEFT-wrapped), already passed
            through :func:`prepare_checkpointing` with the same ``mode``.
        mode: True (always), False (never) or ``"auto"``.
        memory_gb: ``trainer.activation_memory_gb`` (None = derived from the available memory).
        device: ``cpu`` or ``cuda``. processes: training processes sharing this machine's memory.
        dtype_bytes: bytes of the compute (autocast) dtype, 2 for bf16, 4 for float32.
    """

    def __init__(self, model, mode: Union[bool, str], memory_gb: Optional[float] = None, device: str = "cpu",
                 processes: int = 1, dtype_bytes: int = 4):
        self.mode, self.memory_gb, self.device, self.processes = mode, memory_gb, device, processes
        self.dtype_bytes = dtype_bytes
        self.config = model.config if hasattr(model, "config") else None
        self.modules = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
        self.budget = 0
        self.begin()

    def begin(self) -> None:
        """Start an update: read the budget (``auto``) and reset the counts."""
        if self.mode == "auto":
            self.budget = activation_budget_bytes(self.memory_gb, self.device, self.processes)
        self.checkpointed = self.micro_batches = 0

    def select(self, rows: int, seq_len: int, logit_positions: int = 0) -> bool:
        """Decide for one micro-batch of ``rows × seq_len`` padded tokens with ``logit_positions``
        kept logits; switches the model's flags under ``auto``. Returns True = checkpointed."""
        if self.mode == "auto":
            need = model_activation_bytes(self.config, rows, seq_len, logit_positions, self.dtype_bytes)
            on = need > self.budget
            set_checkpointing(self.modules, on)
        else:
            on = bool(self.mode)
        self.micro_batches += 1
        self.checkpointed += int(on)
        return on

    def fraction(self) -> float:
        """Share of this update's micro-batches that ran with checkpointing (``perf/grad_ckpt_fraction``);
        0 before any micro-batch."""
        return self.checkpointed / self.micro_batches if self.micro_batches else 0.0

    def metrics(self) -> dict[str, float]:
        """``perf/grad_ckpt_fraction`` (the budget itself is not logged: it follows the machine's
        free memory, and a resumed run's metrics must equal an uninterrupted run's)."""
        return {"perf/grad_ckpt_fraction": self.fraction()}
