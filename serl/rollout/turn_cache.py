"""The ``hf`` engine's KV cache across calls: a multi-turn rollout prefills only what a turn appended.

A multi-turn loop calls the engine once per turn with each episode's whole conversation so far.
Where the conversation grows by appending (the math tool loop: prompt + sampled turn + tool
output + the next assistant header), turn ``t + 1``'s prompt begins with turn ``t``'s prompt and
reply, whose keys and values the engine computed a moment ago. :class:`TurnCache` keeps them:
after each ``generate`` call it holds, per row, the token ids the call ran (the prompt and the
reply but its last token, which was sampled and never fed) and views of their keys and values in
that call's cache buffers. :func:`serl.rollout.prefill.prefilled_cache` then looks each new
prompt up (:meth:`TurnCache.match`: the longest common prefix with any kept sequence) and runs
the model only on the tokens after it. vLLM's automatic prefix caching does the same across
requests with hashed KV blocks (``enable_prefix_caching``); serl keeps whole sequences of the last
call, which is what a turn loop reuses. Where prompts do not extend each other (ALFWorld's
sliding history window), the shared prefix is the system prompt and the task, and a match shorter
than :data:`MIN_REUSE` tokens is not used.

The kept keys and values are valid only for the weights that computed them: the cache is tagged
with :func:`weights_version` (the sum of the parameters' in-place version counters, which every
optimizer step and weight copy bumps) and emptied when that changes. ``HFEngine.reset_prefix_cache``
empties it too (the trainer calls it when a rollout ends, so the buffers are not held during the
update).

Keys and values reused this way were computed inside a padded decode batch rather than by a
fresh prefill: the same numbers up to float rounding (the order of the reductions differs), so
greedy tokens can differ where two logits tie within rounding (measured in BENCHMARKS.md,
"Rollouts at the hardware's pace"; tests/test_turn_cache.py checks equality in float32).
"""

from __future__ import annotations

from typing import Optional

import torch

#: the shortest prefix worth reusing (tokens): below it a fresh prefill costs about as much as
#: the copy, and nothing is gained
MIN_REUSE = 16


def weights_version(model: torch.nn.Module) -> int:
    """A number that changes whenever any parameter of ``model`` is modified in place (the sum of
    the tensors' ``_version`` counters: an optimizer step, ``load_state_dict``, a weight sync)."""
    return sum(p._version for p in model.parameters())


class TurnCache:
    """Token ids and KV views of the sequences one ``generate`` call ran, for the next call.

    Entries are added during a call (:meth:`add`) and become visible to :meth:`match` when the
    call ends (:meth:`commit`), so a call matches only against the previous call's sequences and
    the memory held is at most two calls' KV buffers.
    """

    def __init__(self):
        self._kept: list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self._next: list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self._version: Optional[int] = None
        #: tokens found in the cache / tokens that needed a prefill, summed since the last :meth:`take_stats`
        self.reused_tokens = 0
        self.prefilled_tokens = 0

    def __len__(self) -> int:
        return len(self._kept)

    def begin(self, version: int) -> None:
        """Start a call with the model's :func:`weights_version`; drops every entry computed with
        other weights."""
        if version != self._version:
            self._kept = []
        self._version = version
        self._next = []

    def valid_for(self, version: int) -> bool:
        """True if the kept entries were computed with the weights of :func:`weights_version`
        ``version`` (a read between calls, as action scoring does, must not use stale ones)."""
        return version == self._version

    def add(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep a sequence the current call ran.

        Args:
            ids: its ``n`` token ids.
            layers: per layer ``(keys, values)``, each ``[KV, n, D]`` (views are fine: the
                buffers stay alive while kept).

        Raises:
            ValueError: a layer's length differs from ``len(ids)``.
        """
        if any(k.shape[-2] != len(ids) or v.shape[-2] != len(ids) for k, v in layers):
            raise ValueError(f"KV of {[k.shape[-2] for k, _ in layers][:1]} positions for {len(ids)} token ids")
        if len(ids) >= MIN_REUSE:
            self._next.append((torch.tensor(ids, dtype=torch.long), layers))

    def commit(self) -> None:
        """End the call: its sequences replace the previous call's."""
        self._kept, self._next = self._next, []

    def clear(self) -> None:
        """Drop everything (the weights changed, or the rollout ended)."""
        self._kept, self._next, self._version = [], [], None

    def match(self, ids: list[int]) -> tuple[int, Optional[list[tuple[torch.Tensor, torch.Tensor]]]]:
        """The longest prefix of ``ids`` that a kept sequence starts with.

        Returns:
            ``(n, layers)``: ``n`` tokens (``>= MIN_REUSE``) and that sequence's per-layer
            ``(keys, values)`` ``[KV, >= n, D]`` (the caller uses the first ``n`` positions), or
            ``(0, None)``.
        """
        best, layers = 0, None
        if not self._kept or len(ids) < MIN_REUSE:
            return 0, None
        query = torch.tensor(ids, dtype=torch.long)
        for seq, kv in self._kept:
            n = min(len(seq), len(query))
            if n <= best:
                continue
            diff = (seq[:n] != query[:n]).nonzero()
            lcp = n if diff.numel() == 0 else int(diff[0, 0])
            if lcp > best:
                best, layers = lcp, kv
        return (best, layers) if best >= MIN_REUSE else (0, None)

    def take_stats(self) -> dict[str, int]:
        """``{"reused_tokens", "prefilled_tokens"}`` since the last call, then zeroed."""
        out = {"reused_tokens": self.reused_tokens, "prefilled_tokens": self.prefilled_tokens}
        self.reused_tokens = self.prefilled_tokens = 0
        return out
