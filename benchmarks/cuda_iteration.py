"""One ``serl train`` iteration on a GPU with a randomly initialised model of a real shape.

No hub access is needed: the model is built from a config (``--shape``) with random weights and
saved next to a tokenizer folder you give (``--tokenizer``; e.g. the SmolLM2 tokenizer files that
``serl train`` caches in ``~/.cache/serl/models/smollm2-135m-instruct-*``). The model's vocabulary
is the tokenizer's, so sampled ids always decode; with SmolLM2's tokenizer that is 49,152 entries
instead of Qwen2.5's 151,936 (the script prints the parameter count it actually ran).

A random model writes no valid action, so every reward is equal and every advantage is 0; the
rollout, SERL's teacher scoring and the update still do all their work (no filter is on), which
is what this script times. It prints, per phase: wall seconds, sampled tokens/s of the rollout,
(prompt + response) tokens/s of the update, the update's MFU against a bf16 matmul peak measured
in the same run (8192³, model FLOPs ``6 · N · tokens``, attention not counted), and the peak GPU
memory (``torch.cuda.max_memory_allocated``).

    python benchmarks/cuda_iteration.py --tokenizer TOKDIR --shape qwen2.5-1.5b \\
        recipe=webshop data.train_batch_size=8 env.rollout.n=8

Extra ``key=value`` arguments go to ``serl train`` (after this script's own device/model keys).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

#: model shapes (Hugging Face config fields) of public checkpoints, vocabulary excluded
SHAPES = {
    # Qwen/Qwen2.5-1.5B-Instruct config.json
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    # Qwen/Qwen2.5-7B-Instruct config.json
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
}


def build_random_model(shape: str, tokenizer_dir: Path, out: Path, seed: int = 0) -> int:
    """Save a randomly initialised causal LM of ``shape`` with the tokenizer of ``tokenizer_dir``
    into ``out`` (bf16 safetensors). Returns the parameter count (tied weights once)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    fields = dict(SHAPES[shape])
    cfg = AutoConfig.for_model(fields.pop("model_type"), vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **fields)
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    n = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return n


def matmul_peak_tflops(n: int = 8192, reps: int = 10) -> float:
    """Measured bf16 ``n³`` matmul rate in TFLOP/s (3 warm-ups, mean of ``reps``)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


def main() -> int:
    """Build the model, run one iteration in this process, print the figures as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="also write the figures to this JSON file")
    args, overrides = ap.parse_known_args()
    if not torch.cuda.is_available():
        print("cuda_iteration: no CUDA device", file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="serl_cuda_"))
    t0 = time.time()
    n_params = build_random_model(args.shape, args.tokenizer, work / "model")
    build_s = time.time() - t0
    peak = matmul_peak_tflops()
    torch.cuda.reset_peak_memory_stats()

    from serl.cli import main as serl_main

    argv = ["train", *overrides, f"model.path={work / 'model'}", "trainer.device=cuda",
            "trainer.total_training_steps=1", f"trainer.output_dir={work / 'runs'}", "trainer.run_name=cuda"]
    t0 = time.time()
    rc = serl_main(argv)
    wall = time.time() - t0
    if rc != 0:
        print(f"cuda_iteration: serl train exited with {rc}", file=sys.stderr)
        return rc
    m = [json.loads(line) for line in open(work / "runs" / "cuda" / "metrics.jsonl")][-1]
    upd_tok_s = m["throughput/update_tokens_per_s"]
    figures = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape,
        "params": n_params, "argv": argv, "build_model_s": round(build_s, 1),
        "bf16_matmul_peak_tflops": round(peak, 1), "serl_train_wall_s": round(wall, 1),
        "rollout_s": m["timing/rollout_s"], "teacher_s": m["timing/teacher_s"],
        "reference_s": m["timing/reference_s"], "update_s": m["timing/update_s"],
        "step_rows": m["episode/num_step_rows"], "prompt_length_mean": m["prompt_length/mean"],
        "response_length_mean": m["response_length/mean"], "response_tokens": m["throughput/response_tokens"],
        "rollout_sampled_tokens_per_s": m["throughput/response_tokens"] / m["timing/rollout_s"],
        "update_tokens_per_s": upd_tok_s,
        "update_mfu": 6 * n_params * upd_tok_s / (peak * 1e12),
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
    }
    text = json.dumps(figures, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
