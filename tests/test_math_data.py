"""serl.envs.math.data / .download: shipped data, ground-truth mappings, uids, data folders, prompts, download."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

import serl.envs.math.data as md
from serl.envs.math.data import ANSWER_FORMAT, DAPO_PREFIX, DAPO_SUFFIX, answer_key, load_problems, user_prompt
from serl.envs.math.download import download_dapo_math17k
from serl.errors import ConfigError, DataDownloadError, EnvError

REPO = Path(__file__).resolve().parents[1]
SHARED_CANDIDATES = [REPO.parent / "shared" / "data" / "math", Path("/work/shared/data/math")]
SHARED = next((p for p in SHARED_CANDIDATES if (p / "aime24.jsonl").is_file()), None)
needs_shared = pytest.mark.skipif(SHARED is None, reason="research data ../shared/data/math not present")
FIXTURE_GZ = md.shipped_data_dir() / "dapo_math17k_fixture.jsonl.gz"


@pytest.fixture(autouse=True)
def _no_serl_data(monkeypatch):
    """Only the data a test names: no $SERL_DATA from the developer's shell."""
    monkeypatch.delenv("SERL_DATA", raising=False)


def _key(problems) -> list[tuple]:
    return [(p.uid, p.question, p.ground_truth, p.data_source) for p in problems]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("dataset,split,n", [("gsm8k", "train", 7473), ("gsm8k", "test", 1319),
                                             ("math500", "test", 500), ("dapo_math17k", "fixture", 15)])
def test_shipped_sets_load_with_their_row_counts(dataset, split, n):
    problems = load_problems(dataset, split)
    assert len(problems) == n
    assert len({p.uid for p in problems}) == n
    assert all(p.question and p.ground_truth and p.dataset == dataset and p.split == split for p in problems)


def test_dapo_train_falls_back_to_the_fixture_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="serl.envs.math.data"):
        problems = load_problems("dapo_math17k", "train")
    assert len(problems) == 15 and "15-row fixture" in caplog.text and "download_dapo_math17k" in caplog.text


def test_shipped_checksums_match_the_table():
    for name, digest in md.SHA256.items():
        data = gzip.decompress((md.shipped_data_dir() / (name + ".gz")).read_bytes())
        assert hashlib.sha256(data).hexdigest() == digest, name
    source = (md.shipped_data_dir() / "SOURCE.md").read_text()
    assert all(d in source for d in md.SHA256.values())


@needs_shared
@pytest.mark.parametrize("name", ["gsm8k_train.jsonl", "gsm8k_test.jsonl", "math500.jsonl", "dapo_math17k_fixture.jsonl"])
def test_shipped_files_are_the_research_copies(name):
    assert gzip.decompress((md.shipped_data_dir() / (name + ".gz")).read_bytes()) == (SHARED / name).read_bytes()


def test_gsm8k_ground_truths_drop_commas_and_keep_signs():
    train = load_problems("gsm8k", "train")
    assert train[345].uid == "gsm8k-train-00345" and train[345].ground_truth == "1080"
    assert train[345].solution.rstrip().endswith("#### 1,080") and "<<" in train[345].solution
    assert train[5715].ground_truth == "-7"
    assert sum("," in p.solution.split("####")[-1] for p in train) == 79
    assert sum(p.ground_truth.startswith("-") for p in train) == 3
    assert all(p.ground_truth.lstrip("-").isdigit() for p in train)
    test = load_problems("gsm8k", "test")
    assert (sum("," in p.solution.split("####")[-1] for p in test), sum(p.ground_truth.startswith("-") for p in test)) == (14, 2)


def test_uids_are_stable_and_data_sources_are_spears():
    assert [p.uid for p in load_problems("gsm8k", "test")[:2]] == ["gsm8k-test-00000", "gsm8k-test-00001"]
    m = load_problems("math500", "test")
    assert m[0].uid == "math500-test/precalculus/807.json" and m[0].ground_truth == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert (m[0].level, m[0].subject, m[0].data_source) == (2, "Precalculus", "math500")
    assert load_problems("math500", "test") == m  # same objects field by field on a second load
    d = load_problems("dapo_math17k", "fixture")
    assert d[0].uid == "dapo_math17k-b426d104-244d-4831-a2c4-cd756b61700a" and d[0].data_source == "math_dapo"
    assert d[1].ground_truth == "-3" and d[0].solution is None


