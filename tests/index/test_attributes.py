"""Per-sample attributes stored in a shard's index at build time (issue 16, part 1)."""

from __future__ import annotations

import json
import logging
import sqlite3
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

import indextar
from indextar.index import extensions as index_extensions
from indextar.index.attributes import attribute_errors, attribute_sources
from indextar.index.verify import verify_index


def _records(n: int) -> list[dict[str, object]]:
    return [
        {
            "aesthetic": (i * 37 % 100) / 10,
            "width": 64 * (1 + i % 20),
            "lang": ["en", "de", "fr"][i % 3],
            "nsfw": i % 7 == 0,
            "tags": {"n": i, "list": [i, "x"]},
        }
        for i in range(n)
    ]


def _members(records: list[dict[str, object]], *, bad: dict[int, bytes] | None = None) -> dict:
    members: dict[str, bytes] = {}
    for i, record in enumerate(records):
        members[f"s{i:05d}.jpg"] = b"j" * (10 + i)
        text = (bad or {}).get(i)
        if text is None:
            text = json.dumps(record).encode()
        if text != b"<none>":
            members[f"s{i:05d}.json"] = text
    return members


def _rows(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


def test_fields_become_columns_that_match_each_sample_json(
    make_tar: Callable[..., Path], scanner: str
) -> None:
    """Both ways: rows through _sqlitebulk.c ("c") and through executemany ("numpy")."""
    records = _records(40)
    shard = make_tar(_members(records))
    ix = indextar.build_index(shard, attributes_from="json")
    rows = _rows(ix.path, "SELECT * FROM attributes ORDER BY __sample__")
    assert [r[0] for r in rows] == list(range(40))
    # Read back each sample's JSON with tarfile, independently of the scanner.
    with tarfile.open(shard) as tf:
        truth = {
            m.name.split(".")[0]: json.loads(tf.extractfile(m).read())  # type: ignore[union-attr]
            for m in tf.getmembers()
            if m.name.endswith(".json")
        }
    keys = ix.keys()
    for row in rows:
        want = truth[keys[row[0]]]
        assert row[1:] == (
            want["aesthetic"],
            want["width"],
            want["lang"],
            int(want["nsfw"]),
            json.dumps(want["tags"], separators=(",", ":")),
        )
    columns = _rows(ix.path, "SELECT name, type, source FROM attribute_columns ORDER BY name")
    assert columns == [
        ("aesthetic", "REAL", "json:json"),
        ("lang", "TEXT", "json:json"),
        ("nsfw", "INTEGER", "json:json"),
        ("tags", "TEXT", "json:json"),
        ("width", "INTEGER", "json:json"),
    ]
    # Nested values are JSON text that SQLite's JSON functions read.
    assert _rows(ix.path, "SELECT json_extract(tags, '$.list[0]') FROM attributes LIMIT 3") == [
        (0,),
        (1,),
        (2,),
    ]
    # The format is unchanged, and the index still verifies row by row.
    assert ix.meta.format_version == indextar.open_index(shard).meta.format_version
    verify_index(shard)


def test_an_index_without_meta_has_no_attribute_tables(make_tar: Callable[..., Path]) -> None:
    shard = make_tar(_members(_records(5)))
    ix = indextar.build_index(shard)
    tables = {name for (name,) in _rows(ix.path, "SELECT name FROM sqlite_master")}
    assert not {"attributes", "attribute_columns", "attribute_errors"} & tables
    assert not ix.has_attributes()
    # Asking for meta rebuilds it; asking again without meta reuses the richer index.
    rebuilt = indextar.build_index(shard, attributes_from="json")
    assert rebuilt.has_attributes() and rebuilt.path.stat().st_ino != 0
    inode = rebuilt.path.stat().st_ino
    assert indextar.build_index(shard).has_attributes()
    assert rebuilt.path.stat().st_ino == inode


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b'{"aesthetic": 5,', "is not valid JSON"),
        (b"\xff\xfe{}", "is not valid JSON"),
        (b'{"a": 1} {"b": 2}', "is not valid JSON .Extra data"),
        (b'{"a": 1},{"b": 2}', "is not valid JSON .Extra data"),
        (b"[1, 2]", "is a JSON list, not an object"),
        (b"<none>", "has no 'json' member"),
        (b'{"__key__": 1}', "whose name is reserved"),
    ],
)
def test_a_bad_sample_fails_naming_shard_and_key(
    make_tar: Callable[..., Path], text: bytes, problem: str
) -> None:
    shard = make_tar(_members(_records(12), bad={7: text}))
    with pytest.raises(indextar.SampleAttributeError, match=problem) as info:
        indextar.build_index(shard, attributes_from="json")
    assert info.value.shard == str(shard) and info.value.key == "s00007"
    assert "'s00007'" in str(info.value) and str(shard) in str(info.value)
    assert not indextar.index_path(shard).exists()  # no index left behind
    assert not list(shard.parent.glob(".*.tmp"))


