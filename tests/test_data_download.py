"""serl.data.download: offline failure, atomic extraction, local archives (no network used)."""

from __future__ import annotations

import functools
import http.server
import io
import socket
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

import serl.data.download as dl
from serl.data.download import DataDownloadError, download_alfworld, extract_alfworld_archive, main_download
from serl.envs.alfworld import AlfWorldEnv, fixture_data_dir

GAME_DIR = "json_2.1.1/train/pick_and_place_simple-Mug-None-Desk-1/trial_T1"


def _fixture_game_bytes() -> bytes:
    return Path(AlfWorldEnv.list_tasks("train", data_dir=fixture_data_dir())[0].task_id).read_bytes()


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _closed_port_url(name: str) -> str:
    with socket.socket() as s:  # a port nothing listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


def _leftovers(dest: Path) -> list[str]:
    return [p.name for p in dest.iterdir() if p.name.startswith(".serl-")] if dest.exists() else []


def test_offline_download_fails_clearly_and_leaves_no_trace(tmp_path):
    dest = tmp_path / "alfworld"
    url = _closed_port_url("json_2.1.2_tw-pddl.zip")
    with pytest.raises(DataDownloadError) as ei:
        download_alfworld(dest, urls=[url], timeout=5)
    msg = str(ei.value)
    assert url in msg and "--data-dir" in msg and "SERL_DATA" in msg and "extract_alfworld_archive" in msg
    assert not dest.exists()


def test_main_download_offline_returns_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(dl, "ALFWORLD_URLS", (_closed_port_url("json_2.1.2_tw-pddl.zip"),))
    assert main_download("alfworld", str(tmp_path / "a")) == 1
    err = capsys.readouterr().err
    assert "could not download" in err and "SERL_DATA" in err
    assert main_download("nope", None) == 2
    assert "available: alfworld" in capsys.readouterr().err


def test_download_from_http_and_file_urls_merges_archives(tmp_path):
    game = _fixture_game_bytes()
    src = tmp_path / "src"
    src.mkdir()
    _zip(src / "json_2.1.2_tw-pddl.zip", {f"{GAME_DIR}/game.tw-pddl": game})
    _zip(src / "json_2.1.1_json.zip", {f"{GAME_DIR}/traj_data.json": b'{"task_type": "pick_and_place_simple"}'})

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(src))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dest = tmp_path / "data" / "alfworld"
        urls = [
            f"http://127.0.0.1:{server.server_address[1]}/json_2.1.2_tw-pddl.zip",
            (src / "json_2.1.1_json.zip").as_uri(),  # file://
        ]
        assert download_alfworld(dest, urls=urls) == dest
    finally:
        server.shutdown()
        server.server_close()
    assert (dest / GAME_DIR / "game.tw-pddl").read_bytes() == game
    assert (dest / GAME_DIR / "traj_data.json").is_file()
    assert _leftovers(dest) == []
    tasks = AlfWorldEnv.list_tasks("train", data_dir=dest)
    assert [t.task_type for t in tasks] == ["pick_and_place_simple"]

    # present already: nothing is fetched (the URL would fail) unless force
    download_alfworld(dest, urls=[_closed_port_url("x.zip")])
    with pytest.raises(DataDownloadError):
        download_alfworld(dest, urls=[_closed_port_url("x.zip")], force=True)
    assert (dest / GAME_DIR / "game.tw-pddl").read_bytes() == game


def test_corrupt_or_foreign_archives_leave_dest_unchanged(tmp_path):
    dest = tmp_path / "alfworld"
    (dest / "json_2.1.1").mkdir(parents=True)
    keep = dest / "json_2.1.1" / "keep.txt"
    keep.write_text("old")

    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"<html>rate limited</html>")
    with pytest.raises(DataDownloadError, match="neither a zip nor a tar"):
        download_alfworld(dest, urls=[str(junk)], force=True)

    truncated = tmp_path / "trunc.zip"
    _zip(truncated, {f"{GAME_DIR}/game.tw-pddl": b"x" * 10000})
    truncated.write_bytes(truncated.read_bytes()[:-30])
    with pytest.raises(DataDownloadError):
        download_alfworld(dest, urls=[str(truncated)], force=True)

    foreign = _zip(tmp_path / "foreign.zip", {"README.txt": b"hello"})
    with pytest.raises(DataDownloadError, match="not an ALFWorld data archive"):
        extract_alfworld_archive(foreign, dest)

    evil = _zip(tmp_path / "evil.zip", {"json_2.1.1/ok.txt": b"1", "../evil.txt": b"2"})
    with pytest.raises(DataDownloadError, match="unsafe"):
        extract_alfworld_archive(evil, dest)
    assert not (tmp_path / "evil.txt").exists()

    assert keep.read_text() == "old"
    assert sorted(p.name for p in (dest / "json_2.1.1").iterdir()) == ["keep.txt"]
    assert _leftovers(dest) == []
    with pytest.raises(DataDownloadError, match="does not exist"):
        extract_alfworld_archive(tmp_path / "missing.tar.xz", dest)


def test_extract_tar_xz_keeps_existing_files_unless_force(tmp_path):
    game = _fixture_game_bytes()
    archive = tmp_path / "json_2.1.1_train_tw-pddl.tar.xz"
    with tarfile.open(archive, "w:xz") as tf:
        for name, data in {f"{GAME_DIR}/game.tw-pddl": game, "json_2.1.1/train/b-1/t/game.tw-pddl": game}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    dest = tmp_path / "alfworld"
    existing = dest / GAME_DIR / "game.tw-pddl"
    existing.parent.mkdir(parents=True)
    existing.write_bytes(b"local copy")

    extract_alfworld_archive(archive, dest)
    assert existing.read_bytes() == b"local copy"  # kept
    assert (dest / "json_2.1.1/train/b-1/t/game.tw-pddl").read_bytes() == game  # added
    extract_alfworld_archive(archive, dest, force=True)
    assert existing.read_bytes() == game
    assert _leftovers(dest) == []


def test_default_data_root(monkeypatch, tmp_path):
    monkeypatch.setenv("SERL_DATA", str(tmp_path))
    assert dl.default_data_root() == tmp_path
    monkeypatch.delenv("SERL_DATA")
    assert dl.default_data_root() == Path.home() / ".cache" / "serl" / "data"
