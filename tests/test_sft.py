"""`serl sft`: reply-only loss mask, learning on a fixed batch, full vs LoRA, bit-identical resume,
and an output folder that `serl eval` loads (tiny random model, synthetic expert rows)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from serl.agent.chat import chat_prompt_ids
from serl.cli import main
from serl.configure import load_config
from serl.errors import ConfigError, SerlError
from serl.train.sft import (SFTExample, SFTTrainer, collate_sft, encode_row, lr_at, read_rows,
                            reply_match_counts, reply_token_nll, step_rows)


def _rows(n: int = 6) -> list[dict]:
    objs = ["apple", "mug", "book", "key", "pen", "cup", "egg", "box"]
    return [{"env": "alfworld", "task_id": f"t{i}", "task_type": "pick_and_place_simple", "step": i,
             "messages": [{"role": "user", "content": f"Your task is to: put a {objs[i % 8]} in fridge 1.\n"
                                                      f"Admissible actions: [go to fridge 1, take {objs[i % 8]} {i}]"}],
             "response": f"<think>I must find the {objs[i % 8]}.</think><action>take {objs[i % 8]} {i}</action>",
             "action": f"take {objs[i % 8]} {i}", "won": True, "episode_reward": 10.0} for i in range(n)]


@pytest.fixture()
def rows_file(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    return p


def _cfg(model_dir, out, data, *extra):
    cfg = load_config("cpu", [f"model.path={model_dir}", f"trainer.output_dir={out}", "trainer.run_name=run",
                              "trainer.progress=false", "trainer.logger=[jsonl]", "model.gradient_checkpointing=false",
                              "model.lora.r=0", *extra])  # full fine-tuning unless a test asks for LoRA
    cfg.sft.data = str(data)
    return cfg


def test_prompt_and_target_tokens_are_the_rollouts(tokenizer):
    row = _rows(1)[0]
    ex = encode_row(tokenizer, row, max_prompt_length=2048, max_response_length=512)
    assert ex.prompt_ids == chat_prompt_ids(tokenizer, row["messages"][0]["content"])
    assert tokenizer.decode(ex.target_ids) == row["response"] + "<|im_end|>"
    assert ex.target_ids[-1] == tokenizer.eos_token_id and not ex.prompt_truncated
    cut = encode_row(tokenizer, row, max_prompt_length=16, max_response_length=5)
    assert cut.prompt_ids == ex.prompt_ids[-16:] and cut.target_ids == ex.target_ids[:5]
    assert cut.prompt_truncated and cut.response_truncated


def test_only_reply_tokens_carry_loss(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    exs = [SFTExample([5, 6, 7, 8, 9], [10, 11, 2]), SFTExample([12, 13], [14, 15, 16, 17, 2])]
    batch = collate_sft(exs, pad_id=2)
    assert batch.response_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch.attention_mask.sum(1).tolist() == [8, 7]
    with torch.no_grad():
        nll = reply_token_nll(model, batch)
        for b, e in enumerate(exs):  # reference: the unpadded row, a plain forward
            ids = torch.tensor([e.prompt_ids + e.target_ids])
            logp = model(input_ids=ids).logits[0].float().log_softmax(-1)
            P, T = len(e.prompt_ids), len(e.target_ids)
            ref = -logp[torch.arange(P - 1, P + T - 1), torch.tensor(e.target_ids)]
            assert torch.allclose(nll[b, :T], ref, atol=1e-4), b
            assert torch.all(nll[b, T:] == 0)
    # changing a padded-away target id changes nothing: the mask, not the id, decides
    batch.response_ids[0, 3:] = 99
    with torch.no_grad():
        assert torch.equal(reply_token_nll(model, batch), nll)


def test_loss_falls_on_a_fixed_batch(tiny_model_dir, tmp_path, rows_file):
    cfg = _cfg(tiny_model_dir, tmp_path, rows_file, "sft.batch_size=6", "sft.micro_batch_size=4",
               "sft.lr=3e-3", "sft.warmup_steps=0", "sft.lr_scheduler=constant")
    tr = SFTTrainer(cfg)
    before = tr.evaluate(tr.examples)["val/loss"]
    losses = [tr.train_step()["sft/loss"] for _ in range(4)]
    after = tr.evaluate(tr.examples)["val/loss"]
    assert losses[0] == pytest.approx(before, rel=0.02)  # same rows, no dropout in the base model
    assert after < before - 0.5, (before, losses, after)


def test_reply_match_counts_by_hand():
    """Each run of loss tokens in a row is one reply; it is exact when every token is a hit. Runs
    never join across rows, and hits where the mask is 0 count for nothing."""
    mask = torch.tensor([[1, 1, 0, 1, 1, 0, 1], [1, 1, 1, 0, 0, 0, 0]])
    hits = torch.tensor([[1, 1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    # row 0: replies [0:2] exact, [3:5] one miss, [6] exact (a run at the row's end); row 1: [0:3] exact
    assert reply_match_counts(hits, mask) == {"tokens": 8, "correct_tokens": 7, "replies": 4, "exact_replies": 3}
    # row 0 ends in a run and row 1 starts with one: two replies, not one
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    hits = torch.tensor([[0, 1, 1], [0, 1, 1]], dtype=torch.bool)
    assert reply_match_counts(hits, mask) == {"tokens": 4, "correct_tokens": 3, "replies": 2, "exact_replies": 1}


def test_reply_exact_is_what_greedy_decoding_writes(tiny_model_dir, tmp_path, rows_file):
    """A target the model writes greedily from its prompt is an exact reply (every token its
    argmax); the same target with its last token changed is not, and loses one token's accuracy."""
    tr = SFTTrainer(_cfg(tiny_model_dir, tmp_path, rows_file))
    prompt = tr.examples[0].prompt_ids
    with torch.no_grad():
        out = tr.model.eval().generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                       max_new_tokens=6, min_new_tokens=6, do_sample=False)
    greedy = out[0, len(prompt):].tolist()
    other = greedy[:-1] + [(greedy[-1] + 1) % tr.model.config.vocab_size]
    assert tr.evaluate([SFTExample(prompt, greedy)]) | {"val/loss": 0} == \
        {"val/loss": 0, "val/token_accuracy": 1.0, "val/reply_exact": 1.0}
    m = tr.evaluate([SFTExample(prompt, greedy), SFTExample(prompt, other)])
    assert m["val/token_accuracy"] == pytest.approx(11 / 12) and m["val/reply_exact"] == 0.5


