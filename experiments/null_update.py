"""A null control for a learning leg's panel: a run's LoRA update, the same size, in a random direction.

A greedy panel moves when the weights move, whatever the direction: some tasks flip one way, some
the other. To tell how much of an RL run's panel change its direction earned, evaluate the same
update with its direction randomised. This script copies the latest checkpoint of a LoRA run
(``serl train`` with ``model.lora.r > 0``) to a new run folder with every LoRA ``B`` entry's sign
flipped at random and each layer rescaled so that the update ``ΔW = B·A`` keeps its Frobenius
norm (``A``, as trained, is kept; the LoRA scale α/r is the same factor on both sides). Then evaluate both folders on one panel::

    python experiments/null_update.py RUN OUT --seed 1
    serl eval --run OUT --split gsm8k:test --num-tasks -1 --greedy --seed 1000 --out OUT/eval

and pair each with the start (``learning_stats.mcnemar_p``): the random direction's discordant
tasks are the panel's noise floor for an update of that size. Only ``policy.safetensors``,
``state.pt``, ``config.yaml`` and the ``latest`` pointer are written (no optimizer, no teacher), so
the folder serves ``serl eval --run`` and cannot be resumed as a training run.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def random_direction(state: dict[str, torch.Tensor], seed: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The LoRA state dict ``state`` with each ``*.lora_B.*`` tensor ``B`` ([out, r]) replaced by
    ``B ⊙ S · c``: ``S`` random signs (±1, from ``seed``), ``c = ‖B·A‖_F / ‖(B ⊙ S)·A‖_F`` with
    ``A`` ([r, in]) the layer's ``lora_A`` tensor, so that ``‖ΔW‖_F`` is kept (c = 0 where
    ``B ⊙ S · A`` is 0). Other tensors are returned as they are.

    Returns:
        ``(new_state, scales)``: the new state dict, and ``c`` per ``B`` tensor.

    Raises:
        ValueError: a ``lora_B`` tensor without its ``lora_A``, or no ``lora_B`` at all (not a
            LoRA checkpoint).
    """
    g = torch.Generator().manual_seed(seed)
    out, scales = dict(state), []
    for name, b in state.items():
        if ".lora_B." not in name:
            continue
        a_name = name.replace(".lora_B.", ".lora_A.")
        if a_name not in state:
            raise ValueError(f"{name}: no {a_name} in the checkpoint")
        a = state[a_name].float()
        signs = (torch.randint(0, 2, b.shape, generator=g) * 2 - 1).to(torch.float32)
        flipped = b.float() * signs
        norm = (flipped @ a).norm()
        c = float((b.float() @ a).norm() / norm) if norm > 0 else 0.0
        out[name] = (flipped * c).to(b.dtype)
        scales.append(c)
    if not scales:
        raise ValueError("no lora_B tensor: a null update needs a LoRA run (model.lora.r > 0)")
    return out, scales


def write_null_run(run: Path, out: Path, seed: int) -> list[float]:
    """Write to ``out`` (replaced if it exists) a run folder whose latest checkpoint is ``run``'s
    with its update in a random direction (:func:`random_direction`). Returns the scales ``c``.

    Raises:
        FileNotFoundError: ``run`` has no ``config.yaml`` or no latest checkpoint.
    """
    ck = run / "checkpoints"
    latest = (ck / "latest").read_text().strip() if (ck / "latest").is_file() else ""
    src = ck / latest
    if not latest or not (run / "config.yaml").is_file() or not (src / "policy.safetensors").is_file():
        raise FileNotFoundError(f"{run}: not a serl train run folder with a checkpoint (needs config.yaml, "
                                "checkpoints/latest and the policy.safetensors it names)")
    state, scales = random_direction(load_file(str(src / "policy.safetensors")), seed)
    if out.exists():
        shutil.rmtree(out)
    (out / "checkpoints" / latest).mkdir(parents=True)
    shutil.copy(run / "config.yaml", out / "config.yaml")
    shutil.copy(src / "state.pt", out / "checkpoints" / latest / "state.pt")
    save_file(state, str(out / "checkpoints" / latest / "policy.safetensors"))
    (out / "checkpoints" / "latest").write_text(latest + "\n")
    return scales


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a serl train run folder (LoRA)")
    ap.add_argument("out", type=Path, help="the new run folder (replaced if it exists)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random signs")
    a = ap.parse_args()
    scales = write_null_run(a.run, a.out, a.seed)
    print(f"{a.out}: {len(scales)} LoRA B tensors in a random direction, "
          f"rescaled by {min(scales):.3f}..{max(scales):.3f} to keep each ||B·A||_F")


if __name__ == "__main__":
    main()
