"""SERL's teacher: a lagged, frozen copy of the policy that scores the student's own tokens
under a privileged prompt (SERL, arXiv 2605.19447; ``OliverLeeXZ/SERL@5a2a85b:verl/trainer/ppo/ray_trainer.py``).

* Built from the policy at start-up (θ0) and hard-copied from it every
  ``teacher_sync_interval`` completed updates (θ10, θ20, ...; no EMA).
* Kept in the inference dtype (bf16 on CPUs with native bf16) and never trained. Its state is
  checkpointed, so a resumed run continues with the same teacher (the original re-initialised
  it from the base model on resume).
* With LoRA (``model.lora.r > 0``) the teacher is :class:`AdapterTeacher`: a frozen snapshot of
  the policy's *adapter* weights, held as a second PEFT adapter on the policy's own base model
  (one base in memory instead of two full copies); scoring switches the active adapter. serl's
  own design: the original trains all weights.
* Prompts longer than ``max_reprompt_len`` lose the *start of the privileged block* (oldest
  hindsight first); the chat template's closing turn and the student response are never cut.
  The original right-truncated the tokenised chat, cutting the assistant header
  of long prompts; ``reprompt_truncation=right`` reproduces that.
"""

from __future__ import annotations

import copy

import torch

from serl.agent.chat import conversation_head, prompt_ids
from serl.hindsight.rendering import teacher_user_message
from serl.models.casting import to_dtype
from serl.models.lora import POLICY_ADAPTER, TEACHER_ADAPTER, AdapterView, add_frozen_adapter_copy, copy_adapter

TRUNCATION_MARK = "[... earlier hindsight omitted ...]\n"


class Teacher:
    """A frozen copy of ``policy`` in ``dtype``.

    Args:
        policy: the trained model (its weights are copied).
        dtype: dtype of the copy.
    """

    def __init__(self, policy, dtype: torch.dtype):
        self.model = to_dtype(copy.deepcopy(policy), dtype)
        self.model.eval()
        self.model.requires_grad_(False)
        if getattr(self.model.config, "use_cache", None) is False:
            self.model.config.use_cache = True

    @torch.no_grad()
    def sync_from(self, policy) -> None:
        """Hard copy of the policy's parameters into the teacher (no EMA, as the original)."""
        src = dict(policy.named_parameters())
        for name, p in self.model.named_parameters():
            p.copy_(src[name].detach().to(p.dtype))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(sd)


class AdapterTeacher:
    """SERL's lagged teacher of a LoRA policy: adapter :data:`TEACHER_ADAPTER` on the policy's
    base, a frozen copy of the policy adapter (θ0 at start-up, re-copied at every sync).

    ``model`` is an :class:`AdapterView`: called like a model, it runs the shared base with the
    teacher adapter active; its ``state_dict`` holds the teacher adapter's weights only. The
    teacher adapter stays in the policy adapter's dtype (float32), so a teacher synced at
    update u scores exactly as the policy did after update u.

    Args:
        policy: the PEFT policy (adapter :data:`POLICY_ADAPTER` trains); gets the teacher adapter.
    """

    def __init__(self, policy):
        add_frozen_adapter_copy(policy, POLICY_ADAPTER, TEACHER_ADAPTER)
        self.model = AdapterView(policy, TEACHER_ADAPTER)

    def sync_from(self, policy) -> None:
        """Hard copy of the policy adapter into the teacher adapter (no EMA, as the original)."""
        copy_adapter(policy, POLICY_ADAPTER, TEACHER_ADAPTER)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(sd)


class AdapterReference:
    """The KL reference of a LoRA policy: its own base model with every adapter disabled
    (``model`` = :class:`AdapterView` with ``adapter=None``), as TRL does
    (``huggingface/trl`` ``DPOTrainer.null_ref_context``). The base never trains and LoRA
    starts at ``lora_B = 0``, so this is exactly θ0, with no second copy in memory."""

    def __init__(self, policy):
        self.model = AdapterView(policy, None)


def teacher_prompt_ids(tokenizer, prompt: str, block: str, max_len: int, truncation: str = "privileged",
                       prompt_format: str = "chat", student_prompt_ids: list[int] | None = None
                       ) -> tuple[list[int], bool]:
    """Token ids of the teacher's chat prompt for one row, capped at ``max_len`` tokens.

    Args:
        tokenizer: the policy tokenizer.
        prompt: the row's original step prompt (the student's user message).
        block: the privileged block (:meth:`PrivilegedContext.block`).
        max_len: token cap (``max_reprompt_len``).
        truncation: ``privileged`` (cut the block from its start) or ``right`` (original).
        prompt_format: the student row's ``Step.prompt_format`` (:func:`serl.agent.chat.prompt_ids`).
            ``conversation``: the teacher sees the student's chat so far, its last user turn
            (``prompt``) carrying the privileged block (serl's; the original has step rows only),
            so the teacher and the student differ by the hindsight alone.
        student_prompt_ids: the student row's prompt ids; needed for ``conversation``.

    Returns:
        ``(ids, has_context)``; ``has_context`` is False when nothing of the block fits, in which
        case the row must be trained as plain GRPO (``serl_mask = 0``).
    """
    head = None
    if prompt_format == "conversation":
        if student_prompt_ids is None:
            raise ValueError("teacher_prompt_ids: a conversation-layout row needs student_prompt_ids")
        head = conversation_head(tokenizer, student_prompt_ids, prompt)

    def render(user_text: str) -> list[int]:
        return prompt_ids(tokenizer, user_text, prompt_format, head)

    ids = render(teacher_user_message(prompt, block))
    if len(ids) <= max_len:
        return ids, True
    if truncation == "right":
        return ids[:max_len], True
    block_ids = tokenizer(block, add_special_tokens=False).input_ids
    mark = len(tokenizer(TRUNCATION_MARK, add_special_tokens=False).input_ids)
    drop = len(ids) - max_len + mark
    for _ in range(4):  # decode/re-encode can shift counts by a few tokens
        if drop >= len(block_ids):
            return render(prompt), False
        cut = TRUNCATION_MARK + tokenizer.decode(block_ids[drop:], skip_special_tokens=True)
        ids = render(teacher_user_message(prompt, cut))
        if len(ids) <= max_len:
            return ids, True
        drop += len(ids) - max_len + 2
    return render(prompt), False