def test_eval_on_start_and_an_evaluation_only_run(tiny_model_dir, tmp_path, rows_file, capsys):
    """sft.eval_on_start logs the start model's held-out metrics at step 0; sft.max_steps=0 with it
    only evaluates (no model written); max_steps=0 without held-out data is a config error."""
    base = ["sft", "--data", str(rows_file), f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}",
            "trainer.progress=false", "trainer.logger=[jsonl]", "model.lora.r=2", f"sft.val_data={rows_file}",
            "sft.eval_on_start=true", "sft.batch_size=3"]
    assert main([*base, "trainer.run_name=train", "sft.max_steps=2", "sft.eval_freq=1"]) == 0
    logged = [json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in logged] == [0, 1, 2] and "sft/loss" not in logged[0]
    assert all({"val/loss", "val/token_accuracy", "val/reply_exact"} <= r.keys() for r in logged)
    capsys.readouterr()
    assert main([*base, "trainer.run_name=eval", "sft.max_steps=0"]) == 0
    out = capsys.readouterr().out
    assert "evaluated the model of optimizer step 0 on 6 held-out rows" in out
    only = [json.loads(x) for x in (tmp_path / "eval" / "metrics.jsonl").read_text().splitlines()]
    keys = ("iteration", "val/loss", "val/token_accuracy", "val/reply_exact")
    assert [{k: r[k] for k in keys} for r in only] == [{k: logged[0][k] for k in keys}]  # the same start model
    assert not (tmp_path / "eval" / "model").exists()
    # a checkpoint of an unfinished run, evaluated: logged at its step, and still no model folder
    assert main([*base, "trainer.run_name=part", "sft.max_steps=3", "sft.save_freq=1", "sft.eval_on_start=false"]) == 0
    shutil.rmtree(tmp_path / "part" / "model")
    assert main(["sft", "--resume", str(tmp_path / "part"), "sft.max_steps=0", "sft.eval_on_start=true"]) == 0
    assert "evaluated the model of optimizer step 3" in capsys.readouterr().out
    assert not (tmp_path / "part" / "model").exists()
    assert main(["sft", "--data", str(rows_file), f"trainer.output_dir={tmp_path}", "sft.max_steps=0"]) == 2
    assert "sft.max_steps" in capsys.readouterr().err


