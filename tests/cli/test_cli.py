"""The indextar command line: index, info, verify; exit codes and error lines."""

from __future__ import annotations

import json
import os
import pickle
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import sample_members, tar_bytes

from indextar import MissingIndexError, open_index
from indextar.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    for i in range(4):
        members: dict[str, bytes | str | None] = {"meta/": None}
        members.update(sample_members(50, exts=("jpg", "cls", "json"), prefix=f"x{i}-"))
        (tmp_path / f"x-{i:06d}.tar").write_bytes(tar_bytes(members, "gnu"))
    return tmp_path


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "indextar", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_index_info_verify_on_a_brace_pattern(shards: Path) -> None:
    result = run("index", "x-{000000..000003}.tar", cwd=shards)
    assert result.returncode == 0, result.stderr
    assert "indexed 4 shards (4 built, 0 up to date): 200 samples, 600 members" in result.stdout
    assert "members/s" in result.stdout
    assert sorted(p.name for p in shards.glob("*.idx.sqlite")) == [
        f"x-{i:06d}.tar.idx.sqlite" for i in range(4)
    ]

    again = run("index", "x-{000000..000003}.tar", "-j", "1", cwd=shards)
    assert "(0 built, 4 up to date)" in again.stdout

    info = run("info", "x-*.tar", "--json", cwd=shards)
    assert info.returncode == 0, info.stderr
    rows = json.loads(info.stdout)
    assert [r["shard"] for r in rows] == [f"x-{i:06d}.tar" for i in range(4)]
    assert rows[0]["samples"] == 50
    assert rows[0]["extensions"] == {"cls": 50, "jpg": 50, "json": 50}
    assert rows[0]["skipped"] == {"directory": 1}
    assert rows[0]["overhead_per_sample"] > 3 * 512  # three header blocks per sample at least

    text = run("info", "x-000001.tar", cwd=shards)
    assert "50 samples, 150 members" in text.stdout and "skipped: directory 1" in text.stdout

    verify = run("verify", "x-{000000..000003}.tar", cwd=shards)
    assert verify.returncode == 0, verify.stderr
    assert "verified 4 of 4 shards: all OK" in verify.stdout


def test_failures_give_one_line_per_shard_and_a_nonzero_exit(shards: Path) -> None:
    (shards / "bad.tar").write_bytes(b"this is not a tar file" * 100)
    (shards / "empty.tar").write_bytes(b"")
    result = run("index", "x-000000.tar", "bad.tar", "empty.tar", "missing.tar", cwd=shards)
    assert result.returncode == 1
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 3, result.stderr
    assert all(line.startswith("indextar: error: ") for line in errors)
    assert "'bad.tar' at byte offset 0: not a tar archive" in result.stderr
    assert "'empty.tar' at byte offset 0: file is empty" in result.stderr
    assert "'missing.tar' does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert "1 built" in result.stdout and "3 failed" in result.stdout
    assert not (shards / "bad.tar.idx.sqlite").exists()
    assert (shards / "x-000000.tar.idx.sqlite").exists()

    debug = run("index", "bad.tar", "--debug", cwd=shards)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_stale_index_is_refused_until_forced(shards: Path) -> None:
    assert run("index", "x-000000.tar", cwd=shards).returncode == 0
    shard = shards / "x-000000.tar"
    os.utime(shard, ns=(0, 0))
    result = run("index", "x-000000.tar", cwd=shards)
    assert result.returncode == 1
    assert "mtime changed" in result.stderr and "--force" in result.stderr
    assert run("info", "x-000000.tar", cwd=shards).returncode == 1
    forced = run("index", "x-000000.tar", "--force", cwd=shards)
    assert forced.returncode == 0 and "1 built" in forced.stdout


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        ("UPDATE members SET data_offset = data_offset + 512 WHERE member_id = 7", "member 7:"),
        ("UPDATE samples SET end_offset = end_offset + 512 WHERE sample_id = 3", "sample 3:"),
        ("UPDATE samples SET start_offset = 0 WHERE sample_id = 5", "sample 5:"),
        ("UPDATE arrays SET data = zeroblob(length(data)) WHERE name = 'members'", "arrays:"),
    ],
)
def test_verify_detects_an_index_that_disagrees_with_its_shard(
    tamper: str, said: str, shards: Path
) -> None:
    import sqlite3

    assert run("index", "x-000000.tar", cwd=shards).returncode == 0
    index = shards / "x-000000.tar.idx.sqlite"
    with sqlite3.connect(index) as conn:
        conn.execute(tamper)
    conn.close()
    result = run("verify", "x-000000.tar", cwd=shards)
    assert result.returncode == 1
    assert said in result.stderr, result.stderr


