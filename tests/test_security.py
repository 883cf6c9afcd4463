"""Security: hostile shards and names never run code, run shell commands, write outside
the target folder, or reach SQL as anything but a parameter."""

from __future__ import annotations

import ast
import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tar_bytes
from tarcraft import blocks, header, pax_records

from indextar import (
    IndexedTarDataset,
    IndextarError,
    StreamingTarDataset,
    UnsafeMemberError,
    build_index,
    open_index,
)
from indextar.errors import PipeRefusedError
from indextar.write.create import create_shards
from indextar.write.reshard import reshard

PACKAGE = Path(__file__).resolve().parent.parent / "indextar"


class _Mkdir:
    """Unpickling this creates a folder: proof that unpickling ran code."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (self.path,)


def tree_snapshot(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- unsafe decoders ---------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["pkl", "pickle", "pyd", "pth"])
@pytest.mark.parametrize("reader", ["indexed", "streaming"])
def test_pickles_never_run_without_allow_unsafe(ext: str, reader: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    if ext == "pth":
        import torch

        buf = io.BytesIO()
        torch.save({"x": _Mkdir(marker)}, buf)
        payload = buf.getvalue()
    else:
        payload = pickle.dumps(_Mkdir(marker))
    shard = tmp_path / "evil.tar"
    shard.write_bytes(tar_bytes({f"s0.{ext}": payload, "s0.cls": b"1"}))

    def first_sample(**options: object) -> object:
        if reader == "indexed":
            return IndexedTarDataset(shard, decode="torch", **options)[0]  # type: ignore[arg-type]
        return next(iter(StreamingTarDataset(str(shard), decode="torch", **options)))  # type: ignore[arg-type]

    with pytest.raises(UnsafeMemberError, match="allow_unsafe=True"):
        first_sample()
    assert not marker.exists()
    if ext != "pth":  # torch.load's own weights_only guard refuses it even then
        first_sample(allow_unsafe=True)
        assert marker.exists()  # the guard above is what stopped it


# -- pipe: URLs ----------------------------------------------------------------------------


def test_refused_pipe_commands_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INDEXTAR_ALLOW_PIPE", raising=False)
    marker = tmp_path / "ran"
    url = f"pipe:touch {marker}; cat /dev/null"
    with pytest.raises(PipeRefusedError):
        list(StreamingTarDataset(url))
    with pytest.raises(IndextarError):
        IndexedTarDataset(url)
    done = subprocess.run(
        [sys.executable, "-m", "indextar", "ls", url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert not marker.exists()


# -- nothing written outside the target folder ------------------------------------------------


def hostile_shard() -> bytes:
    """Members named to escape: ``../``, absolute, a PAX path and a GNU long name doing
    the same, and one sane member."""
    long_name = b"../../" + b"d/" * 60 + b"evil.jpg\0"
    pax = pax_records({"path": "../../pax-evil.jpg"})
    return (
        header("../../up-evil.jpg", 3)
        + blocks(b"one")
        + header("/abs/evil.jpg", 3)
        + blocks(b"two")
        + header("././@PaxHeader", len(pax), typeflag=b"x")
        + blocks(pax)
        + header("placeholder.jpg", 5)
        + blocks(b"three")
        + header("././@LongLink", len(long_name), typeflag=b"L")
        + blocks(long_name)
        + header("placeholder2.jpg", 4)
        + blocks(b"four")
        + header("ok.jpg", 2)
        + blocks(b"ok")
        + bytes(1024)
    )


def test_reshard_of_hostile_names_writes_only_its_output_shards(tmp_path: Path) -> None:
    source = tmp_path / "in" / "evil.tar"
    source.parent.mkdir()
    source.write_bytes(hostile_shard())
    out = tmp_path / "deep" / "out"
    out.mkdir(parents=True)
    before = tree_snapshot(tmp_path)
    try:
        reshard([source], str(out / "r-%03d.tar"), index_dir=tmp_path / "in")
    except IndextarError:
        pass  # refusing the names is fine too: what matters is where files went
    created = sorted(set(tree_snapshot(tmp_path)) - set(before))
    assert all(
        name.startswith("deep/out/r-") or name.startswith("in/evil.tar") for name in created
    ), created


def test_cat_of_hostile_names_writes_to_stdout_only(tmp_path: Path) -> None:
    source = tmp_path / "evil.tar"
    source.write_bytes(hostile_shard())
    build_index(source)
    before = tree_snapshot(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "indextar", "cat", str(source), "../../up-evil.jpg"],
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"one"
    assert tree_snapshot(tmp_path) == before


def test_create_from_a_tree_with_hostile_file_names_stays_in_its_folder(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    names = [
        "a.jpg",
        "sub/b.jpg",
        "new\nline.jpg",
        "back\\slash.jpg",
        "-dash.jpg",
        "..dots.jpg",
        "sp ace.jpg",
    ]
    for name in names:
        (tree / name).write_bytes(name.encode())
    out = tmp_path / "out"
    out.mkdir()
    before = tree_snapshot(tmp_path)
    create_shards(tree, str(out / "c-%03d.tar"))
    created = sorted(set(tree_snapshot(tmp_path)) - set(before))
    assert created and all(name.startswith("out/c-") for name in created), created
    ds = IndexedTarDataset(sorted(str(p) for p in out.glob("c-*.tar")))
    keys = {ds[i]["__key__"] for i in range(len(ds))}
    assert "new\nline" not in keys and {"a", "sub/b"} <= keys


# -- SQL -------------------------------------------------------------------------------------

# Interpolations allowed inside SQL strings, and why each cannot carry user data.
SQL_INTERPOLATIONS = {
    "table": "one of the fixed table names ('members', 'samples', 'skipped')",
    "code": "CASE branches 'WHEN ? THEN <int>': integers from range(); the values are parameters",
    "n": "an integer from range()",
    # per-sample attributes (indextar/index/attributes.py): field names come from samples'
    # JSON or a parquet table, so they reach SQL only as identifiers quoted by quote()
    # (wrapped in double quotes, each double quote doubled), and types only from
    # _declared_type's fixed set ("INTEGER", "REAL", "TEXT", "")
    "columns": "', <quote(name)> <declared type>' for each attribute",
    "column": "quote(name): an attribute's name as a quoted identifier",
    "selected": "', '.join(quote(name)) over the attribute columns (export_parquet)",
    "declared[name]": "a type from _declared_type's fixed set",
    "marks": "', ?' once per column: the values are parameters",
}
# Not checked here: ds.where(sql) and `indextar query --where` run the caller's own SQL
# expression, by design, inside a SELECT on a read-only connection (read/selection.py).


def sql_calls() -> list[tuple[str, int, ast.expr]]:
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "executemany", "executescript")
                and node.args
            ):
                calls.append((path.name, node.lineno, node.args[0]))
    return calls


def interpolations(expr: ast.expr) -> list[str]:
    """Source of every value formatted into a SQL string expression."""
    found = []
    for node in ast.walk(expr):
        if isinstance(node, ast.FormattedValue):
            found.append(ast.unparse(node.value))
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, (ast.Mod, ast.Add))
            and (isinstance(node.left, ast.Constant) and isinstance(node.left.value, str))
        ):
            found.append(ast.unparse(node.right))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
        ):
            found.extend(ast.unparse(a) for a in node.args)
    return found


def test_sql_is_built_only_from_constants() -> None:
    calls = sql_calls()
    assert len(calls) > 10  # the search finds the queries
    for file, line, expr in calls:
        for value in interpolations(expr):
            assert value in SQL_INTERPOLATIONS, f"{file}:{line} formats {value!r} into SQL"
        # A SQL argument that is a bare name must be a constant string or built as above.
        if isinstance(expr, ast.Name):
            assert expr.id in {"sql", "tables", "indexes", "query"}, (
                f"{file}:{line} runs SQL from {expr.id!r}"
            )


@pytest.mark.parametrize(
    "key", ["a'; DROP TABLE samples; --", 'q"uote', "x' OR '1'='1", "back\\slash%_"]
)
def test_keys_that_look_like_sql_are_only_data(key: str, tmp_path: Path) -> None:
    shard = tmp_path / "sql.tar"
    shard.write_bytes(tar_bytes({f"{key}.txt": b"payload", "other.txt": b"x"}))
    index = build_index(shard)
    assert index.keys() == [key, "other"]
    assert index.find_key(key) == [0] and index.find_key("x' OR '1'='1" + "z") == []
    ds = IndexedTarDataset(shard)
    assert ds[ds.index_of(key)]["txt"] == b"payload"
    assert len(open_index(shard)) == 2  # the tables are all still there
