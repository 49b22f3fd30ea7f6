"""model.adapter: a PEFT LoRA adapter merged into the model at load (train, eval and sft)."""

from __future__ import annotations

import pytest
import torch

from serl.errors import ModelLoadError
from serl.models.loading import load_causal_lm, resolve_adapter_path


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    from peft import LoraConfig, get_peft_model

    from serl.models.lora import peft_wrapping

    base = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    torch.manual_seed(0)
    with peft_wrapping():  # PEFT's own deprecated read (serl.models.lora.peft_wrapping)
        peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     init_lora_weights=False))
    out = tmp_path_factory.mktemp("adapter") / "a"
    peft_model.save_pretrained(out)
    merged = peft_model.merge_and_unload()
    return out, {k: v.clone() for k, v in merged.state_dict().items()}


def test_adapter_is_merged_at_load(tiny_model_dir, adapter_dir):
    folder, expected = adapter_dir
    plain = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu", adapter=str(folder))
    got = model.state_dict()
    assert set(got) == set(expected)  # a plain model: no lora_ parameters left
    for k, v in expected.items():
        assert torch.allclose(got[k], v, atol=1e-6), k
    changed = [k for k in got if not torch.equal(got[k], plain.state_dict()[k])]
    assert changed and all("q_proj" in k or "v_proj" in k for k in changed)


def test_bad_adapter_is_a_clear_error(tiny_model_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="no such folder"):
        resolve_adapter_path(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="not a PEFT adapter"):
        load_causal_lm(str(tiny_model_dir), torch.float32, "cpu", adapter=str(tmp_path / "empty"))


def test_eval_runs_with_an_adapter(tiny_model_dir, adapter_dir, tmp_path):
    from serl.cli import main

    rc = main(["eval", f"model.path={tiny_model_dir}", f"model.adapter={adapter_dir[0]}", "env.max_steps=1",
               "data.max_response_length=8", "trainer.progress=false", "--num-tasks", "1", "--greedy",
               "--out", str(tmp_path / "eval")])
    assert rc == 0 and (tmp_path / "eval" / "metrics.json").exists()


def test_merged_cache_is_keyed_on_base_and_adapter(tiny_model_dir, adapter_dir, tmp_path, monkeypatch, capfd):
    """`merge_adapter_once` writes one folder per (base, adapter) pair: the same pair reuses it, a
    different base with the same adapter gets its own merge (a stale merge is never served). The
    merge prints no transformers progress bar ("Writing model shards")."""
    import shutil

    from serl.models.loading import merge_adapter_once

    monkeypatch.setenv("SERL_CACHE", str(tmp_path / "cache"))
    folder, expected = adapter_dir
    capfd.readouterr()
    first = merge_adapter_once(str(tiny_model_dir), str(folder), name="m")
    assert "Writing model shards" not in capfd.readouterr().err
    assert merge_adapter_once(str(tiny_model_dir), str(folder), name="m") == first
    other_base = tmp_path / "base2"
    shutil.copytree(tiny_model_dir, other_base)
    second = merge_adapter_once(str(other_base), str(folder), name="m")
    assert second != first and second.parent == first.parent
    got = load_causal_lm(str(first), torch.float32, "cpu").state_dict()
    assert all(torch.allclose(got[k], v, atol=1e-6) for k, v in expected.items())
