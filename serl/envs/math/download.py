"""Download the full DAPO-Math-17k into a serl data folder (``load_problems("dapo_math17k", "train")``).

The default source is open-r1's de-duplicated copy of ``BytedTsinghua-SIA/DAPO-Math-17k`` (Apache-2.0):
the HF original repeats each of its ~17.4k problems about 100 times (~1.79M rows). The file is parquet,
so the default needs pyarrow, which serl does not depend on (``pip install pyarrow``). A JSON-lines copy
(plain or gzip, open-r1's or the original schema) works without it, from ``file://`` or a local path.

The download goes to a temporary folder inside the destination; the checksum and row count are checked
and every row is converted once (:func:`serl.envs.math.data.load_problems`' DAPO rules) before the
JSON-lines file is renamed into place, so a failure leaves the destination as it was.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from serl.data.download import _fetch, default_data_root, staging_folder
from serl.envs.math.data import DAPO_FILE, dapo_problems, math_folder, parse_jsonl
from serl.errors import DataDownloadError, EnvError

#: open-r1's de-duplicated DAPO-Math-17k ("all" config: 17,398 rows; parquet, needs pyarrow)
DAPO_MATH17K_URL = ("https://huggingface.co/datasets/open-r1/DAPO-Math-17k-Processed/resolve/main/all/"
                    "train-00000-of-00001.parquet")
#: sha256 of that file. Unknown: it could not be fetched where this was written (no network), so the
#: default download verifies the row count only and prints the digest; pin it here once seen.
DAPO_MATH17K_SHA256: str | None = None
#: rows of the "all" config (open-r1's create_dataset.py / dataset card)
DAPO_MATH17K_ROWS = 17398


def _source_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a downloaded file: parquet (``PAR1`` magic; needs pyarrow) or JSON lines, plain or gzip."""
    data = path.read_bytes()
    if data[:4] == b"PAR1":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise DataDownloadError(f"{path} is a parquet file; reading it needs pyarrow (`pip install pyarrow`), "
                                    "or give a JSON-lines source instead.") from e
        return pq.read_table(path).to_pylist()
    try:
        return parse_jsonl(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data, str(path))
    except (EnvError, EOFError, gzip.BadGzipFile) as e:
        raise DataDownloadError(f"{path} is neither parquet nor valid JSON lines: {e}") from e


def download_dapo_math17k(data_dir: str | os.PathLike | None = None, url: str = DAPO_MATH17K_URL,
                          sha256: str | None = DAPO_MATH17K_SHA256, expected_rows: int | None = DAPO_MATH17K_ROWS,
                          force: bool = False, timeout: float = 60.0) -> Path:
    """Download DAPO-Math-17k to ``<data_dir>/math/dapo_math17k.jsonl`` (``data_dir`` default:
    ``$SERL_DATA`` or ``~/.cache/serl/data``), where ``load_problems("dapo_math17k", "train")`` finds it.

    Args:
        url: ``http(s)://``, ``file://`` or a local path; parquet (needs pyarrow) or JSON lines (plain or
            gzip) in open-r1's or the original HF schema. Default :data:`DAPO_MATH17K_URL`.
        sha256: expected sha256 of the downloaded bytes; None skips the check (the digest is printed).
        expected_rows: expected number of source rows; None skips the check.
        force: download even if the file exists.
        timeout: socket timeout per connection attempt / read, in seconds.

    Returns:
        the written file. It is written to a temporary file and renamed into place, so a failure
        leaves any earlier file as it was.

    Raises:
        DataDownloadError: the download failed, the checksum or row count differs, pyarrow is missing
            for a parquet source, or a row is not a DAPO row.
    """
    folder = math_folder(Path(data_dir).expanduser() if data_dir else default_data_root())
    out = folder / DAPO_FILE
    if out.is_file() and not force:
        print(f"{out} already exists; nothing to do (force=True to download again).")
        return out
    with staging_folder(folder) as tmp:
        try:
            src = _fetch(url, tmp, timeout, folder)
        except DataDownloadError as e:
            cause = e.__cause__ if e.__cause__ is not None else str(e).splitlines()[0]
            raise DataDownloadError(
                f"could not download DAPO-Math-17k from {url}: {cause}. Offline, or huggingface.co blocked? Fetch "
                f"{DAPO_MATH17K_URL} on a machine with network and pass the file: download_dapo_math17k(DIR, "
                f"url='/path/to/file.parquet'), or put a {DAPO_FILE} in DIR/math/ yourself.") from e
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        if sha256 is not None and digest != sha256.lower():
            raise DataDownloadError(f"checksum mismatch for {url}: sha256 {digest}, expected {sha256}. The file "
                                    "changed upstream or the download is corrupt; nothing was written.")
        rows = _source_rows(src)
        if expected_rows is not None and len(rows) != expected_rows:
            raise DataDownloadError(f"{url} has {len(rows)} rows, expected {expected_rows}; nothing was written.")
        try:
            n = len(dapo_problems(rows, src, "train"))
        except EnvError as e:
            raise DataDownloadError(f"{url} is not DAPO-Math-17k: {e}") from e
        part = tmp / (DAPO_FILE + ".part")
        part.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        os.replace(part, out)
    checked = "checked" if sha256 is not None else "not checked: no expected digest given"
    print(f"DAPO-Math-17k: {len(rows)} rows ({n} distinct problems), sha256 {digest} ({checked}), written to "
          f"{out}. Use it with `--data-dir {folder}` or `SERL_DATA={folder}`.")
    return out


def main_download(dest: str | None, url: str | None = None) -> int:
    """``serl data download dapo_math17k [--dest DIR]``: :func:`download_dapo_math17k` from ``url``
    (default :data:`DAPO_MATH17K_URL`, checked against :data:`DAPO_MATH17K_SHA256` and
    :data:`DAPO_MATH17K_ROWS`; another url is checked for nothing); errors go to stderr.
    Returns 0 on success, 1 if the download failed."""
    try:
        if url is None:
            download_dapo_math17k(dest)
        else:
            download_dapo_math17k(dest, url=url, sha256=None, expected_rows=None)
    except DataDownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
