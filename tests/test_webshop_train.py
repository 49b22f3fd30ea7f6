"""`serl eval` / `serl train` with ``recipe=webshop`` run end to end (tiny random model, a few steps)."""

from __future__ import annotations

import json

from serl.cli import main
from serl.configure import load_config


def test_webshop_recipe_values():
    cfg = load_config("webshop")
    assert cfg.env.name == "webshop" and cfg.env.max_steps == 15
    assert cfg.env.train_split == "train" and cfg.env.eval_split == "test"
    assert cfg.data.max_prompt_length == 4096
    assert cfg.env.webshop == {"human_goals": False, "seed": 0}


def test_eval_webshop_recipe(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    rc = main(["eval", "recipe=webshop", f"model.path={tiny_model_dir}", "env.max_steps=2",
               "data.max_response_length=8", "rollout.micro_batch_size=2", "--num-tasks", "2", "--greedy",
               "--out", str(out)])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["num_tasks"] == 2 and "webshop_task_score" in m
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 2
    capsys.readouterr()


def test_train_webshop_recipe_one_iteration(tiny_model_dir, tmp_path):
    rc = main(["train", "recipe=webshop", f"model.path={tiny_model_dir}", "env.max_steps=2",
               "data.max_response_length=8", "data.train_batch_size=1", "env.rollout.n=2",
               "trainer.total_training_steps=1", f"trainer.output_dir={tmp_path}", "trainer.run_name=ws",
               "trainer.logger=[jsonl]", "trainer.progress=false"])
    assert rc == 0
    assert (tmp_path / "ws" / "config.yaml").is_file()
