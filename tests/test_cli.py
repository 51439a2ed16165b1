"""The ``pytreestore`` command.

The console script itself runs in subprocesses, as a user runs it, for what only a real process
shows: that it is installed, its exit codes, what goes to stdout and stderr. Each of those
starts JAX (a second or two), so the finer checks of every command's output call the same
click command in this process with ``CliRunner``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

import pytreestore
import pytreestore.testing
from pytreestore._cli import commands as cli_check
from pytreestore._cli import common as cli_common
from pytreestore.cli import main
from tests import interpreters, trees
from tests.conftest import child_env

SCRIPT = Path(sys.executable).with_name("pytreestore")
COMMANDS = ("info", "head", "verify", "copy")


def launch(*args: str | Path, cwd: Path | None = None) -> subprocess.Popen[str]:
    env = dict(child_env(), COLUMNS="120")
    return interpreters.popen(  # forked from the test zygote (tests/interpreters.py)
        [str(SCRIPT), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
    )


def finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return finish(launch(*args, cwd=cwd))


def read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the terminal's other end is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def invoke(*args: str | Path) -> Result:
    """Runs the command in this process."""
    return CliRunner().invoke(
        main, [str(a) for a in args], prog_name="pytreestore", catch_exceptions=False
    )


def cli_many(*calls: tuple[str | Path, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Runs several commands at once (each starts JAX, which takes a second or two)."""
    procs = [launch(*args) for args in calls]
    return [finish(p) for p in procs]


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "seed.pytreestore"
    with pytreestore.create(path, trees.seed_records()[0]) as store:
        store.extend(trees.seed_records())
    return path


# ---- the real console script ------------------------------------------------------------------


