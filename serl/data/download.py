"""Fetch and unpack datasets: ``serl data download alfworld``.

ALFWorld's official data lives in GitHub release assets; ``alfworld-download`` (alfworld 0.4.2)
fetches, among others:

* ``releases/download/0.4.0/json_2.1.2_tw-pddl.zip``: the TextWorld game files
  (``json_2.1.1/<split>/<task-dir>/<trial>/game.tw-pddl``), all serl's env needs;
* ``releases/download/0.2.2/json_2.1.1_json.zip``: ALFRED's ``traj_data.json`` for each trial
  (only alfworld's own ``AlfredTWEnv`` and its handcoded expert need them).

It also fetches ``json_2.1.1_pddl.zip`` (the older 2.1.1 PDDL files) and a Mask R-CNN checkpoint,
which the text env does not use, so we skip them.

Both archives unpack into the same ``json_2.1.1/`` tree. Everything is downloaded to a temporary
folder inside the destination and extracted there first; only when every archive has arrived and
unpacked is the tree moved into place (one ``rename`` when the destination has no
``json_2.1.1/`` yet, otherwise file by file with ``os.replace``). An interrupted or failed
download leaves the destination as it was.

Offline (or behind a firewall) the download fails with a :class:`DataDownloadError` that says
what to do instead: point ``--data-dir`` / ``SERL_DATA`` at an existing copy, or unpack a local
archive with :func:`extract_alfworld_archive` (e.g. the shared
``json_2.1.1_train_tw-pddl.tar.xz``).
"""

from __future__ import annotations

from serl.errors import DataDownloadError  # noqa: F401  (re-exported)

import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator, Sequence

#: ALFWorld 0.4.x game files (alfworld-download's TW_PDDL_FILES_URL)
ALFWORLD_TW_PDDL_URL = "https://github.com/alfworld/alfworld/releases/download/0.4.0/json_2.1.2_tw-pddl.zip"
#: ALFRED trajectory files, traj_data.json (alfworld-download's JSON_FILES_URL)
ALFWORLD_TRAJ_DATA_URL = "https://github.com/alfworld/alfworld/releases/download/0.2.2/json_2.1.1_json.zip"
#: what ``serl data download alfworld`` fetches, in order
ALFWORLD_URLS = (ALFWORLD_TW_PDDL_URL, ALFWORLD_TRAJ_DATA_URL)
#: the top-level folder every ALFWorld archive unpacks to
JSON_DIR = "json_2.1.1"
#: datasets ``main_download`` knows
DATASETS = ("alfworld",)

_CHUNK = 1 << 20




def _offline_hint(dest: Path) -> str:
    return (
        "What to do instead:\n"
        "  * copy an existing ALFWorld data folder (one that contains json_2.1.1/<split>/, e.g. the "
        "project's shared/data/alfworld) to this machine and pass `--data-dir PATH` (config "
        "`env.data_dir`) or set SERL_DATA=PATH;\n"
        "  * or, if you have an archive (json_2.1.2_tw-pddl.zip, json_2.1.1_train_tw-pddl.tar.xz, ...), "
        "unpack it with `python -c \"from serl.data.download import extract_alfworld_archive as x; "
        f"x('ARCHIVE', '{dest}')\"`;\n"
        "  * without any data, serl falls back to its bundled fixture (2 games per task type in "
        "train and valid_unseen)."
    )


def default_data_root() -> Path:
    """Where datasets go by default: ``$SERL_DATA`` if set, else ``~/.cache/serl/data``."""
    env = os.environ.get("SERL_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "serl" / "data"


def _has_games(root: Path) -> bool:
    folder = root / JSON_DIR
    return folder.is_dir() and next(folder.glob("*/*/*/game.tw-pddl"), None) is not None


# ------------------------------------------------------------------------------------------
# download
# ------------------------------------------------------------------------------------------


def _fetch(url: str, tmp_dir: Path, timeout: float, dest: Path) -> Path:
    """Download ``url`` (http(s)://, file://, or a plain local path) into ``tmp_dir``."""
    from tqdm import tqdm

    if "://" not in url:  # a local archive: use it in place
        path = Path(url).expanduser()
        if not path.is_file():
            raise DataDownloadError(f"archive {path} does not exist.\n{_offline_hint(dest)}")
        return path
    name = Path(urllib.parse.urlparse(url).path).name or "download"
    out = tmp_dir / name
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "serl-data-download"})
        with urllib.request.urlopen(req, timeout=timeout) as resp, open(out, "wb") as f:
            total = resp.headers.get("Content-Length")
            total = int(total) if total else None
            got = 0
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"Downloading {name}", file=sys.stderr) as bar:
                while chunk := resp.read(_CHUNK):
                    f.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise DataDownloadError(
            f"could not download {url}: {type(e).__name__}: {reason}. Is this machine offline, or is "
            f"github.com blocked?\n{_offline_hint(dest)}"
        ) from e
    if total is not None and got != total:
        raise DataDownloadError(
            f"download of {url} was cut short: got {got} of {total} bytes. Try again.\n{_offline_hint(dest)}"
        )
    return out