def test_verify_warns_about_keys_that_come_back(tmp_path: Path) -> None:
    members = {"a.jpg": b"1", "b.jpg": b"2", "a.cls": b"3"}
    (tmp_path / "s.tar").write_bytes(tar_bytes(members))
    assert run("index", "s.tar", cwd=tmp_path).returncode == 0
    result = run("verify", "s.tar", cwd=tmp_path)
    assert result.returncode == 0
    assert "warning" in result.stderr and "'a'" in result.stderr


def test_index_dir_and_in_process_main(
    shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index_dir = tmp_path / "indexes"
    pattern = str(shards / "x-00000[01].tar")
    assert main(["index", pattern, "--index-dir", str(index_dir), "-q"]) == 0
    assert len(list(index_dir.glob("x-00000?.tar.*.idx.sqlite"))) == 2
    assert not list(shards.glob("*.idx.sqlite"))
    assert main(["verify", pattern, "--index-dir", str(index_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["ok"] for r in out] == [True, True]


def test_a_glob_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    result = run("index", "nothing-*.tar", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == "indextar: error: pattern 'nothing-*.tar' matches no file"


def test_console_script_and_module_are_the_same_cli(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("indextar")
    assert script.exists(), "the package's console script is not installed"
    a = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    b = run("--help", cwd=tmp_path)
    assert a.returncode == b.returncode == 0
    assert a.stdout.replace("indextar", "X") == b.stdout.replace("indextar", "X")
    for command in ("index", "info", "verify"):
        assert command in a.stdout


def test_import_and_cli_work_without_torch(shards: Path) -> None:
    """Blocking torch's import: indexing tools must never need it."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import indextar, indextar.cli.commands\n"
        "assert indextar.build_index('x-000002.tar').meta.num_samples == 50\n"
        "sys.exit(indextar.cli.commands.main(['info', 'x-000002.tar']))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=shards, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "50 samples" in result.stdout


def test_index_writes_a_manifest_the_dataset_and_wids_can_open(shards: Path) -> None:
    result = run("index", "x-*.tar", "--manifest", "dataset.json", cwd=shards)
    assert result.returncode == 0, result.stderr
    assert "wrote manifest dataset.json (4 shards)" in result.stdout
    document = json.loads((shards / "dataset.json").read_text())
    assert document["wids_version"] == 1
    assert [s["nsamples"] for s in document["shardlist"]] == [50] * 4
    assert [s["url"] for s in document["shardlist"]] == [f"x-{i:06d}.tar" for i in range(4)]

    from indextar import IndexedTarDataset

    ds = IndexedTarDataset(shards / "dataset.json")
    assert len(ds) == 200 and ds[-1]["__key__"] == "x3-000049"


def test_no_manifest_when_a_shard_fails(shards: Path) -> None:
    (shards / "x-000009.tar").write_bytes(b"\0" * 100)
    result = run("index", "x-*.tar", "--manifest", "dataset.json", cwd=shards)
    assert result.returncode == 1
    assert "not writing dataset.json: some shards failed" in result.stderr
    assert not (shards / "dataset.json").exists()


def test_an_unindexed_shard_is_told_the_command_that_indexes_it(
    shards: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The library's MissingIndexError names build_index(); the command line names the
    `indextar index` command line that builds what is missing, with the same --index-dir,
    and that command works."""
    monkeypatch.chdir(shards)
    with pytest.raises(MissingIndexError, match=r"build it with build_index\(\)$") as raised:
        open_index("x-000000.tar")
    assert raised.value.shards == ("x-000000.tar",)
    assert str(pickle.loads(pickle.dumps(raised.value))) == str(raised.value)

    assert main(["info", "x-000000.tar"]) == 1
    err = capsys.readouterr().err
    assert "shard 'x-000000.tar' has no index (looked for 'x-000000.tar.idx.sqlite')" in err
    assert err.endswith("; build it with `indextar index x-000000.tar`\n")
    assert "build_index" not in err

    assert main(["query", "x-00000[0-2].tar", "--where", "1", "--count"]) == 1
    err = capsys.readouterr().err
    assert "3 of 3 shards have no index" in err and "build_" not in err
    assert "build them with `indextar index x-000000.tar x-000001.tar x-000002.tar`" in err

    assert main(["info", "x-000001.tar", "--index-dir", "my indexes"]) == 1
    command = capsys.readouterr().err.split("`")[1]
    assert command == "indextar index --index-dir 'my indexes' x-000001.tar"
    assert main([*shlex.split(command)[1:], "-q"]) == 0
    assert main(["info", "x-000001.tar", "--index-dir", "my indexes"]) == 0
    assert "50 samples" in capsys.readouterr().out