def test_answer_keys_hold_ids_and_answers_only():
    k24, k25 = answer_key("aime24"), answer_key("aime25")
    assert len(k24) == len(k25) == 30
    assert k24["aime24-60"] == "204" and all(not v.startswith("0") or v == "0" for v in k24.values())
    assert k25["aime25-2025-I-1"] == "70" and k25["aime25-2025-II-5"] == "336"
    raw = md.read_rows(md.shipped_data_dir() / "aime24_answers.jsonl.gz")
    assert any(r["answer"].startswith("0") for r in raw) and all("problem" not in r for r in raw)
    with pytest.raises(ConfigError, match="aime24, aime25"):
        answer_key("gsm8k")


@needs_shared
def test_aime_loads_30_problems_each_from_a_data_folder():
    a24 = load_problems("aime24", "test", data_dir=SHARED)
    a25 = load_problems("aime25", "test", data_dir=SHARED.parent)  # a serl data root holding math/ works too
    assert len(a24) == len(a25) == 30
    assert a24[0].uid == "aime24-60" and a24[0].data_source == "aime_2024"
    padded = [json.loads(line) for line in (SHARED / "aime24.jsonl").read_text().splitlines()]
    row = next(r for r in padded if r["answer"] == "023")
    assert next(p for p in a24 if p.uid == f"aime24-{row['id']}").ground_truth == "23"
    ii5 = next(p for p in a25 if p.uid == "aime25-2025-II-5")
    assert ii5.ground_truth == "336" and ii5.data_source == "aime_2025"
    assert [p.uid for p in a25[:2]] == ["aime25-2025-I-1", "aime25-2025-I-2"]


def test_aime_without_text_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(EnvError) as ei:
        load_problems("aime24", "test")
    msg = str(ei.value)
    assert "aime24.jsonl" in msg and "SERL_DATA" in msg and "--data-dir" in msg and "MAA" in msg
    with pytest.raises(EnvError, match=str(tmp_path / "math" / "aime25.jsonl")):
        load_problems("aime25", "test", data_dir=tmp_path)


def test_a_tiny_data_folder_overrides_the_shipped_files(tmp_path, monkeypatch):
    key = answer_key("aime24")
    _write_jsonl(tmp_path / "math" / "aime24.jsonl", [
        {"id": 60, "problem": "P60", "answer": "0" + key["aime24-60"]},
        {"id": 999, "problem": "a made-up problem", "answer": "007"}])
    _write_jsonl(tmp_path / "math" / "gsm8k_test.jsonl", [{"question": "1+1?", "answer": "1+1=<<1+1=2>>2\n#### 2"},
                                                          {"question": "Big?", "answer": "#### -1,000"}])
    a24 = load_problems("aime24", "test", data_dir=tmp_path)
    assert [(p.uid, p.question, p.ground_truth) for p in a24] == [("aime24-60", "P60", "204"), ("aime24-999", "a made-up problem", "7")]
    g = load_problems("gsm8k", "test", data_dir=tmp_path)
    assert [(p.uid, p.ground_truth) for p in g] == [("gsm8k-test-00000", "2"), ("gsm8k-test-00001", "-1000")]
    assert len(load_problems("gsm8k", "train", data_dir=tmp_path)) == 7473  # not in the folder: shipped
    monkeypatch.setenv("SERL_DATA", str(tmp_path))
    assert len(load_problems("gsm8k", "test")) == 2  # $SERL_DATA is used ...
    other = tmp_path / "other"
    other.mkdir()
    assert len(load_problems("gsm8k", "test", data_dir=other)) == 1319  # ... unless data_dir is given