@contextmanager
def staging_folder(dest: Path, prefix: str = ".serl-download-") -> Iterator[Path]:
    """A temporary folder inside ``dest`` (created if missing) for a download or an unpacking to
    land in before its files move into ``dest``: on the same file system, so the move is a rename.
    The folder is removed on exit; if the block raised and ``dest`` was created here and is empty,
    ``dest`` goes too, so a failed first download leaves no empty folder behind."""
    dest = Path(dest)
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest, prefix=prefix))
    ok = False
    try:
        yield tmp
        ok = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not ok and created and not any(dest.iterdir()):
            dest.rmdir()


def download_alfworld(
    dest: str | os.PathLike,
    force: bool = False,
    urls: Sequence[str] | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download ALFWorld's official data (the release assets ``alfworld-download`` 0.4.2 uses)
    into ``dest`` so that ``dest/json_2.1.1/<split>/...`` exists.

    Args:
        dest: the ALFWorld data folder to fill (created if needed).
        force: download and overwrite even if ``dest`` already holds game files.
        urls: archives to fetch, in order; default :data:`ALFWORLD_URLS` (game files, then
            ``traj_data.json``). Each may be ``http(s)://``, ``file://`` or a local path.
        timeout: socket timeout per connection attempt / read, in seconds.

    Returns:
        ``dest`` as a :class:`~pathlib.Path`.

    Raises:
        DataDownloadError: a download failed (e.g. no network), was truncated, or an archive is
            corrupt or does not unpack to ``json_2.1.1/``. ``dest`` is then left unchanged.
    """
    dest = Path(dest).expanduser()
    if not force and _has_games(dest):
        print(f"ALFWorld game files already present in {dest / JSON_DIR}; nothing to do (use force=True / -f to re-download).")
        return dest
    with staging_folder(dest) as tmp:
        staging = tmp / "extracted"
        staging.mkdir()
        for url in urls or ALFWORLD_URLS:
            archive = _fetch(url, tmp, timeout, dest)
            _unpack(archive, staging)
            if archive.parent == tmp:
                archive.unlink()  # free the space before the next download
        _check_layout(staging, what=", ".join(urls or ALFWORLD_URLS))
        moved, _ = _merge(staging, dest, overwrite=True)
    print(f"ALFWorld data unpacked into {dest}: {moved} files written.")
    return dest


# ------------------------------------------------------------------------------------------
# extraction
# ------------------------------------------------------------------------------------------


def _safe_member(name: str) -> bool:
    p = PurePosixPath(name)
    return not p.is_absolute() and ".." not in p.parts


def _unpack(archive: Path, into: Path) -> None:
    """Unpack a .zip or .tar[.xz|.gz|.bz2] into ``into``; :class:`DataDownloadError` if it is
    corrupt, of an unknown kind, or has members pointing outside ``into``."""
    from tqdm import tqdm

    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                names = zf.namelist()
                bad = [n for n in names if not _safe_member(n)]
                if bad:
                    raise DataDownloadError(f"archive {archive} has unsafe member paths (e.g. {bad[0]!r}); refusing to unpack it.")
                for n in tqdm(names, desc=f"Extracting {archive.name}", unit="file", file=sys.stderr):
                    zf.extract(n, into)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                members = tf.getmembers()
                if not hasattr(tarfile, "data_filter"):  # Python < 3.11.4: check by hand
                    bad = [m.name for m in members if not _safe_member(m.name) or not (m.isfile() or m.isdir())]
                    if bad:
                        raise DataDownloadError(f"archive {archive} has unsafe or special members (e.g. {bad[0]!r}); refusing to unpack it.")
                for m in tqdm(members, desc=f"Extracting {archive.name}", unit="file", file=sys.stderr):
                    if hasattr(tarfile, "data_filter"):
                        tf.extract(m, into, filter="data")  # refuses absolute paths, '..', device files
                    else:
                        tf.extract(m, into)
        else:
            raise DataDownloadError(
                f"{archive} is neither a zip nor a tar archive (a corrupt or HTML error download?). "
                "Delete it and try again."
            )
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        raise DataDownloadError(f"could not unpack {archive}: {type(e).__name__}: {e}. The archive is probably corrupt or truncated.") from e


def _check_layout(staging: Path, what: str) -> None:
    if not (staging / JSON_DIR).is_dir():
        found = sorted(p.name for p in staging.iterdir())[:10]
        raise DataDownloadError(
            f"{what} did not unpack to a top-level {JSON_DIR}/ folder (found {found}); "
            "this is not an ALFWorld data archive."
        )


def _merge(staging: Path, dest: Path, overwrite: bool) -> tuple[int, int]:
    """Move everything under ``staging`` into ``dest``. A top-level entry that ``dest`` lacks
    is moved with one ``rename``; otherwise files are moved one by one with ``os.replace``
    (existing files are kept unless ``overwrite``). Returns (files moved, files kept)."""
    moved = kept = 0
    for top in sorted(staging.iterdir()):
        target = dest / top.name
        if not target.exists():
            os.rename(top, target)
            moved += sum(1 for p in target.rglob("*") if p.is_file()) if target.is_dir() else 1
            continue
        for src in sorted(p for p in top.rglob("*") if p.is_file()):
            out = target / src.relative_to(top)
            if out.exists() and not overwrite:
                kept += 1
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, out)
            moved += 1
    return moved, kept


def extract_alfworld_archive(archive: str | os.PathLike, dest: str | os.PathLike, force: bool = False) -> Path:
    """Unpack a local ALFWorld archive (``.zip`` or ``.tar.xz`` / ``.tar.gz``, laid out as
    ``json_2.1.1/...``, such as the shared ``json_2.1.1_train_tw-pddl.tar.xz``) into ``dest``.

    The archive is unpacked into a temporary folder inside ``dest`` and then moved into place
    (see the module docstring), so a failure leaves ``dest`` unchanged. Files already in
    ``dest`` are kept unless ``force``; unpacking the full train archive over the shared
    700-game subset therefore only adds the missing games.

    Returns:
        ``dest`` as a :class:`~pathlib.Path`.

    Raises:
        DataDownloadError: the archive is missing, corrupt, unsafe, or not laid out as
            ``json_2.1.1/...``.
    """
    archive = Path(archive).expanduser()
    dest = Path(dest).expanduser()
    if not archive.is_file():
        raise DataDownloadError(f"archive {archive} does not exist.")
    with staging_folder(dest, prefix=".serl-extract-") as tmp:
        _unpack(archive, tmp)
        _check_layout(tmp, what=str(archive))
        moved, kept = _merge(tmp, dest, overwrite=force)
    print(f"Unpacked {archive.name} into {dest}: {moved} files written, {kept} existing files kept.")
    return dest


# ------------------------------------------------------------------------------------------
# CLI entry (wired as `serl data download <name>` in serl/cli.py)
# ------------------------------------------------------------------------------------------


def main_download(name: str, dest: str | None) -> int:
    """``serl data download <name> [--data-dir DEST]``: fetch a dataset; returns the exit code.

    ``dest`` defaults to ``default_data_root() / name`` (``$SERL_DATA/<name>`` or
    ``~/.cache/serl/data/<name>``). Errors are printed to stderr with what to do instead.

    Returns:
        0 on success, 1 if the download failed, 2 for an unknown dataset name.
    """
    if name not in DATASETS:
        print(f"error: unknown dataset {name!r}; available: {', '.join(DATASETS)}", file=sys.stderr)
        return 2
    target = Path(dest).expanduser() if dest else default_data_root() / name
    try:
        download_alfworld(target)
    except DataDownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"ALFWorld data is ready in {target}. Use it with `--data-dir {target}` or `export SERL_DATA={target}`.")
    return 0
