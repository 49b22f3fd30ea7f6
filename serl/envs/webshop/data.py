"""Where the WebShop data lives, and reading it (plain, ``.xz`` or ``.gz``) with integrity checks.

serl ships WebShop's complete 1k-product split inside the package (``serl/data/webshop/``, about
0.7 MB compressed; provenance and licence in that folder's ``SOURCE.md`` / ``LICENSE``), so a
fresh install runs WebShop offline with no download.

Folder resolution (:func:`resolve_data_dir`), first match wins:

1. the explicit ``data_dir`` argument (``env.data_dir`` / ``serl train --data-dir``): the WebShop
   folder itself, or a serl data root holding ``webshop/``. It must contain the data; otherwise
   :class:`~serl.envs.base.EnvError` is raised (no silent fallback);
2. ``$SERL_WEBSHOP_DATA``: same rule;
3. ``$SERL_DATA`` (serl's generic data root, usually ALFWorld's), used only when it holds WebShop
   data directly or in ``webshop/``;
4. the data shipped with serl.

A folder holds WebShop data when it has ``items_shuffle_1000.json`` (optionally ``.xz``/``.gz``).
Each logical file is looked up as ``name``, ``name.xz``, ``name.gz`` in that order, so a folder
of WebShop's original (uncompressed) files works as-is.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
from pathlib import Path
from typing import Any

from serl.envs.base import EnvError

#: the products file: WebShop's ``items_shuffle_1000.json`` (raw scraped records, file order)
PRODUCTS_FILE = "items_shuffle_1000.json"
#: asin -> {attributes, instruction?, instruction_attributes?}
ATTRIBUTES_FILE = "items_ins_v2_1000.json"
#: asin -> [human instruction records]; the subset of ``items_human_ins.json`` for the 1k split
HUMAN_FILE = "items_human_ins_1k.json"
#: asin -> spaCy NOUN/PROPN tokens of the title (the type reward's title nouns; no spaCy at run time)
NOUNS_FILE = "title_nouns_en_core_web_sm_3.8.0.json"
#: WebShop's ``COLOR_SET`` (normalize.py), used by ``normalize_color``
COLORS_FILE = "color_set.json"

#: sha256 of the *uncompressed* bytes of the shipped files (serl/data/webshop/SOURCE.md).
#: A file whose digest differs is reported as corrupt. Files from a user folder are checked
#: only when their name is one of these and ``verify=True``.
SHA256 = {
    PRODUCTS_FILE: "05d6f04752afee3485570c66bcc4b83c6a1b5f80a226590d97db6dc7b369cab2",
    ATTRIBUTES_FILE: "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f",
    HUMAN_FILE: "c46f884c26bf9ad98a88b0d15bb614862e1ca053a79b5de9f63a6ca124cc9435",
    NOUNS_FILE: "5741731c79e0fb82e0d7649571b17c79e9cb0eefe9a60426c9682fb735cb3a7c",
}

_SUFFIXES = ("", ".xz", ".gz")

HOW_TO_FIX = (
    "serl ships WebShop's 1k-product data in serl/data/webshop/; reinstall serl if that folder is "
    "damaged, or point `env.data_dir` (`--data-dir`) or $SERL_WEBSHOP_DATA at a folder holding "
    f"{PRODUCTS_FILE}, {ATTRIBUTES_FILE}, {HUMAN_FILE} and {NOUNS_FILE} (each optionally .xz/.gz)."
)


def shipped_data_dir() -> Path:
    """The WebShop data shipped inside the package: ``serl/data/webshop``."""
    return Path(__file__).resolve().parent.parent.parent / "data" / "webshop"


def find_file(folder: Path, name: str) -> Path | None:
    """``folder/name``, ``folder/name.xz`` or ``folder/name.gz``, whichever exists first."""
    for suf in _SUFFIXES:
        p = folder / (name + suf)
        if p.is_file():
            return p
    return None


def _holds_webshop(folder: Path) -> bool:
    return find_file(folder, PRODUCTS_FILE) is not None


def _webshop_folder(path: Path) -> Path | None:
    """``path`` if it holds WebShop data, else ``path/webshop`` if that does, else None."""
    if _holds_webshop(path):
        return path
    if _holds_webshop(path / "webshop"):
        return path / "webshop"
    return None


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The folder to read WebShop data from (precedence in the module docstring).

    Raises:
        EnvError: ``data_dir`` or ``$SERL_WEBSHOP_DATA`` is set but holds no WebShop data.
    """
    for source, value in (("data_dir (env.data_dir / --data-dir)", data_dir),
                          ("$SERL_WEBSHOP_DATA", os.environ.get("SERL_WEBSHOP_DATA"))):
        if value is not None and str(value) != "":
            path = Path(value).expanduser().resolve()
            found = _webshop_folder(path)
            if found is None:
                raise EnvError(f"{source} = {str(path)!r} holds no WebShop data (no {PRODUCTS_FILE}[.xz|.gz] "
                               f"there or in its webshop/ subfolder). {HOW_TO_FIX}")
            return found
    generic = os.environ.get("SERL_DATA")
    if generic:
        found = _webshop_folder(Path(generic).expanduser().resolve())
        if found is not None:
            return found
    return shipped_data_dir()


def read_bytes(folder: Path, name: str, verify: bool = True) -> bytes:
    """The uncompressed bytes of logical file ``name`` in ``folder``.

    Args:
        folder: a WebShop data folder.
        name: logical file name (without ``.xz`` / ``.gz``).
        verify: compare the sha256 with :data:`SHA256` when ``name`` is listed there and the
            folder is the shipped one (user folders may hold other, valid versions).

    Raises:
        EnvError: the file is missing, cannot be decompressed, or fails its checksum.
    """
    path = find_file(folder, name)
    if path is None:
        raise EnvError(f"WebShop data file {name} (or {name}.xz / {name}.gz) is missing in {folder}. {HOW_TO_FIX}")
    try:
        if path.suffix == ".xz":
            data = lzma.decompress(path.read_bytes())
        elif path.suffix == ".gz":
            data = gzip.decompress(path.read_bytes())
        else:
            data = path.read_bytes()
    except (OSError, lzma.LZMAError, EOFError) as e:
        raise EnvError(f"cannot read WebShop data file {path}: {e}. {HOW_TO_FIX}") from e
    want = SHA256.get(name)
    if verify and want is not None and folder.resolve() == shipped_data_dir():
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise EnvError(f"WebShop data file {path} is corrupt (sha256 {got[:12]}…, expected {want[:12]}…). "
                           f"{HOW_TO_FIX}")
    return data


def read_json(folder: Path, name: str, verify: bool = True) -> Any:
    """:func:`read_bytes` parsed as JSON; raises :class:`EnvError` on invalid JSON."""
    data = read_bytes(folder, name, verify)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EnvError(f"WebShop data file {name} in {folder} is not valid JSON: {e}. {HOW_TO_FIX}") from e


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file (plain, ``.xz`` or ``.gz``) as a list of dicts (used for fixtures)."""
    raw = read_bytes(path.parent, path.name[: -len(path.suffix)] if path.suffix in (".xz", ".gz") else path.name,
                     verify=False)
    return [json.loads(line) for line in raw.decode("utf-8").split("\n") if line.strip()]  # not splitlines: U+2028