def _base_params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_full_finetuning_changes_the_weights_and_exports(tiny_model_dir, tmp_path, rows_file):
    cfg = _cfg(tiny_model_dir, tmp_path, rows_file, "sft.max_steps=2", "sft.batch_size=3", "sft.lr=1e-3")
    tr = SFTTrainer(cfg)
    before = _base_params(tr.model)
    out = tr.train()
    assert all(p.requires_grad for p in tr.model.parameters())
    saved = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    changed = [k for k in before if not torch.equal(before[k], saved[k])]
    assert "model.layers.0.self_attn.q_proj.weight" in changed and "model.embed_tokens.weight" in changed
    assert not (tmp_path / "run" / "adapter").exists()
    prov = json.loads((tmp_path / "run" / "model" / "serl_sft.json").read_text())
    assert prov["optimizer_steps"] == 2 and prov["lora"] is None and len(prov["data_sha256"]) == 64
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == [1, 2]
    assert {"sft/loss", "sft/lr", "perf/tokens_per_s", "perf/rows_per_min"} <= set(json.loads(lines[0]))
    # the speed train() returns is over both steps: total rows (2 x 3) / total step time
    steps = [json.loads(x) for x in lines]
    assert out["perf/mean_rows_per_min"] == pytest.approx(60.0 * 6 / sum(m["perf/step_s"] for m in steps))
    assert out["perf/mean_tokens_per_s"] == pytest.approx(
        sum(m["perf/tokens_per_s"] * m["perf/step_s"] for m in steps) / sum(m["perf/step_s"] for m in steps))