def test_bad_data_folders_and_rows_fail_clearly(tmp_path):
    with pytest.raises(EnvError, match="is not a folder"):
        load_problems("gsm8k", "test", data_dir=tmp_path / "missing")
    _write_jsonl(tmp_path / "aime25.jsonl", [{"id": "2025-II-5", "problem": "P", "answer": "336^\\circ"}])
    with pytest.raises(EnvError, match="disagrees with serl's answer key"):
        load_problems("aime25", "test", data_dir=tmp_path)
    _write_jsonl(tmp_path / "aime24.jsonl", [{"id": 60, "problem": "P", "answer": "x"}])
    with pytest.raises(EnvError, match="not an integer"):
        load_problems("aime24", "test", data_dir=tmp_path)
    _write_jsonl(tmp_path / "math500.jsonl", [{"problem": "P", "answer": "1"}])
    with pytest.raises(EnvError, match="'unique_id' is missing"):
        load_problems("math500", "test", data_dir=tmp_path)
    (tmp_path / "gsm8k_test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\nnot json\n')
    with pytest.raises(EnvError, match="line 2 is not valid JSON"):
        load_problems("gsm8k", "test", data_dir=tmp_path)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ConfigError, match="gsm8k, math500, aime24, aime25, dapo_math17k"):
        load_problems("gsm9k", "test")
    with pytest.raises(ConfigError, match="available: test"):
        load_problems("math500", "train")


def test_a_corrupt_shipped_file_is_refused(tmp_path, monkeypatch):
    shutil.copyfile(md.shipped_data_dir() / "math500.jsonl.gz", tmp_path / "math500.jsonl.gz")
    data = gzip.decompress((tmp_path / "math500.jsonl.gz").read_bytes()).replace(b"Precalculus", b"Postcalculus", 1)
    (tmp_path / "math500.jsonl.gz").write_bytes(gzip.compress(data))
    monkeypatch.setattr(md, "shipped_data_dir", lambda: tmp_path.resolve())
    with pytest.raises(EnvError, match="is corrupt"):
        load_problems("math500", "test")


def test_prompts_are_spears():
    assert ANSWER_FORMAT == "\nThe answer format must be: \\boxed{'The final answer goes here.'}"
    g = load_problems("gsm8k", "test")[0]
    assert user_prompt(g) == g.question + ANSWER_FORMAT and user_prompt(g, "plain") == g.question
    rows = md.read_rows(FIXTURE_GZ)
    for row, p in zip(rows, load_problems("dapo_math17k", "fixture")):
        assert user_prompt(p) == row["source_prompt"][0]["content"] + ANSWER_FORMAT
        assert p.question == row["prompt"]
    with pytest.raises(ConfigError, match="spear, plain"):
        user_prompt(g, "qwen")


def test_dapo_rows_in_the_original_schema_are_unwrapped_and_deduplicated(tmp_path):
    rows = md.read_rows(FIXTURE_GZ)[:2]
    original = [{"data_source": r["data_source"], "prompt": r["source_prompt"], "ability": r["ability"],
                 "reward_model": r["reward_model"], "extra_info": r["extra_info"]} for r in rows]
    _write_jsonl(tmp_path / "dapo_math17k.jsonl", original * 3)  # the HF original repeats each row
    got = load_problems("dapo_math17k", "train", data_dir=tmp_path)
    assert [(p.question, p.ground_truth) for p in got] == [(r["prompt"], r["reward_model"]["ground_truth"]) for r in rows]
    bad = dict(original[0], prompt=[{"role": "user", "content": "no template " + rows[0]["prompt"]}])
    _write_jsonl(tmp_path / "dapo_math17k.jsonl", [bad])
    with pytest.raises(EnvError, match="not wrapped in DAPO's template"):
        load_problems("dapo_math17k", "train", data_dir=tmp_path)
    assert DAPO_PREFIX.endswith("\n\n") and DAPO_SUFFIX.startswith("\n\n")


# ------------------------------------------------------------------------------------------ download


def _fixture_jsonl(tmp_path: Path) -> tuple[Path, str]:
    src = tmp_path / "src" / "dapo.jsonl"
    src.parent.mkdir()
    src.write_bytes(gzip.decompress(FIXTURE_GZ.read_bytes()))
    return src, hashlib.sha256(src.read_bytes()).hexdigest()


