"""Math problem sets for the "math with a code interpreter" setting: registry, loading, prompts.

Datasets (:data:`DATASETS`) and where their rows come from (provenance, licences and checksums in
``serl/data/math/SOURCE.md``):

=============== ============== ===================================================================
dataset         splits         shipped with serl
=============== ============== ===================================================================
``gsm8k``       train, test    yes: ``openai/grade-school-math@3101c7d5072418e28b9008a6636bde82a006892c`` (MIT)
``math500``     test           yes: OpenAI's PRM800K ``math_splits/test.jsonl`` (MIT)
``aime24``      test           answer key only (ids, answers); the problem text is read from a data folder
``aime25``      test           answer key only; likewise
``dapo_math17k`` train, fixture train: a data folder's ``dapo_math17k.jsonl`` (see
                               :mod:`serl.envs.math.download`), else the 15-row fixture with a warning
=============== ============== ===================================================================

The AIME problem statements are (c) the Mathematical Association of America, so serl does not
redistribute them: put ``aime24.jsonl`` / ``aime25.jsonl`` (fields ``id``, ``problem``, ``answer``; e.g.
``QwenLM/Qwen2.5-Math@a45202b:evaluation/data/aime24/test.jsonl``) in ``<data folder>/math/``.

Which file is read, per file (:func:`resolve_file`): the user data folder, which is the explicit
``data_dir`` argument (``env.data_dir`` / ``--data-dir``; it must exist) or else ``$SERL_DATA`` (used
when it exists), then the data shipped in ``serl/data/math``. A user folder may be the serl data root
(files in its ``math/`` subfolder) or the math folder itself. Each file may be plain or ``.gz``.
Shipped files are checked against :data:`SHA256` (uncompressed bytes) before use.

Errors: an unknown dataset, split or prompt style raises :class:`~serl.errors.ConfigError`; missing,
corrupt or malformed data raises :class:`~serl.errors.EnvError`.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Callable

from serl.errors import ConfigError, EnvError
from serl.utils import jsonl_lines

log = logging.getLogger(__name__)

#: SPEAR's ``answer_format`` (``TencentYoutuResearch/SPEAR@7e84315:verl/recipe/spear/retool.py``), appended
#: verbatim to every RL prompt. The model sees the single quotes, which invite ``\boxed{'42'}``.
ANSWER_FORMAT = "\nThe answer format must be: \\boxed{'The final answer goes here.'}"
#: DAPO-Math-17k's fixed prompt wrapper (``BytedTsinghua-SIA/DAPO``), split around the problem text
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = "\n\nRemember to put your answer on its own line after \"Answer:\"."
#: prompt styles of :func:`user_prompt`
PROMPT_STYLES = ("spear", "plain")

#: the file ``serl.envs.math.download.download_dapo_math17k`` writes and ``dapo_math17k/train`` reads
DAPO_FILE = "dapo_math17k.jsonl"

#: sha256 of the uncompressed bytes of each file shipped in ``serl/data/math`` (SOURCE.md)
SHA256 = {
    "gsm8k_train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "gsm8k_test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    "math500.jsonl": "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
    "dapo_math17k_fixture.jsonl": "9ebb2c3405c6e57fd3323a0e88566f65e1ef1dadbbfc3ac1594d3961e5d23c93",
    "aime24_answers.jsonl": "f5de18fa7f74d3398c5eb08f9f4f2b343bf4598493d059fdd228970741222f09",
    "aime25_answers.jsonl": "4f24d28f26e57e280a8a344f326252787fd69c09b5f2ce0db5eac8068f610316",
}


@dataclasses.dataclass(frozen=True)
class MathProblem:
    """One problem. ``uid`` is stable across runs and machines (see each dataset's rule in
    :func:`load_problems`); ``ground_truth`` is the string the scorers compare against;
    ``data_source`` is SPEAR's name for the set (``gsm8k``, ``math500``, ``aime_2024``, ``aime_2025``,
    ``math_dapo``); ``solution`` is GSM8K's annotated worked solution or MATH-500's solution, else None."""

    uid: str
    dataset: str
    split: str
    question: str
    ground_truth: str
    data_source: str
    solution: str | None = None
    level: int | None = None
    subject: str | None = None


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """A registry entry: ``files`` maps split -> file name in a data folder, ``shipped`` split -> file
    shipped in ``serl/data/math`` (absent: the text must come from a user folder), ``answer_key`` the
    shipped ids+answers file (AIME only)."""

    name: str
    data_source: str
    files: dict[str, str]
    shipped: dict[str, str]
    answer_key: str | None = None


DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec("gsm8k", "gsm8k", {"train": "gsm8k_train.jsonl", "test": "gsm8k_test.jsonl"},
                         {"train": "gsm8k_train.jsonl", "test": "gsm8k_test.jsonl"}),
    "math500": DatasetSpec("math500", "math500", {"test": "math500.jsonl"}, {"test": "math500.jsonl"}),
    "aime24": DatasetSpec("aime24", "aime_2024", {"test": "aime24.jsonl"}, {}, "aime24_answers.jsonl"),
    "aime25": DatasetSpec("aime25", "aime_2025", {"test": "aime25.jsonl"}, {}, "aime25_answers.jsonl"),
    "dapo_math17k": DatasetSpec("dapo_math17k", "math_dapo",
                                {"train": DAPO_FILE, "fixture": "dapo_math17k_fixture.jsonl"},
                                {"train": "dapo_math17k_fixture.jsonl", "fixture": "dapo_math17k_fixture.jsonl"}),
}

_KNOWN_FILES = {f for s in DATASETS.values() for f in s.files.values()}
#: public copies of the AIME problem files in the expected schema (for error messages)
_AIME_COPIES = {"aime24": "QwenLM/Qwen2.5-Math's evaluation/data/aime24/test.jsonl",
                "aime25": "the tag == 'aime2025' rows of alibaba/ROLL's data/math_benchmarks.jsonl, ids 2025-I-1..2025-II-15"}


def shipped_data_dir() -> Path:
    """The math data shipped inside the package: ``serl/data/math``."""
    return Path(__file__).resolve().parent.parent.parent / "data" / "math"


def _find(folder: Path, name: str) -> Path | None:
    for p in (folder / name, folder / (name + ".gz")):
        if p.is_file():
            return p
    return None


def math_folder(path: Path) -> Path:
    """``path`` itself when it is named ``math`` or holds a known math file, else ``path/math``."""
    if path.name == "math" or any(_find(path, f) for f in _KNOWN_FILES):
        return path
    return path / "math"


def user_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The user's math folder: from ``data_dir`` if given, else from ``$SERL_DATA`` if that exists,
    else None (shipped data only).

    Raises:
        EnvError: ``data_dir`` is given but is not a folder.
    """
    if data_dir is not None and str(data_dir) != "":
        path = Path(data_dir).expanduser().resolve()
        if not path.is_dir():
            raise EnvError(f"data_dir {str(path)!r} (env.data_dir / --data-dir) is not a folder.")
        return math_folder(path)
    env = os.environ.get("SERL_DATA")
    if env and Path(env).expanduser().is_dir():
        return math_folder(Path(env).expanduser().resolve())
    return None


