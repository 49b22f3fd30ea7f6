"""Action selection by likelihood: the policy reasons, then its action is chosen among the env's
admissible commands by the log-probability it gives each (``rollout.action_selection=score``).

With ``generate`` (the default, verl-agent's and SERL's behaviour) the action is whatever the
policy wrote inside ``<action>…</action>``, admissible or not. With ``score`` the policy still
samples its whole reply; :class:`ActionSelector` then keeps the reply's reasoning (its tokens up
to the ``<action>`` tag, :func:`split_reply`), writes every admissible command ``c`` after it as
the policy would close the reply, ``<action>c</action>`` and the end-of-turn token
(:func:`candidate_ids`), scores them all in one forward that shares the context's keys and values
(:func:`serl.rollout.candidate_scoring.continuation_log_probs`) and takes

    log π(c | s, reasoning) = Σ_tokens log p(token | s, reasoning, earlier tokens of c)

the argmax when greedy, else a draw from ``softmax(log π(c) / T)`` at the rollout temperature
``T`` (``top_p``/``top_k`` do not apply to the candidates). This is how SayCan scores skills
(arXiv 2204.01691, section 3) and the policy of GLAM (arXiv 2302.02662, section 3.2:
``π(a|s) ∝ exp Σ log p(tokens of a | s)``), with the policy's own reasoning in the context. The
chosen candidate's tokens replace the sampled ones after the reasoning, so the trajectory holds
an ordinary reply whose action tokens are the chosen command's: the update, GiGPO's step groups
and SERL's teacher see it like any other.

**The log-prob the policy loss uses.** The update scores the reply's tokens as for any reply, so
a scored action's log-prob in the loss is its candidate's token log-probs (the numerator of the
renormalised distribution), not GLAM's log-softmax over the candidates, whose gradient would also
push the other candidates down. Which of the two teaches more is still to be measured; the
behaviour probability of a sampled candidate differs from its token probability by the
normaliser ``Σ_c π(c)``, which the ratio of a PPO epoch after the first does not correct.

**Free-text actions** (an env's :attr:`~serl.envs.base.BaseTextEnv.free_text_actions`, WebShop's
``search[...]``) have no closed form to score: a step whose admissible commands are all free text
(WebShop's search page), or whose sampled action is one of the free-text actions the env admits
now, keeps the sampled reply as it is; otherwise the closed commands are the candidates.

**A reply with no ``<action>`` tag** (malformed, or cut by ``data.max_response_length``) keeps its
text up to and including ``</think>``; a reply cut inside its reasoning keeps all of it and gets
``</think>`` added before the candidates, so every scored step ends in a well-formed reply.

Counted per rollout (:attr:`ActionSelector.metrics`): ``rollout/scored_action_fraction`` (steps
whose action was chosen by score), ``rollout/score_kept_sampled_fraction`` (of those, the chosen
command equals the action the policy wrote), ``rollout/score_candidates_mean``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from serl.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from serl.rollout.engine import RolloutEngine

#: ``rollout.action_selection`` values
ACTION_SELECTIONS = ("generate", "score")

_ACTION_OPEN = re.compile(r"<action\b[^>]*>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)


@dataclass(frozen=True)
class ReplySplit:
    """Where a sampled reply's reasoning ends.

    Attributes:
        prefix_ids: the reply's first tokens, kept as sampled (their text is a prefix of the
            reasoning).
        bridge: the text between those tokens and the action tag: the end of a token that ran
            into the tag, or ``"</think>"`` added to a reply cut inside its reasoning.
    """

    prefix_ids: list[int]
    bridge: str


def split_reply(response_ids: Sequence[int], tokenizer: "PreTrainedTokenizerBase",
                eos_ids: Sequence[int] = ()) -> ReplySplit:
    """Split a sampled reply where its action begins (module docstring).

    Args:
        response_ids: the sampled reply ``[resp_len]`` (its end-of-turn token, if any, included).
        tokenizer: the policy tokenizer.
        eos_ids: the engine's end-of-reply tokens (dropped from the end before splitting).

    Returns:
        The :class:`ReplySplit`: the reasoning is the text before the first ``<action>`` tag
        after ``</think>`` (or anywhere, without ``</think>``); with no tag, the text through
        ``</think>``; with neither, the whole reply plus ``"</think>"`` when it opened ``<think>``.
    """
    ids = list(response_ids)
    while ids and ids[-1] in set(eos_ids):
        ids.pop()
    text = tokenizer.decode(ids, skip_special_tokens=False)
    close = _THINK_CLOSE.search(text)
    opened = _ACTION_OPEN.search(text, close.end() if close else 0)
    extra = ""
    if opened is not None:
        cut = opened.start()
    elif close is not None:
        cut = close.end()
    else:
        cut = len(text)
        extra = "</think>" if "<think>" in text.lower() else ""
    head = text[:cut]
    for k in range(len(ids), -1, -1):  # the reasoning sits at the front: a few decodes from the end
        decoded = tokenizer.decode(ids[:k], skip_special_tokens=False)
        if len(decoded) <= cut and head.startswith(decoded):
            return ReplySplit(ids[:k], head[len(decoded):] + extra)
    return ReplySplit([], head + extra)  # unreachable: k = 0 decodes to ""


def candidate_ids(tokenizer: "PreTrainedTokenizerBase", split: ReplySplit, action: str, eos_id: int) -> list[int]:
    """The tokens a reply choosing ``action`` continues with after ``split.prefix_ids``:
    ``bridge + "<action>" + action + "</action>"`` tokenised as one text, then ``eos_id`` (the
    chat template's end of turn, as a sampled reply ends)."""
    text = f"{split.bridge}<action>{action}</action>"
    return list(tokenizer.encode(text, add_special_tokens=False)) + [eos_id]


def choose(log_probs: torch.Tensor, greedy: bool, temperature: float = 1.0) -> int:
    """The index of the chosen candidate.

    Args:
        log_probs: ``[N]`` candidate log-probabilities (nats, temperature 1).
        greedy: take the argmax (the first of equal maxima).
        temperature: ``T > 0``; a draw from ``softmax(log_probs / T)`` with torch's global RNG
            (so a seeded rollout and a resumed run draw the same).

    Raises:
        ValueError: no candidate, or ``T <= 0`` when sampling.
    """
    if log_probs.numel() == 0:
        raise ValueError("no candidate to choose from")
    if greedy:
        return int(torch.argmax(log_probs))
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    probs = torch.softmax(log_probs.double() / temperature, dim=0)
    return int(torch.multinomial(probs, 1))


def is_free_text(action: str, free_text_actions: Sequence[str]) -> bool:
    """True if ``action`` is one of an env's free-text actions (it starts with one of the
    prefixes ``free_text_actions``, case-insensitive: ``search[``)."""
    low = action.strip().lower()
    return any(low.startswith(p.lower()) for p in free_text_actions)


class ActionSelector:
    """Replace each sampled reply's action with the admissible command the policy scores highest
    (or draws), keeping its reasoning (module docstring).

    Args:
        engine: the rollout engine; it must offer ``score_continuations(contexts,
            continuations)`` (``hf``'s :meth:`serl.rollout.engine.HFEngine.score_continuations`).
        tokenizer: the policy tokenizer.
        free_text_actions: the env's free-text action prefixes (e.g. ``("search[",)``).
        eos_id: the end-of-turn token a chosen reply ends with (the tokenizer's eos).
        eos_ids: every token that ends a sampled reply (the engine's).

    Raises:
        ConfigError: the engine cannot score continuations.
    """

    def __init__(self, engine: "RolloutEngine", tokenizer: "PreTrainedTokenizerBase",
                 free_text_actions: Sequence[str] = (), eos_id: Optional[int] = None,
                 eos_ids: Sequence[int] = ()):
        if getattr(engine, "score_continuations", None) is None:
            raise ConfigError(f"rollout.action_selection=score needs an engine that scores continuations "
                              f"(rollout.engine=hf); {type(engine).__name__} does not")
        self.engine, self.tokenizer = engine, tokenizer
        self.free_text_actions = tuple(free_text_actions)
        self.eos_id = tokenizer.eos_token_id if eos_id is None else eos_id
        self.eos_ids = tuple(eos_ids) or (self.eos_id,)
        self._steps = self._scored = self._kept = self._candidates = 0

    def select(self, prompts: list[list[int]], responses: list[list[int]], sampled_actions: list[str],
               admissible: list[list[str]], greedy: bool, temperature: float) -> list[Optional[list[int]]]:
        """Per reply, the chosen reply's ids, or None where the sampled reply stays.

        Args:
            prompts: ``B`` prompt id lists (what the reply continues).
            responses: ``B`` sampled replies.
            sampled_actions: ``B`` actions parsed from them (for the free-text rule and the count).
            admissible: ``B`` lists of the env's admissible commands.
            greedy, temperature: the rollout's sampling (:func:`choose`).
        """
        out: list[Optional[list[int]]] = [None] * len(responses)
        jobs = []
        for b, (resp, sampled, acts) in enumerate(zip(responses, sampled_actions, admissible)):
            self._steps += 1
            closed = [a for a in dict.fromkeys(acts) if not is_free_text(a, self.free_text_actions)]
            if not closed or (len(closed) < len(set(acts)) and is_free_text(sampled, self.free_text_actions)):
                continue
            split = split_reply(resp, self.tokenizer, self.eos_ids)
            conts = [candidate_ids(self.tokenizer, split, a, self.eos_id) for a in closed]
            jobs.append((b, split, closed, conts))
        if not jobs:
            return out
        scores = self.engine.score_continuations([prompts[b] + split.prefix_ids for b, split, _, _ in jobs],
                                                 [conts for _, _, _, conts in jobs])
        for (b, split, closed, conts), lps in zip(jobs, scores):
            k = choose(torch.tensor([sum(x) for x in lps], dtype=torch.float64), greedy, temperature)
            out[b] = split.prefix_ids + conts[k]
            self._scored += 1
            self._kept += closed[k].strip().lower() == sampled_actions[b].strip().lower()
            self._candidates += len(closed)
        return out

    def metrics(self) -> dict[str, float]:
        """The counts since the last call (module docstring), then zeroed; ``{}`` with no step."""
        if not self._steps:
            return {}
        out = {"rollout/scored_action_fraction": self._scored / self._steps}
        if self._scored:
            out["rollout/score_kept_sampled_fraction"] = self._kept / self._scored
            out["rollout/score_candidates_mean"] = self._candidates / self._scored
        self._steps = self._scored = self._kept = self._candidates = 0
        return out


def check_config(action_selection: str, engine: str) -> None:
    """``rollout.action_selection``: one of :data:`ACTION_SELECTIONS`; ``score`` only with an
    engine that scores continuations (``hf``; ``auto`` then resolves to one,
    :func:`serl.rollout.engine.resolve_engine_name`; vLLM's engine does not score them yet).
    Called by :func:`serl.configure.check_config`.

    Raises:
        ConfigError: naming ``rollout.action_selection``.
    """
    from serl.rollout.engine import ENGINE_REGISTRY

    if action_selection not in ACTION_SELECTIONS:
        raise ConfigError(f"rollout.action_selection: unknown value {action_selection!r}; valid: "
                          f"{list(ACTION_SELECTIONS)}")
    if action_selection == "score" and engine in ENGINE_REGISTRY and not ENGINE_REGISTRY[engine].scores_continuations:
        scoring = [n for n, spec in ENGINE_REGISTRY.items() if spec.scores_continuations]
        raise ConfigError(f"rollout.action_selection: score needs rollout.engine={'|'.join(scoring)} or auto (the "
                          f"{engine} engine does not score continuations yet)")