def test_skip_records_and_logs_every_bad_sample(
    make_tar: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    records = _records(12)
    shard = make_tar(_members(records, bad={3: b"{oops", 8: b"<none>"}))
    with caplog.at_level(logging.WARNING):
        ix = indextar.build_index(shard, attributes_from="json", on_error="skip")
    assert len(ix) == 12  # the samples stay in the index; only their attributes are missing
    assert "2 of 12 samples have no attributes" in caplog.text and "'s00003'" in caplog.text
    with sqlite3.connect(ix.path) as conn:
        errors = attribute_errors(conn)
        assert [sample for sample, _ in errors] == [3, 8]
        assert "not valid JSON" in errors[0][1] and "has no 'json' member" in errors[1][1]
        assert attribute_sources(conn)["width"] == "json:json"
    widths = _rows(ix.path, "SELECT width FROM attributes ORDER BY __sample__")
    assert [w for (w,) in widths] == [
        None if i in (3, 8) else records[i]["width"] for i in range(12)
    ]


def test_the_c_writer_stores_what_executemany_stores(
    make_tar: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from indextar import native

    records = _records(30) + [{"big": 2**70, "flag": True, "mixed": "x"}, {"mixed": 2.5}]
    shard = make_tar(_members(records))
    sql = "SELECT *, typeof(aesthetic), typeof(big), typeof(mixed) FROM attributes"
    assert index_extensions.sqlitebulk() is not None
    ix = indextar.build_index(shard, attributes_from="json")
    by_c = _rows(ix.path, sql)
    monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
    ix = indextar.build_index(shard, attributes_from="json", force=True)
    assert _rows(ix.path, sql) == by_c
    assert by_c[30][-3:] == ("null", "text", "text") and by_c[31][-1] == "real"


def test_a_lone_surrogate_is_stored_as_the_replacement_character(
    make_tar: Callable[..., Path],
) -> None:
    shard = make_tar({"a.json": b'{"caption": "x\\ud800y", "ok": "\\ud83d\\ude00"}'})
    ix = indextar.build_index(shard, attributes_from="json")
    assert _rows(ix.path, "SELECT caption, ok FROM attributes") == [("x\ufffdy", "\U0001f600")]


def test_space_around_the_object_is_json(make_tar: Callable[..., Path]) -> None:
    shard = make_tar({"a.json": b' \n{"w": 1}', "b.json": b'{"w": 2}\n', "c.json": b'{"w": 3}'})
    ix = indextar.build_index(shard, attributes_from="json")
    assert _rows(ix.path, "SELECT w FROM attributes ORDER BY __sample__") == [(1,), (2,), (3,)]


def test_skip_names_the_one_sample_with_a_refused_field(make_tar: Callable[..., Path]) -> None:
    records = _records(6)
    shard = make_tar(_members(records, bad={4: b'{"__count__": 3, "width": 1}'}))
    ix = indextar.build_index(shard, attributes_from="json", on_error="skip")
    with sqlite3.connect(ix.path) as conn:
        assert [sample for sample, _ in attribute_errors(conn)] == [4]
    widths = [w for (w,) in _rows(ix.path, "SELECT width FROM attributes ORDER BY __sample__")]
    assert widths == [records[i]["width"] if i != 4 else None for i in range(6)]


def test_case_clashing_fields_are_a_sample_error(make_tar: Callable[..., Path]) -> None:
    members = {"a.json": b'{"Width": 1}', "b.json": b'{"width": 2}'}
    shard = make_tar(members)
    with pytest.raises(indextar.SampleAttributeError, match="only in case") as info:
        indextar.build_index(shard, attributes_from="json")
    assert info.value.key == "b"


def test_case_clashing_fields_in_one_object_are_a_sample_error(
    make_tar: Callable[..., Path],
) -> None:
    shard = make_tar({"a.json": b'{"width": 1}', "b.json": b'{"Size": 1, "size": 2}'})
    with pytest.raises(indextar.SampleAttributeError, match="only in case") as info:
        indextar.build_index(shard, attributes_from="json")
    assert info.value.key == "b"


def test_build_indexes_and_the_cli_pass_meta_on(
    make_tar: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from indextar.cli.commands import main

    good = make_tar(_members(_records(6)), name="good.tar")
    bad = make_tar(_members(_records(6), bad={2: b"nope"}), name="bad.tar")
    built = indextar.build_indexes([str(good)], attributes_from="json", workers=2)
    assert built[0].has_attributes()
    assert main(["index", "-j", "2", str(good), str(bad), "--meta", "json"]) == 1
    err = capsys.readouterr().err
    assert f"shard {str(bad)!r}, sample 's00002'" in err
    assert not indextar.index_path(bad).exists()
    assert main(["index", "-j", "1", str(bad), "--meta", "json", "--on-error", "skip"]) == 0
    assert indextar.open_index(bad).has_attributes()


def test_an_index_with_other_attributes_is_rebuilt_for_meta(make_tar: Callable[..., Path]) -> None:
    # Attributes from the ".txt" members are not the ".json" members' attributes.
    members = {"a.txt": b'{"t": 1}', "a.json": b'{"j": 2}', "b.txt": b'{"t": 3}', "b.json": b"{}"}
    shard = make_tar(members)
    from_txt = indextar.build_index(shard, attributes_from="txt")
    inode = from_txt.path.stat().st_ino
    assert from_txt.has_attributes() and from_txt.has_attributes("txt")
    assert not from_txt.has_attributes("json")
    from_json = indextar.build_index(shard, attributes_from="json")
    assert from_json.path.stat().st_ino != inode
    assert _rows(from_json.path, "SELECT * FROM attributes ORDER BY __sample__") == [
        (0, 2),
        (1, None),
    ]
    # Built with attributes_from="json", it is reused, also where every member failed (no column).
    inode = from_json.path.stat().st_ino
    assert indextar.build_index(shard, attributes_from="json").path.stat().st_ino == inode
    failed = indextar.build_index(shard, attributes_from="jpg", on_error="skip", force=True)
    assert failed.has_attributes("jpg") and not failed.has_attributes("json")
    inode = failed.path.stat().st_ino
    assert (
        indextar.build_index(shard, attributes_from="jpg", on_error="skip").path.stat().st_ino
        == inode
    )


def test_a_rerun_with_meta_is_answered_by_the_quick_check(make_tar: Callable[..., Path]) -> None:
    from indextar.index.fresh import fresh_on_stat
    from indextar.index.jobs import BuildOptions

    shard = make_tar(_members(_records(4)))
    indextar.build_index(shard)
    assert fresh_on_stat(str(shard), BuildOptions(meta="json")) is None  # no attributes
    built = indextar.build_index(shard, attributes_from="json")
    fresh = fresh_on_stat(str(shard), BuildOptions(meta="json"))
    assert fresh is not None and fresh.path == built.path and fresh.meta == built.meta
    assert fresh_on_stat(str(shard), BuildOptions(meta="txt")) is None  # other members


def test_meta_is_the_deprecated_name_of_attributes_from(
    make_tar: Callable[..., Path], tmp_path: Path
) -> None:
    """``meta=`` (issue 24) still works for one release, with a DeprecationWarning that
    names the new keyword; both at once is refused."""
    shard = make_tar(_members(_records(6)))
    with pytest.warns(DeprecationWarning, match=r"build_index\(attributes_from=\.\.\.\)"):
        ix = indextar.build_index(shard, meta="json")
    assert ix.json_members() == ["json"]
    with pytest.warns(DeprecationWarning, match="has_attributes"):
        assert ix.has_attributes(meta="json")
    with pytest.warns(DeprecationWarning, match="build_indexes"):
        (built,) = indextar.build_indexes([str(shard)], meta="json", workers=1)
    assert built.path == ix.path and built.has_attributes("json")
    with pytest.warns(DeprecationWarning, match="ShardWriter"):
        writer = indextar.ShardWriter(str(tmp_path / "w-%03d.tar"), meta="json")
    with writer as sink:
        sink.write({"__key__": "a", "json": b'{"x": 1}'})
    assert indextar.open_index(sink.shards[0]).has_attributes("json")
    with pytest.warns(DeprecationWarning, match="TarWriter"):
        indextar.TarWriter(tmp_path / "t.tar", meta="json").close()
    with pytest.raises(TypeError, match="not both"):
        indextar.build_index(shard, attributes_from="json", meta="json")