def test_download_from_a_file_url_writes_a_loadable_file(tmp_path, caplog):
    src, digest = _fixture_jsonl(tmp_path)
    dest = tmp_path / "data"
    out = download_dapo_math17k(dest, url=src.as_uri(), sha256=digest, expected_rows=15)
    assert out == dest / "math" / "dapo_math17k.jsonl" and out.is_file()
    assert [p.name for p in out.parent.iterdir()] == ["dapo_math17k.jsonl"]  # no temporary left
    with caplog.at_level(logging.WARNING, logger="serl.envs.math.data"):
        got = load_problems("dapo_math17k", "train", data_dir=dest)
    assert _key(got) == _key(load_problems("dapo_math17k", "fixture")) and "fixture" not in caplog.text
    out.write_text("kept\n")
    download_dapo_math17k(dest, url=src.as_uri(), sha256=digest, expected_rows=15)
    assert out.read_text() == "kept\n"  # present: not downloaded again without force
    download_dapo_math17k(dest, url=str(src.with_suffix("")) + ".jsonl", expected_rows=None, force=True)
    assert len(load_problems("dapo_math17k", "train", data_dir=dest)) == 15  # a plain path works too


def test_download_accepts_gzip_json_lines(tmp_path):
    out = download_dapo_math17k(tmp_path / "d", url=FIXTURE_GZ.as_uri(), expected_rows=15)
    assert len(md.read_rows(out)) == 15


def test_download_with_a_wrong_checksum_or_count_writes_nothing(tmp_path):
    src, digest = _fixture_jsonl(tmp_path)
    dest = tmp_path / "data"
    with pytest.raises(DataDownloadError, match=f"checksum mismatch.*sha256 {digest}, expected {'0' * 64}"):
        download_dapo_math17k(dest, url=src.as_uri(), sha256="0" * 64)
    with pytest.raises(DataDownloadError, match="has 15 rows, expected 17398"):
        download_dapo_math17k(dest, url=src.as_uri(), sha256=digest)
    assert not (dest / "math").exists()  # a failed first download leaves no folder behind


def test_download_of_a_missing_file_or_non_dapo_data_fails_clearly(tmp_path):
    missing = tmp_path / "nowhere.parquet"
    with pytest.raises(DataDownloadError, match="could not download DAPO-Math-17k from file://"):
        download_dapo_math17k(tmp_path / "d", url=missing.as_uri())
    with pytest.raises(DataDownloadError, match="could not download") as ei:
        download_dapo_math17k(tmp_path / "d", url=str(missing))
    assert "ALFWorld" not in str(ei.value) and "url='/path/to/file.parquet'" in str(ei.value)
    other = _write_jsonl(tmp_path / "gsm.jsonl", [{"question": "q", "answer": "#### 1"}])
    with pytest.raises(DataDownloadError, match="is not DAPO-Math-17k"):
        download_dapo_math17k(tmp_path / "d", url=other.as_uri(), expected_rows=None)
    assert not (tmp_path / "d" / "math" / "dapo_math17k.jsonl").exists()


def test_main_download_reports_failure_on_stderr(tmp_path, capsys):
    from serl.envs.math.download import main_download

    assert main_download(str(tmp_path / "d"), url=(tmp_path / "nothing.parquet").as_uri()) == 1
    assert "could not download DAPO-Math-17k" in capsys.readouterr().err
    assert main_download(str(tmp_path / "d"), url=FIXTURE_GZ.as_uri()) == 0
    assert len(load_problems("dapo_math17k", "train", data_dir=tmp_path / "d")) == 15


def test_parquet_needs_pyarrow(tmp_path, monkeypatch):
    fake = tmp_path / "x.parquet"
    fake.write_bytes(b"PAR1 not really")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataDownloadError, match="pip install pyarrow"):
        download_dapo_math17k(tmp_path / "d", url=fake.as_uri(), expected_rows=None)


def test_parquet_source_roundtrip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    src = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(md.read_rows(FIXTURE_GZ)), src)
    out = download_dapo_math17k(tmp_path / "d", url=src.as_uri(), sha256=hashlib.sha256(src.read_bytes()).hexdigest(),
                                expected_rows=15)
    assert _key(load_problems("dapo_math17k", "train", data_dir=out.parent)) == _key(load_problems("dapo_math17k", "fixture"))
