"""benchmarks/alfworld_layout.py --expert-rows: the trainer's update on the same episodes in both
prompt layouts, read from `serl data expert` rows of any env (here WebShop, on the tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT


def _expert_rows(tokenizer, tmp_path, n=2):
    from serl.envs.webshop.env import WebShopEnv
    from serl.rollout.expert import make_expert, play_expert

    tasks, env = WebShopEnv.list_tasks("test")[:n], WebShopEnv()
    paths = {}
    try:
        for layout in ("step", "conversation"):
            rows = [r for t in tasks for r in play_expert(env, t, make_expert(t, seed=0), tokenizer, 2, 8000, 15,
                                                          layout, "all").rows]
            paths[layout] = tmp_path / f"{layout}.jsonl"
            paths[layout].write_text("".join(json.dumps(r) + "\n" for r in rows))
    finally:
        env.close()
    return paths


def test_expert_episodes_cut_the_chat_after_each_reply(tokenizer, tmp_path):
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        from alfworld_layout import expert_episodes
    finally:
        sys.path.pop(0)
    paths = _expert_rows(tokenizer, tmp_path)
    eps = expert_episodes(tokenizer, str(paths["step"]), str(paths["conversation"]), 5)
    assert len(eps) == 2
    for ep in eps:
        step, conv = ep["rows"]["step"], ep["rows"]["conversation"]
        assert len(step) == len(conv) >= 3
        assert conv[0] == step[0]  # the chat's first turn is the step layout's first prompt and reply
        for (p, r), (nxt, _) in zip(conv, conv[1:]):
            assert nxt[: len(p) + len(r)] == p + r and r[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_layout_script_times_expert_rows_of_both_layouts(tiny_model_dir, tokenizer, tmp_path):
    paths = _expert_rows(tokenizer, tmp_path)
    out = tmp_path / "res.json"
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "alfworld_layout.py"), "--parts", "update",
           "--recipe", "cpu_learn_webshop", "--expert-rows", str(paths["step"]), str(paths["conversation"]),
           "--update-episodes", "2", "--repeats", "1", "--profile", "--out", str(out),
           "--set", f"model.path={tiny_model_dir}", "model.lora.r=0", "env.num_workers=1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    upd = json.loads(out.read_text())["update"]
    steps = sum(1 for _ in paths["step"].open())
    assert upd["step"]["rows"] == steps and upd["conversation"]["rows"] == 2
    assert upd["conversation"]["tokens_per_episode"] < upd["step"]["tokens_per_episode"]
    assert upd["ratio_conversation_over_step"] > 0 and len(upd["step"]["seconds"]) == 1
    for layout in ("step", "conversation"):  # --profile: one more update, its operators by kind
        prof = upd[layout]["profile_seconds"]
        assert prof["wall"] > 0 and prof["gemm"] > 0
        assert set(prof) <= {"wall", "gemm", "attention", "elementwise", "other"}
