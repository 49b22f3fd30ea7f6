"""Action projection and action-token masks on real SmolLM2 tokenizer output."""

from __future__ import annotations

from serl.agent.parsing import action_char_spans, action_token_mask, project_action, token_char_offsets


def _ids(tok, text, eos=True):
    ids = tok(text, add_special_tokens=False).input_ids
    return ids + [tok.eos_token_id] if eos else ids


def _action_text(tok, ids, mask):
    return "".join(tok.decode([i]) for i, m in zip(ids, mask) if m)


def test_project_action_well_formed():
    assert project_action("<think>go</think><action>Go To Fridge 1</action>") == ("go to fridge 1", True)


def test_project_action_missing_tags_falls_back_to_tail():
    text = "I will go to the fridge now and open it please"
    action, valid = project_action(text, fallback_chars=30)
    assert valid is False
    assert action == text.lower()[-30:].strip()
    action, valid = project_action("<think>x</think> click[buy now]", fallback_chars=20)
    assert valid is False and action == "x</think> click[buy now]"[-20:].strip()


def test_project_action_needs_think_and_no_cjk():
    assert project_action("<action>look</action>") == ("look", False)
    assert project_action("<think>看</think><action>look</action>") == ("look", False)
    assert project_action("<think>a</think><action>look</action>")[1] is True


def test_mask_marks_exactly_the_action_content(tokenizer):
    text = "<think>The apple is in the fridge.</think>\n<action>go to fridge 1</action>"
    ids = _ids(tokenizer, text)
    decoded, mask = action_token_mask(ids, tokenizer)
    assert decoded == text
    assert len(mask) == len(ids)
    assert _action_text(tokenizer, ids, mask) == "go to fridge 1"
    assert mask[-1] == 0  # EOS is a format token


def test_mask_broken_opening_tag(tokenizer):
    text = "<think>ok</think> action>take apple 1 from table 1</action>"
    ids = _ids(tokenizer, text)
    _, mask = action_token_mask(ids, tokenizer)
    assert _action_text(tokenizer, ids, mask).strip() == "take apple 1 from table 1"


def test_mask_unclosed_action_runs_to_end(tokenizer):
    text = "<think>ok</think><action>open drawer 2"
    ids = _ids(tokenizer, text, eos=False)
    _, mask = action_token_mask(ids, tokenizer)
    assert _action_text(tokenizer, ids, mask) == "open drawer 2"


def test_mask_missing_tags_marks_nothing(tokenizer):
    ids = _ids(tokenizer, "I think I should look around the room.")
    _, mask = action_token_mask(ids, tokenizer)
    assert sum(mask) == 0


def test_mask_webshop_fallback(tokenizer):
    text = "<think>buy it</think> click[buy now]"
    ids = _ids(tokenizer, text)
    _, mask = action_token_mask(ids, tokenizer)
    assert _action_text(tokenizer, ids, mask).strip() == "click[buy now]"


def test_offsets_follow_sampled_ids_not_retokenisation(tokenizer):
    # A non-canonical tokenisation of "<action>look</action>": "look" spelled as single
    # characters. Re-tokenising the decoded text would give different ids; our offsets come from
    # the sampled ids, so each character token of the action is marked.
    pieces = ["<think>", "a", "</think>", "<action>"]
    ids = []
    for p in pieces:
        ids += tokenizer(p, add_special_tokens=False).input_ids
    letters = [tokenizer.convert_tokens_to_ids(c) for c in "look"]
    ids += letters + tokenizer("</action>", add_special_tokens=False).input_ids
    assert tokenizer("<think>a</think><action>look</action>", add_special_tokens=False).input_ids != ids
    text, mask = action_token_mask(ids, tokenizer)
    assert text == "<think>a</think><action>look</action>"
    marked = [i for i, m in zip(ids, mask) if m]
    assert marked == letters


def test_offsets_with_split_multibyte_character(tokenizer):
    text = "<think>冰箱 é</think><action>look</action>"
    ids = _ids(tokenizer, text)
    decoded, offsets = token_char_offsets(ids, tokenizer)
    assert decoded == text
    assert offsets[-1][1] == len(text)
    assert all(e >= s for s, e in offsets)
    assert all(offsets[k][0] == offsets[k - 1][1] for k in range(1, len(offsets)))
    _, mask = action_token_mask(ids, tokenizer)
    assert _action_text(tokenizer, ids, mask) == "look"


def test_action_spans_union_and_merge():
    text = "<action>a</action> [action>b</action>]"
    spans = action_char_spans(text)
    assert [text[s:e] for s, e in spans] == ["a", "b"]
