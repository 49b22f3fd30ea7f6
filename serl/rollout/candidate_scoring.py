"""Log-probabilities of many continuations of one context in one forward (a token tree).

Choosing an action by likelihood (``rollout.action_selection=score``,
:mod:`serl.rollout.action_selection`) needs ``log p(c | context)`` for every admissible command
``c`` after the policy's own reasoning. The candidates share the context and most of their first
tokens (``<action>go to …``), so :func:`continuation_log_probs` runs them as one token tree: the
continuations' distinct prefixes become the nodes of a trie, laid out after the context in one
sequence, and a 4-D attention mask lets each node attend to the context and to its own ancestors
only (the tree attention of speculative decoding's candidate verification, e.g. SpecInfer,
arXiv 2305.09781, section 4, and Medusa, arXiv 2401.10774, section 2.1.2), with each node's
position id its depth after the context. One forward then gives every candidate's token
log-probs: the same numbers as scoring each ``context + c`` on its own, up to float rounding
(tests/test_action_selection.py). The context itself comes from the ``hf`` engine's turn cache
when the call that sampled the reasoning left it there (:mod:`serl.rollout.turn_cache`), so only
its last token and the tree run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from transformers.cache_utils import Cache

from serl.rollout.prefill import CACHE_ARG, PreallocatedLayer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from serl.rollout.turn_cache import TurnCache


def token_trie(continuations: list[list[int]]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """The trie of ``continuations``' token prefixes.

    Args:
        continuations: ``N`` non-empty lists of token ids.

    Returns:
        ``(tokens, parents, depths, paths)``: per node its token id, its parent node (-1 for a
        first token) and its depth (0 for a first token), nodes in insertion order (a parent
        before its children); per continuation the node of each of its tokens.

    Raises:
        ValueError: an empty continuation.
    """
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    children: dict[tuple[int, int], int] = {}
    paths: list[list[int]] = []
    for c in continuations:
        if not c:
            raise ValueError("an empty continuation has no tokens to score")
        node, path = -1, []
        for depth, tok in enumerate(c):
            nxt = children.get((node, tok))
            if nxt is None:
                nxt = len(tokens)
                tokens.append(tok)
                parents.append(node)
                depths.append(depth)
                children[(node, tok)] = nxt
            path.append(nxt)
            node = nxt
        paths.append(path)
    return tokens, parents, depths, paths


@torch.no_grad()
def continuation_log_probs(model: "PreTrainedModel", context: list[int], continuations: list[list[int]],
                           turn_cache: Optional["TurnCache"] = None) -> list[list[float]]:
    """Per continuation, the log-probability (nats, temperature 1) of each of its tokens after
    ``context`` and its own earlier tokens, all continuations in one forward (module docstring).

    Args:
        model: a causal LM whose cache layers :func:`serl.rollout.prefill.supports_prefilled_cache`
            accepts (it is put in eval mode for the call and restored).
        context: ``L >= 1`` token ids (the prompt and the reply so far).
        continuations: ``N >= 1`` non-empty token-id lists.
        turn_cache: the ``hf`` engine's kept keys and values; the longest kept prefix of
            ``context`` (all but its last token at most) is copied instead of recomputed.

    Returns:
        ``N`` lists, list ``i`` of ``len(continuations[i])`` floats.

    Raises:
        ValueError: an empty context, no continuation or an empty one.
    """
    if not context:
        raise ValueError("continuation_log_probs needs a context of at least one token")
    if not continuations:
        raise ValueError("continuation_log_probs needs at least one continuation")
    tokens, parents, depths, paths = token_trie(continuations)
    has_child = [False] * len(tokens)
    for p in parents:
        if p >= 0:
            has_child[p] = True
    fed = [k for k in range(len(tokens)) if has_child[k]]  # a leaf's logits predict nothing asked for
    column = {k: j for j, k in enumerate(fed)}
    device = next(model.parameters()).device
    L = len(context)
    n, kept = turn_cache.match(context) if turn_cache is not None else (0, None)
    n = min(n, L - 1)
    if kept is None:
        n = 0
    head = context[n:]  # context tokens to run (>= 1: the last one's logits give the first tokens)
    F = len(head) + len(fed)
    allowed = torch.zeros((F, n + F), dtype=torch.bool)
    allowed[: len(head), :n] = True
    allowed[: len(head), n:n + len(head)] = torch.ones(len(head), len(head), dtype=torch.bool).tril()
    for j, k in enumerate(fed):
        row = len(head) + j
        allowed[row, : n + len(head)] = True
        a = k
        while a >= 0:  # the node and its ancestors (every ancestor has a child, so it is fed)
            allowed[row, n + len(head) + column[a]] = True
            a = parents[a]
    positions = list(range(n, L)) + [L + depths[k] for k in fed]
    past = {}
    if n:
        layers = []
        for k, v in kept:
            kb = k.new_empty((1, k.shape[0], n + F, k.shape[2]))
            vb = v.new_empty((1, v.shape[0], n + F, v.shape[2]))
            kb[0, :, :n], vb[0, :, :n] = k[:, :n], v[:, :n]
            layers.append(PreallocatedLayer(kb, vb, n))
        past = {CACHE_ARG: Cache(layers=layers)}
    was_training = model.training
    model.eval()
    try:
        out = model(input_ids=torch.tensor([head + [tokens[k] for k in fed]], device=device),
                    attention_mask=allowed[None, None].to(device), position_ids=torch.tensor([positions], device=device),
                    use_cache=bool(n), logits_to_keep=1 + len(fed), **past)
    finally:
        model.train(was_training)
    logp = torch.log_softmax(out.logits[0].float(), dim=-1).cpu()  # row 0: the context's last token
    result = []
    for c, path in zip(continuations, paths):
        rows = [0] + [1 + column[path[i]] for i in range(len(c) - 1)]
        result.append(logp[rows, c].tolist())
    return result