def _spec(dataset: str, split: str) -> DatasetSpec:
    spec = DATASETS.get(dataset)
    if spec is None:
        raise ConfigError(f"unknown math dataset {dataset!r}; available: {', '.join(DATASETS)}")
    if split not in spec.files:
        raise ConfigError(f"math dataset {dataset!r} has no split {split!r}; available: {', '.join(spec.files)}")
    return spec


def resolve_file(dataset: str, split: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The file ``load_problems(dataset, split, data_dir)`` reads (precedence in the module docstring).

    Raises:
        ConfigError: unknown dataset or split.
        EnvError: the problem text exists only in a user folder (AIME) and none holds it.
    """
    spec = _spec(dataset, split)
    folder = user_data_dir(data_dir)
    name = spec.files[split]
    found = _find(folder, name) if folder is not None else None
    if found is not None:
        return found
    if split not in spec.shipped:
        where = str(folder / name) if folder is not None else "(no data folder: no data_dir, no $SERL_DATA folder)"
        raise EnvError(
            f"{dataset}: the problem text is not shipped with serl (AIME problems are (c) MAA; see "
            f"serl/data/math/README_AIME.md) and was not found at {where}. Fix: put {name} (JSON lines with "
            f"id, problem, answer; e.g. {_AIME_COPIES.get(dataset, 'see README_AIME.md')}) in <DIR>/math/ and "
            f"pass data_dir=<DIR> (--data-dir / env.data_dir) or set SERL_DATA=<DIR>.")
    if split == "train" and dataset == "dapo_math17k":
        log.warning("dapo_math17k/train: no %s in %s; using the 15-row fixture shipped with serl. Get the full set "
                    "with serl.envs.math.download.download_dapo_math17k(DIR) and pass data_dir=DIR or set SERL_DATA=DIR.",
                    name, folder if folder is not None else "any data folder")
    return shipped_data_dir() / (spec.shipped[split] + ".gz")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (plain or ``.gz``). A shipped file is checked against
    :data:`SHA256` first.

    Raises:
        EnvError: unreadable, corrupt (checksum), or a line is not a JSON object.
    """
    try:
        raw = path.read_bytes()
        data = gzip.decompress(raw) if path.suffix == ".gz" else raw
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise EnvError(f"cannot read math data file {path}: {type(e).__name__}: {e}") from e
    logical = path.name[:-3] if path.suffix == ".gz" else path.name
    if path.parent.resolve() == shipped_data_dir() and logical in SHA256:
        got = hashlib.sha256(data).hexdigest()
        if got != SHA256[logical]:
            raise EnvError(f"math data file {path} is corrupt (sha256 {got[:12]}..., expected "
                           f"{SHA256[logical][:12]}...); reinstall serl.")
    return parse_jsonl(data, str(path))


def parse_jsonl(data: bytes, what: str) -> list[dict[str, Any]]:
    """The JSON objects of JSON-lines bytes (blank lines skipped); ``what`` names the source in errors.

    Raises:
        EnvError: not UTF-8, or a line is not a JSON object.
    """
    rows = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EnvError(f"{what} is not UTF-8 text: {e}") from e
    for i, _, row, error in jsonl_lines(text):
        if error is not None:
            raise EnvError(f"{what} line {i} is not valid JSON: {error}")
        if not isinstance(row, dict):
            raise EnvError(f"{what} line {i} is not a JSON object")
        rows.append(row)
    return rows


def _field(row: dict[str, Any], key: str, path: Path, i: int) -> Any:
    if row.get(key) is None:
        raise EnvError(f"{path} row {i}: field {key!r} is missing")
    return row[key]


def _gsm8k(rows: list[dict], path: Path, split: str) -> list[MathProblem]:
    out = []
    for i, r in enumerate(rows):
        answer = str(_field(r, "answer", path, i))
        if "####" not in answer:
            raise EnvError(f"{path} row {i}: GSM8K answer has no '####' line")
        out.append(MathProblem(uid=f"gsm8k-{split}-{i:05d}", dataset="gsm8k", split=split,
                               question=str(_field(r, "question", path, i)),
                               ground_truth=answer.split("####")[-1].strip().replace(",", ""),
                               data_source="gsm8k", solution=answer))
    return out


def _math500(rows: list[dict], path: Path, split: str) -> list[MathProblem]:
    return [MathProblem(uid=f"math500-{_field(r, 'unique_id', path, i)}", dataset="math500", split=split,
                        question=str(_field(r, "problem", path, i)), ground_truth=str(_field(r, "answer", path, i)),
                        data_source="math500", solution=r.get("solution"), level=r.get("level"),
                        subject=r.get("subject"))
            for i, r in enumerate(rows)]


def answer_key(dataset: str) -> dict[str, str]:
    """uid -> ground truth of an AIME set, from the key shipped with serl (no problem text needed).

    Raises:
        ConfigError: ``dataset`` has no shipped answer key (only ``aime24``, ``aime25`` do).
    """
    spec = DATASETS.get(dataset)
    if spec is None or spec.answer_key is None:
        raise ConfigError(f"no shipped answer key for {dataset!r}; available: aime24, aime25")
    path = shipped_data_dir() / (spec.answer_key + ".gz")
    return {f"{dataset}-{r['id']}": str(r["ground_truth"]) for r in read_rows(path)}


def _aime(dataset: str) -> Callable[[list[dict], Path, str], list[MathProblem]]:
    def convert(rows: list[dict], path: Path, split: str) -> list[MathProblem]:
        key, out = answer_key(dataset), []
        for i, r in enumerate(rows):
            uid, answer = f"{dataset}-{_field(r, 'id', path, i)}", _field(r, "answer", path, i)
            try:  # SPEAR's Maxwell-Jia/AIME_2024 answers are integers: "023" -> "23" (exact-match scorer)
                gt = str(int(answer)) if dataset == "aime24" else str(answer).strip()
            except ValueError as e:
                raise EnvError(f"{path} row {i}: AIME 2024 answer {answer!r} is not an integer") from e
            if uid in key and key[uid] != gt:
                raise EnvError(f"{path} row {i} ({uid}): answer {gt!r} disagrees with serl's answer key "
                               f"({key[uid]!r}); is this another transcription (e.g. '336^\\circ' for '336')?")
            out.append(MathProblem(uid=uid, dataset=dataset, split=split, question=str(_field(r, "problem", path, i)),
                                   ground_truth=gt, data_source=DATASETS[dataset].data_source))
        return out
    return convert


def dapo_question(row: dict[str, Any]) -> str:
    """The bare problem of a DAPO row: open-r1's ``prompt`` string, or the original HF schema's
    ``prompt[0]["content"]`` with :data:`DAPO_PREFIX` / :data:`DAPO_SUFFIX` removed.

    Raises:
        ValueError: the row has neither form, or its chat prompt is not wrapped in DAPO's template.
    """
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        text = str(prompt[0].get("content", ""))
        if text.startswith(DAPO_PREFIX) and text.endswith(DAPO_SUFFIX):
            return text[len(DAPO_PREFIX):len(text) - len(DAPO_SUFFIX)]
        raise ValueError("its prompt is not wrapped in DAPO's template")
    raise ValueError("it has no 'prompt' string or chat list")


def dapo_problems(rows: list[dict], path: Path, split: str) -> list[MathProblem]:
    """One problem per distinct question (the original HF parquet repeats each ~100 times); uid
    ``dapo_math17k-<extra_info.index>``."""
    out, seen_q, seen_uid = [], set(), {}
    for i, r in enumerate(rows):
        try:
            question = dapo_question(r)
            uid, gt = f"dapo_math17k-{r['extra_info']['index']}", str(r["reward_model"]["ground_truth"])
        except (ValueError, KeyError, TypeError) as e:
            raise EnvError(f"{path} row {i} is not a DAPO-Math-17k row: {type(e).__name__}: {e}") from e
        if question in seen_q:
            continue
        if uid in seen_uid:
            raise EnvError(f"{path} rows {seen_uid[uid]} and {i} share the index {uid} but differ in question")
        seen_q.add(question)
        seen_uid[uid] = i
        out.append(MathProblem(uid=uid, dataset="dapo_math17k", split=split, question=question, ground_truth=gt,
                               data_source=str(r.get("data_source") or "math_dapo")))
    return out


_CONVERTERS: dict[str, Callable[[list[dict], Path, str], list[MathProblem]]] = {
    "gsm8k": _gsm8k, "math500": _math500, "aime24": _aime("aime24"), "aime25": _aime("aime25"),
    "dapo_math17k": dapo_problems}


def load_problems(dataset: str, split: str, data_dir: str | os.PathLike | None = None) -> list[MathProblem]:
    """The problems of ``dataset``/``split`` in file order.

    Ground truths follow SPEAR's mappings: GSM8K the text after ``####`` without commas (``1,080`` ->
    ``1080``); MATH-500 ``answer``; AIME 2024 ``str(int(answer))`` (``"023"`` -> ``"23"``), checked
    against serl's answer key; AIME 2025 ``answer``; DAPO ``reward_model.ground_truth``.
    uids: ``gsm8k-<split>-<0-based row, 5 digits>``, ``math500-<unique_id>``, ``aime24-<id>``,
    ``aime25-<id>``, ``dapo_math17k-<extra_info.index>``.

    Raises:
        ConfigError: unknown dataset or split.
        EnvError: the data is missing (AIME text), corrupt, or malformed; the message names the file.
    """
    path = resolve_file(dataset, split, data_dir)
    return _CONVERTERS[dataset](read_rows(path), path, split)


def user_prompt(problem: MathProblem, style: str = "spear") -> str:
    """The user message for ``problem``.

    ``"spear"``: SPEAR's RL prompt: the question + :data:`ANSWER_FORMAT`; DAPO rows are first wrapped
    in DAPO's template (SPEAR reads the dataset's templated prompt and appends the format). A DAPO
    prompt therefore asks both for "Answer: ..." on the last line and for ``\\boxed{...}``: that
    conflict is the original's; only the box is rewarded. ``"plain"``: the bare question (SPEAR's SFT
    prompts carry no answer format).

    Raises:
        ConfigError: unknown style.
    """
    if style == "plain":
        return problem.question
    if style != "spear":
        raise ConfigError(f"unknown math prompt style {style!r}; available: {', '.join(PROMPT_STYLES)}")
    if problem.dataset == "dapo_math17k":
        return DAPO_PREFIX + problem.question + DAPO_SUFFIX + ANSWER_FORMAT
    return problem.question + ANSWER_FORMAT
