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


def test_eval_runs_with_an_adapter(tiny_model_dir, adapter_dir, tmp_path, capsys):
    import json

    from serl.cli import main

    rc = main(["eval", f"model.path={tiny_model_dir}", f"model.adapter={adapter_dir[0]}", "env.max_steps=1",
               "data.max_response_length=8", "trainer.progress=false", "--num-tasks", "1", "--greedy",
               "--out", str(tmp_path / "eval")])
    assert rc == 0
    # the summary and metrics.json name the adapter merged into the model, not the base alone
    assert f"model {tiny_model_dir} + adapter {adapter_dir[0]}" in capsys.readouterr().out
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["adapter"] == str(adapter_dir[0])


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


def _rng_draws() -> tuple:
    import random

    import numpy as np

    return torch.rand(4).tolist(), random.random(), float(np.random.rand())


def test_building_a_cached_folder_leaves_the_rngs_as_they_were(tmp_path):
    """A build that draws random numbers (PEFT's new ``nn.Linear`` layers initialise themselves)
    leaves Python's, NumPy's and torch's generators as they were, also when it fails."""
    import random

    import numpy as np

    from serl.models.loading import _build_folder_once
    from serl.utils import set_seed

    def write(tmp):
        torch.rand(1000), random.random(), np.random.rand(7)
        (tmp / "config.json").write_text("{}")

    set_seed(3)
    expected = _rng_draws()
    set_seed(3)
    _build_folder_once(tmp_path / "built", write)
    assert _rng_draws() == expected

    def failing(tmp):
        torch.rand(5), random.random(), np.random.rand(3)
        raise RuntimeError("conversion failed")

    set_seed(3)
    with pytest.raises(RuntimeError, match="conversion failed"):
        _build_folder_once(tmp_path / "failed", failing)
    assert _rng_draws() == expected


def test_first_run_samples_as_a_cached_run(tiny_model_dir, adapter_dir, tmp_path, monkeypatch):
    """Issue 44: seeded as ``serl train`` is (seed, resolve ``model.path``, load, sample), a run
    that merges the adapter into the cache samples exactly what a later run, which finds the merged
    folder, samples; the folder it loads holds the weights of the in-memory merge, bit for bit."""
    from serl.models.loading import load_tokenizer, merge_adapter_once
    from serl.utils import set_seed

    monkeypatch.setenv("SERL_CACHE", str(tmp_path / "cache"))
    folder, _ = adapter_dir

    def run():
        set_seed(0)
        path = merge_adapter_once(str(tiny_model_dir), str(folder), name="m")
        tok = load_tokenizer(str(path))
        model = load_causal_lm(str(path), torch.float32, "cpu")
        ids = torch.tensor([tok.encode("put a mug in the microwave")])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=12,
                             pad_token_id=tok.pad_token_id)
        return path, model.state_dict(), out[0].tolist()

    first_path, first_weights, first = run()  # builds the merged folder
    cached_path, cached_weights, cached = run()  # finds it
    assert cached_path == first_path
    assert first == cached
    in_memory = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu", adapter=str(folder)).state_dict()
    assert set(first_weights) == set(cached_weights) == set(in_memory)
    for k, v in in_memory.items():
        assert first_weights[k].dtype == v.dtype and torch.equal(first_weights[k], v), k
        assert torch.equal(cached_weights[k], v), k