def test_lora_trains_only_adapters_then_merges(tiny_model_dir, tmp_path, rows_file):
    cfg = _cfg(tiny_model_dir, tmp_path, rows_file, "sft.max_steps=2", "sft.batch_size=3", "sft.lr=1e-2",
               "model.lora.r=4", "model.lora.target_modules=[q_proj,v_proj]")
    tr = SFTTrainer(cfg)
    before = _base_params(tr.model)
    for _ in range(2):
        tr.train_step()
    after = _base_params(tr.model)
    trainable = {n for n, p in tr.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any(not torch.equal(before[n], after[n]) for n in trainable)
    assert all(torch.equal(before[n], after[n]) for n in before if n not in trainable)  # base frozen
    tr.step = tr.total_steps
    model_dir = tr.export_model()
    merged = load_file(str(model_dir / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert not any("lora" in k for k in merged)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(merged["model.layers.0.self_attn.k_proj.weight"], base["model.layers.0.self_attn.k_proj.weight"])
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").exists()


def test_resume_is_bit_identical(tiny_model_dir, tmp_path, rows_file):
    extra = ["sft.max_steps=4", "sft.batch_size=4", "sft.micro_batch_size=2", "sft.save_freq=2", "sft.lr=1e-2",
             "model.lora.r=4", "model.lora.dropout=0.2"]  # dropout: the RNG must be restored too
    SFTTrainer(_cfg(tiny_model_dir, tmp_path / "a", rows_file, *extra)).train()
    tr = SFTTrainer(_cfg(tiny_model_dir, tmp_path / "b", rows_file, *extra))
    for _ in range(2):
        tr.train_step()
    tr.save()
    tr.train_step()  # progress after the checkpoint is lost by the "crash" below
    del tr
    assert main(["sft", "--resume", str(tmp_path / "b" / "run")]) == 0
    a = load_file(str(tmp_path / "a" / "run" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "run" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(x)["iteration"] for x in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 4]  # the resumed run logs from the restored step on
    # a finished run resumes as a no-op
    assert main(["sft", "--resume", str(tmp_path / "b" / "run")]) == 0


def test_a_stopped_run_saves_its_last_finished_step(tiny_model_dir, tmp_path, rows_file, capsys):
    """Ctrl-C or SIGTERM in step 3 of a run that saves only at the end (sft.save_freq=0): step 2 is
    saved, and --resume finishes bit-identically to a run never stopped. Stopped again before a new
    step ends, nothing more is written and it says which checkpoint stands."""
    from serl.cli import Terminated

    extra = ["sft.max_steps=4", "sft.batch_size=4", "sft.micro_batch_size=2", "sft.save_freq=0", "sft.lr=1e-2",
             "model.lora.r=4", "trainer.progress=false"]
    SFTTrainer(_cfg(tiny_model_dir, tmp_path / "a", rows_file, *extra)).train()
    tr = SFTTrainer(_cfg(tiny_model_dir, tmp_path / "b", rows_file, *extra))
    step, calls = tr.train_step, []

    def stopping(**kw):
        calls.append(1)
        if len(calls) == 3:
            raise Terminated()
        return step(**kw)

    tr.train_step = stopping
    with pytest.raises(Terminated):
        tr.train()
    run = tmp_path / "b" / "run"
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_0000002"]
    assert "step 2 saved to" in capsys.readouterr().err
    from serl.configure import load_run_config

    tr2 = SFTTrainer(load_run_config(run, []), run_dir=run, resume=True)
    tr2.train_step = lambda **kw: (_ for _ in ()).throw(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        tr2.train()
    assert "the last checkpoint of step 2 stands" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_0000002"]
    assert main(["sft", "--resume", str(run)]) == 0
    a = load_file(str(tmp_path / "a" / "run" / "model" / "model.safetensors"))
    b = load_file(str(run / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_progress_moves_inside_a_step(tiny_model_dir, tmp_path, rows_file, monkeypatch):
    """A step of several micro-batches reports each one's rows (the bar's ``row k/n`` postfix), and
    the postfix shows them beside the last step's loss."""
    from serl.train.sft import _RowsPostfix

    tr = SFTTrainer(_cfg(tiny_model_dir, tmp_path, rows_file, "sft.batch_size=5", "sft.micro_batch_size=2"))
    seen = []
    tr.train_step(on_rows=lambda done, total: seen.append((done, total)))
    assert seen == [(2, 5), (4, 5), (5, 5)]

    class Bar:
        postfix, drawn = "", 0

        def set_postfix_str(self, s, refresh=True):
            self.postfix = s

        def refresh(self):
            self.drawn += 1

    import serl.train.sft as sft_module

    for boot_s in (0.5, 7 * 86400.0):  # a machine up half a second (monotonic() counts from boot), and a week
        clock = [boot_s]
        monkeypatch.setattr(sft_module.time, "monotonic", lambda: clock[0])
        bar = Bar()
        shown = _RowsPostfix(bar, every_s=3600.0)
        shown(2, 5)
        assert bar.drawn == 1, boot_s  # the first call draws, however long the machine has been up
        shown.last = "loss 1.234, 50 tok/s"
        clock[0] += 3599.0
        shown(4, 5)
        assert bar.postfix == "row 4/5, loss 1.234, 50 tok/s" and bar.drawn == 1  # redrawn once an hour here
        clock[0] += 1.0
        shown(5, 5)
        assert bar.postfix == "row 5/5, loss 1.234, 50 tok/s" and bar.drawn == 2


def test_resume_refuses_changed_data(tiny_model_dir, tmp_path, rows_file):
    tr = SFTTrainer(_cfg(tiny_model_dir, tmp_path, rows_file, "sft.max_steps=3", "sft.batch_size=3"))
    tr.train_step()
    tr.save()
    rows_file.write_text(rows_file.read_text() + json.dumps(_rows(7)[-1]) + "\n")
    from serl.errors import CheckpointError

    with pytest.raises(CheckpointError, match="changed"):
        SFTTrainer(_cfg(tiny_model_dir, tmp_path, rows_file, "sft.max_steps=3", "sft.batch_size=3"),
                   run_dir=tmp_path / "run", resume=True)


def test_cli_output_loads_in_serl_eval(tiny_model_dir, tmp_path, rows_file, capsys):
    from serl.models.loading import load_causal_lm

    rc = main(["sft", "--data", str(rows_file), f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}",
               "trainer.run_name=sft", "trainer.progress=false", "sft.max_steps=1", "sft.batch_size=2",
               "model.lora.r=2"])
    assert rc == 0
    model_dir = tmp_path / "sft" / "model"
    assert f"serl train model.path={model_dir}" in capsys.readouterr().out
    assert load_causal_lm(str(model_dir), torch.float32, "cpu").config.use_cache is True
    out = tmp_path / "eval"
    rc = main(["eval", f"model.path={model_dir}", "env.max_steps=1", "data.max_response_length=8",
               "rollout.micro_batch_size=2", "--num-tasks", "2", "--greedy", "--out", str(out)])
    assert rc == 0
    assert json.loads((out / "metrics.json").read_text())["num_tasks"] == 2


@pytest.mark.parametrize("override, key", [
    ("sft.lr=-1", "sft.lr"), ("sft.micro_batch_size=0", "sft.micro_batch_size"),
    ("sft.lr_scheduler=linear", "sft.lr_scheduler"), ("model.lora.r=-2", "model.lora.r"),
    ("model.lora.dropout=1.5", "model.lora.dropout"),
])
def test_bad_sft_config_names_the_key(rows_file, tmp_path, override, key, capsys):
    assert main(["sft", "--data", str(rows_file), override, f"trainer.output_dir={tmp_path}"]) == 2
    assert key in capsys.readouterr().err


def test_missing_or_bad_data_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(ConfigError, match="sft.data"):
        SFTTrainer(load_config("cpu", [f"trainer.output_dir={tmp_path}"]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    with pytest.raises(SerlError, match=r"bad.jsonl:1: .*response"):
        read_rows(bad)
    assert main(["sft", "--data", str(tmp_path / "nope.jsonl"), f"trainer.output_dir={tmp_path}"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_held_out_row_that_trains_nothing_names_the_held_out_file(tiny_model_dir, tmp_path, rows_file):
    """Every assistant turn of a held-out conversation at weight 0: the error names that file, not sft.data."""
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps({"messages": [{"role": "user", "content": "go"},
                                            {"role": "assistant", "content": "ok", "weight": 0}]}) + "\n")
    with pytest.raises(SerlError, match=r"SFT row 1 of .*val\.jsonl: .*no assistant token"):
        SFTTrainer(_cfg(tiny_model_dir, tmp_path, rows_file, f"sft.val_data={val}"))


def test_row_order_and_lr_schedule():
    e0, first = step_rows(10, 4, seed=3, step=0)
    _, second = step_rows(10, 4, seed=3, step=1)
    _, third = step_rows(10, 4, seed=3, step=2)
    assert e0 == 0 and len(third) == 2 and sorted(first + second + third) == list(range(10))
    e1, nxt = step_rows(10, 4, seed=3, step=3)
    assert e1 == 1 and nxt != first  # reshuffled each epoch
    assert [lr_at(s, 1.0, 2, 6, "constant") for s in range(3)] == [0.5, 1.0, 1.0]
    assert lr_at(2, 1.0, 2, 6, "cosine") == pytest.approx(1.0)
    assert lr_at(4, 1.0, 2, 6, "cosine") == pytest.approx(0.5)


def test_lora_target_modules_that_match_nothing(tiny_model_dir, tmp_path, rows_file):
    with pytest.raises(ConfigError, match="model.lora.target_modules"):
        SFTTrainer(_cfg(tiny_model_dir, tmp_path, rows_file, "model.lora.r=2", "model.lora.target_modules=[nope]"))


def test_run_folder_refused_then_overwritten_and_locked(tiny_model_dir, tmp_path, rows_file):
    """A new `serl sft` run refuses a non-empty run folder, `trainer.overwrite=true` moves it aside
    (nothing deleted), and a live run's folder is locked against a second process."""
    import subprocess
    import sys

    extra = ["sft.max_steps=1", "sft.batch_size=3"]
    SFTTrainer(_cfg(tiny_model_dir, tmp_path, rows_file, *extra)).train()
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        SFTTrainer(_cfg(tiny_model_dir, tmp_path, rows_file, *extra))
    tr = SFTTrainer(_cfg(tiny_model_dir, tmp_path, rows_file, *extra, "trainer.overwrite=true"))
    old = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(old) == 1 and (old[0] / "model" / "model.safetensors").exists()
    assert (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "model").exists()
    code = ("import sys; from serl.train.run_dir import RunLock\n"
            "try:\n    RunLock.acquire(sys.argv[1])\nexcept Exception as e:\n    print(e); sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True)
    assert r.returncode == 3 and "in use by another serl process" in r.stdout, r.stdout + r.stderr
    tr.train()  # train() releases the lock when it ends
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_failed_start_leaves_no_run_folder(tmp_path, rows_file):
    cfg = _cfg(tmp_path / "no-such-model", tmp_path / "out", rows_file, "sft.max_steps=1")
    with pytest.raises(SerlError):
        SFTTrainer(cfg)
    assert not (tmp_path / "out" / "run").exists()