def test_console_script(tmp_path: Path, seed: Path) -> None:
    """Help, output, exit codes, stdout against stderr, and the progress bar: one batch."""
    assert SCRIPT.exists(), f"{SCRIPT} is missing; reinstall with pip install -e ."
    broken = tmp_path / "broken"
    pytreestore.copy(seed, broken)
    (broken / ".pytreestore" / "commit.json").unlink()
    procs = [
        launch("--help"),
        launch("info", seed),
        launch("head", tmp_path / "nothing"),
        launch("info", tmp_path / ("a" * 300)),  # the system refuses the name: no traceback
        launch("verify", broken),
        launch("copy", seed, tmp_path / "copy", "--progress"),
        subprocess.Popen(
            [sys.executable, "-m", "pytreestore", "head", str(seed), "-n", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    ]
    leader, follower = pty.openpty()  # a terminal for the last copy's standard error
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    tty_copy = subprocess.Popen(
        [str(SCRIPT), "copy", str(seed), str(tmp_path / "tty")],
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    helps, info, missing, too_long, verify, copy, module = [finish(p) for p in procs]
    assert tty_copy.wait(timeout=120) == 0
    os.close(follower)
    on_terminal = read_all(leader)
    assert "copy: 100%" in on_terminal and "3/3" in on_terminal  # a bar, unasked
    assert helps.returncode == 0, helps.stderr
    assert "Usage: pytreestore [OPTIONS] COMMAND" in helps.stdout
    assert all(c in helps.stdout for c in COMMANDS)

    assert info.returncode == 0, info.stderr
    assert info.stdout.splitlines()[0] == str(seed)
    assert info.stdout.splitlines()[5].split() == ["AllParams"]
    assert info.stderr == ""

    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == f"pytreestore: error: no store at {tmp_path / 'nothing'}\n"
    assert (too_long.returncode, too_long.stdout) == (2, "")
    assert too_long.stderr.startswith("pytreestore: error: ") and too_long.stderr.count("\n") == 1
    assert "a" * 300 in too_long.stderr

    assert verify.returncode == 1, verify.stderr
    assert "commit.json is missing" in verify.stdout

    assert copy.returncode == 0, copy.stderr
    assert copy.stdout == f"copied 3 records from {seed} to {tmp_path / 'copy'}\n"
    assert "copy: 100%" in copy.stderr and "3/3" in copy.stderr and "MB/s" in copy.stderr

    assert module.returncode == 0, module.stderr
    assert module.stdout.startswith("[0] AllParams\n  .p[0].x  int32[]  4\n")


# ---- each command, in process --------------------------------------------------------------------


@pytest.mark.parametrize("args", [(), *((c,) for c in COMMANDS)], ids=["main", *COMMANDS])
def test_help_everywhere(args: tuple[str, ...]) -> None:
    for flag in ("--help", "-h"):
        result = invoke(*args, flag)
        assert result.exit_code == 0, result.output
        usage = " ".join(("pytreestore", *args))
        assert result.stdout.startswith(f"Usage: {usage} [OPTIONS]")
        assert "-h, --help" in result.stdout


def test_version() -> None:
    result = invoke("--version")
    assert result.stdout == f"pytreestore, version {pytreestore.__version__}\n"


def test_info_draws_the_column_tree(seed: Path) -> None:
    result = invoke("info", seed)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == str(seed)
    assert lines[1] == (
        f"  3 records · 4 columns · format 3 · {store_chunk(seed):,} records per chunk · zstd"
    )
    assert lines[2].startswith("  data 48 B · stored ")
    assert lines[3] == ""
    rows = [line.split() for line in lines[4:]]
    assert rows[0] == ["column", "dtype", "shape", "chunks", "data", "stored", "ratio"]
    assert rows[1] == ["AllParams"]
    assert rows[2] == ["└──", ".p", "list[2]"]
    assert rows[3] == ["├──", "[0]", "Params"]
    assert rows[4][:6] == ["│", "├──", ".x", "int32", "()", f"({store_chunk(seed)},)"]
    assert rows[4][6:8] == ["12", "B"]
    assert rows[7][:3] == ["├──", ".x", "int32"]
    assert len(rows) == 9


def test_info_json(seed: Path) -> None:
    data = json.loads(invoke("info", seed, "--json").stdout)
    assert (data["records"], data["format_version"], data["codec"]) == (3, 3, "zstd")
    assert data["nbytes"] == 48
    assert [c["path"] for c in data["columns"]] == [".p[0].x", ".p[0].y", ".p[1].x", ".p[1].y"]
    column = data["columns"][0]
    assert (column["key"], column["dtype"], column["shape"], column["nbytes"]) == (
        "p/0/x",
        "int32",
        [],
        12,
    )
    assert column["chunks"] == [store_chunk(seed)]
    assert column["stored_bytes"] > 0
    assert column["ratio"] == pytest.approx(12 / column["stored_bytes"])
    assert data["stored_bytes"] == sum(c["stored_bytes"] for c in data["columns"])
    assert data["disk_bytes"] > data["stored_bytes"]


def store_chunk(path: Path) -> int:
    return pytreestore.open(path).schema.chunk_records


def test_head(seed: Path) -> None:
    assert invoke("head", seed, "--full").stdout.splitlines() == [
        "[0] AllParams(p=[Params(x=4, y=2), Params(x=4, y=3)])",
        "[1] AllParams(p=[Params(x=3, y=5), Params(x=2, y=4)])",
        "[2] AllParams(p=[Params(x=3, y=2), Params(x=6, y=3)])",
    ]
    assert invoke("head", seed, "-n", "1").stdout.splitlines()[5] == "... 2 more of 3 records"
    assert invoke("head", seed, "--records", "0").stdout == "... 3 more of 3 records\n"
    records = json.loads(invoke("head", seed, "--json").stdout)
    assert records[2] == {"p": [{"x": 3, "y": 2}, {"x": 6, "y": 3}]}
    assert json.loads(invoke("head", seed, "-n", "0", "--json").stdout) == []
    refused = invoke("head", seed, "-n", "-1")
    assert refused.exit_code == 2 and "-1 is not in the range x>=0" in refused.stderr


def test_head_breaks_wide_records_and_prints_every_dtype(tmp_path: Path) -> None:
    like = {
        "half": np.float16(0),
        "bf": np.zeros(2, "bfloat16"),
        "c": np.complex64(0),
        "flag": np.bool_(False),
        "big": np.int64(0),
        "m": np.zeros((2, 2), np.float32),
        "pair": trees.Pair(np.float32(0), None),
    }
    record = {
        "half": np.float16(1.5),
        "bf": np.array([1, 2], "bfloat16"),
        "c": np.complex64(1 + 2j),
        "flag": np.bool_(True),
        "big": np.int64(2**40),
        "m": np.eye(2, dtype=np.float32),
        "pair": trees.Pair(np.float32(0.25), None),
    }
    with pytreestore.create(tmp_path / "s", like) as store:
        store.append(record)
    out = invoke("head", tmp_path / "s", "--full").stdout
    assert out.startswith("[0] {\n")
    assert "  'big': 1099511627776,\n" in out
    assert "  'm': [[1., 0.],\n        [0., 1.]],\n" in out
    assert "  'pair': Pair(left=0.25, right=None),\n" in out
    assert "'c': 1.+2.j" in out and "'flag': True" in out and "'half': 1.5" in out
    assert json.loads(invoke("head", tmp_path / "s", "--json").stdout) == [
        {
            "bf": [1.0, 2.0],
            "big": 2**40,
            "c": [1.0, 2.0],
            "flag": True,
            "half": 1.5,
            "m": [[1.0, 0.0], [0.0, 1.0]],
            "pair": {"left": 0.25, "right": None},
        }
    ]


def test_errors_exit_2_with_one_line(tmp_path: Path, seed: Path) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hi")
    not_store = invoke("info", tmp_path / "other")
    assert not_store.exit_code == 2
    assert not_store.stderr.startswith("pytreestore: error: ")
    assert "is not a pytreestore store" in not_store.stderr
    bad_codec = invoke("copy", seed, tmp_path / "c", "--codec", "lzma")
    assert bad_codec.exit_code == 2 and "Invalid value for '--codec'" in bad_codec.stderr
    bad_chunks = invoke("copy", seed, tmp_path / "c", "--chunk-records", "0")
    assert bad_chunks.exit_code == 2 and "--chunk-records" in bad_chunks.stderr
    exists = invoke("copy", seed, tmp_path / "other")
    assert exists.exit_code == 2
    assert "other data" in exists.stderr
    itself = invoke("copy", seed, seed, "--overwrite")
    assert itself.exit_code == 2 and "the two overlap" in itself.stderr
    backend = invoke("copy", seed, tmp_path / "c", "--backend", "floppy")
    assert backend.exit_code == 2 and "unknown backend 'floppy'" in backend.stderr
    assert pytreestore.open(seed).load(as_numpy=True).p[0].x.tolist() == [4, 3, 3]


ALL = {  # every command, with the paths it takes
    "info": ("{src}",),
    "head": ("{src}", "--full"),
    "verify": ("{src}",),
    "versions": ("{src}",),
    "copy": ("{src}", "{dst}"),
}


def _args(command: str, src: Path, dst: Path) -> list[str]:
    return [command, *(a.format(src=src, dst=dst) for a in ALL[command])]


def test_all_means_every_command() -> None:
    assert set(ALL) == set(main.commands)


def _one_error_line(result: Result) -> str:
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr.startswith("pytreestore: error: ") and result.stderr.count("\n") == 1
    return result.stderr.removeprefix("pytreestore: error: ").rstrip("\n")


@pytest.mark.parametrize("command", sorted(ALL))
def test_every_command_fails_with_one_line_and_status_2(tmp_path: Path, command: str) -> None:
    """A missing store, a store whose commit record is damaged, a file that is no store, and a
    name the operating system refuses (an OSError pytreestore does not turn into its own
    error): one line on standard error and status 2, never a traceback."""
    missing = tmp_path / "missing"
    assert _one_error_line(invoke(*_args(command, missing, tmp_path / "c1"))) == (
        f"no store at {missing}"
    )
    damaged = tmp_path / "damaged"
    with pytreestore.create(damaged, {"x": np.float32(0)}) as store:
        store.append({"x": np.float32(1)})
    (damaged / ".pytreestore" / "commit.json").write_text("{not json")
    result = invoke(*_args(command, damaged, tmp_path / "c2"))
    if command == "verify":  # a store too damaged to open is a problem found: status 1
        assert result.exit_code == 1 and "not a valid commit record" in result.stdout
    else:
        assert "commit.json is not a valid commit record" in _one_error_line(result)
    text = tmp_path / "notes.txt"
    text.write_text("hi")
    assert "is a file, not a directory" in _one_error_line(invoke(*_args(command, text, tmp_path)))
    too_long = tmp_path / ("a" * 300)
    assert str(too_long) in _one_error_line(invoke(*_args(command, too_long, tmp_path / "c3")))


@pytest.mark.parametrize("command", sorted(ALL))
def test_an_os_error_is_its_file_and_reason(
    tmp_path: Path, seed: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(path: object, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", f"{path}/zarr.json")

    monkeypatch.setattr(cli_common, "open_without_classes", refused)
    monkeypatch.setattr(cli_check, "open_without_classes", refused)
    monkeypatch.setattr(pytreestore, "copy", refused)
    line = _one_error_line(invoke(*_args(command, seed, tmp_path / "c")))
    assert line == f"{seed}/zarr.json: Permission denied"


def test_an_os_error_without_a_file_names_the_command_paths(
    tmp_path: Path, seed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pytreestore, "copy", full)
    line = _one_error_line(invoke("copy", seed, tmp_path / "c"))
    assert line == f"{seed} -> {tmp_path / 'c'}: No space left on device"


def test_a_bug_keeps_its_traceback(seed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli_common, "open_without_classes", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        invoke("info", seed)


def test_copy_rechunks_and_recompresses(tmp_path: Path, seed: Path) -> None:
    dst = tmp_path / "copy.pytreestore"
    result = invoke("copy", seed, dst, "--chunk-records", "2", "--codec", "none", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"src": str(seed), "dst": str(dst), "records": 3}
    assert result.stderr == ""
    copied = pytreestore.open(dst)
    assert (copied.schema.chunk_records, copied.schema.codec) == (2, None)
    assert [c.chunks for c in copied.schema.columns] == [(2,)] * 4
    pytreestore.testing.assert_trees_equal(copied[:], pytreestore.open(seed)[:])

    again = invoke("copy", seed, dst)
    assert again.exit_code == 2 and "pass --overwrite to replace it" in again.stderr
    third = dst.with_name("third")
    assert invoke("copy", dst, third, "--codec", "gzip").exit_code == 0
    assert (pytreestore.open(third).schema.chunk_records, pytreestore.open(third).schema.codec) == (
        2,
        "gzip",
    )
    replaced = invoke("copy", third, dst, "--overwrite")
    assert replaced.stdout == f"copied 3 records from {third} to {dst}\n"
    assert pytreestore.open(dst).schema.codec == "gzip"


def test_copy_packs_and_unpacks(tmp_path: Path, seed: Path) -> None:
    """--pack keep|off|on|N, as pytreestore.copy's pack="keep"|False|True|N."""
    want = pytreestore.open(seed)[:]
    packed = tmp_path / "packed"
    assert invoke("copy", seed, packed, "--pack", "on").exit_code == 0
    schema = pytreestore.open(packed).schema
    assert [len(p.members) for p in schema.packs] == [4]
    assert [c.key for c in schema.storage_columns] == [schema.packs[0].key]
    kept, off = tmp_path / "kept", tmp_path / "off"
    assert invoke("copy", packed, kept).exit_code == 0  # keep, the default
    assert pytreestore.open(kept).schema.packs == schema.packs
    result = invoke("copy", packed, off, "--pack", "OFF", "--json")
    assert json.loads(result.stdout)["records"] == 3
    assert pytreestore.open(off).schema.packs == ()
    for path in (packed, kept, off):
        pytreestore.testing.assert_trees_equal(pytreestore.open(path)[:], want)
    size = schema.columns[0].record_nbytes  # every leaf of the seed has this many bytes
    for limit, packs in ((size, 1), (size - 1, 0)):
        dst = tmp_path / f"limit{limit}"
        assert invoke("copy", seed, dst, "--pack", str(limit)).exit_code == 0
        assert len(pytreestore.open(dst).schema.packs) == packs


@pytest.mark.parametrize("value", ["maybe", "0", "-3", "1.5", "", "true"])
def test_copy_refuses_a_bad_pack(tmp_path: Path, seed: Path, value: str) -> None:
    result = invoke("copy", seed, tmp_path / "c", "--pack", value)
    assert result.exit_code == 2
    assert "Invalid value for '--pack'" in result.stderr
    assert f"{value!r}: expected 'keep' (pack as the source is packed), 'off'" in result.stderr
    assert not (tmp_path / "c").exists()  # refused before anything was written


def test_copy_packs_ragged_records(tmp_path: Path) -> None:
    """--pack on packs a ragged store's record table and its list's table, each within
    itself (it was refused: "pack= packs the leaves of fixed records")."""
    source = tmp_path / "ragged"
    lists = [
        {
            "p": [{"a": np.float32(j), "b": np.float32(-j)} for j in range(k)],
            "n": np.int32(k),
            "m": np.int32(-k),
        }
        for k in (2, 0, 3)
    ]
    with pytreestore.create(source, lists[0], ragged=True) as store:
        store.extend(lists)
    result = invoke("copy", source, tmp_path / "c", "--pack", "on")
    assert result.exit_code == 0, result.output
    copy = pytreestore.open(tmp_path / "c")
    assert [[k for k, _, _ in p.members] for p in copy.schema.packs] == [
        ["m", "n"],  # a dict's keys, sorted
        ["p/-2A/a", "p/-2A/b"],
    ]
    for got, want in zip(copy.records(as_numpy=True), lists, strict=True):
        assert [float(e["a"]) for e in got["p"]] == [float(e["a"]) for e in want["p"]]
        assert [float(e["b"]) for e in got["p"]] == [float(e["b"]) for e in want["p"]]
        assert (int(got["n"]), int(got["m"])) == (int(want["n"]), int(want["m"]))


def test_verify_a_store_too_damaged_to_open(tmp_path: Path, seed: Path) -> None:
    broken = tmp_path / "broken"
    pytreestore.copy(seed, broken)
    (broken / ".pytreestore" / "commit.json").unlink()
    text = invoke("verify", broken)
    assert text.exit_code == 1, text.output
    assert text.stdout.startswith(f"{broken}: 1 problem(s)\n  - ")
    assert "commit.json is missing" in text.stdout
    as_json = invoke("verify", broken, "--json")
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert report["records"] is None and report["ok"] is False and len(report["problems"]) == 1
    assert "commit.json" in report["problems"][0]
    assert invoke("verify", tmp_path / "nothing").exit_code == 2


def test_verify_good_and_damaged_stores(tmp_path: Path, seed: Path) -> None:
    good = invoke("verify", seed)
    assert good.exit_code == 0, good.output
    assert good.stdout.startswith(f"{seed}: OK (3 records, 4 columns")
    damaged = tmp_path / "damaged"
    pytreestore.copy(seed, damaged)
    (damaged / "p" / "1" / "y" / "c" / "0").write_bytes(b"not zstd at all")
    bad = invoke("verify", damaged)
    assert bad.exit_code == 1, bad.output
    assert "problem(s)" in bad.stdout and ".p[1].y" in bad.stdout
    bad_json = invoke("verify", damaged, "--json")
    report = json.loads(bad_json.stdout)
    assert bad_json.exit_code == 1 and report["problems"] and report["ok"] is False
    assert (report["records"], report["columns"]) == (3, 4)
    assert ".p[1].y" in json.dumps(report["problems"][0])


def test_verify_progress_draws_a_bar_of_chunks(seed: Path) -> None:
    shown = invoke("verify", seed, "--progress")
    assert shown.exit_code == 0, shown.output
    bar = shown.stderr.split("\r")[-1]
    assert bar.startswith("verify: 100%") and "4/4 " in bar and " chunks/s" in bar, bar
    assert shown.stdout.startswith(f"{seed}: OK (3 records, 4 columns")
    assert invoke("verify", seed, "--no-progress").stderr == ""
