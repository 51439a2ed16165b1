"""Readers during writes: processes polling a store while another process appends to it.

Every read must see a length that never decreases and records equal to what the writer
wrote, leaf by leaf: a partly written chunk is never visible, because readers trust only the
commit record and every chunk is replaced whole, in one put.
"""

from __future__ import annotations

import pytest

import pytreestore
from pytreestore._location import Location
from pytreestore.backends import default_backend
from tests.trial_harness import differences, expected, read_log, wait_for

pytest_plugins = ("tests.fixtures",)


def run(zygote, tmp_path, path, *, readers, seconds, chunk, opts=None, codec="zstd", backend=None):
    writer_log = tmp_path / "writer.log"
    writer = zygote.start(
        kind="writer",
        path=path,
        create=True,
        seed=7,
        chunk=chunk,
        codec=codec,
        ops=100_000,
        max_batch=40,
        pause=0.01,
        log=str(writer_log),
        storage_options=opts,
        backend=backend or "tensorstore",
    )
    wait_for(writer_log, "ready")
    logs = [tmp_path / f"reader{r}.log" for r in range(readers)]
    pids = [
        zygote.start(
            kind="reader",
            path=path,
            seed=r,
            seconds=seconds,
            tail=50,
            cache_bytes=(1 << 20) * (r % 2),  # every other reader keeps decoded chunks
            log=str(log),
            storage_options=opts,
        )
        for r, log in enumerate(logs)
    ]
    for pid in pids:
        assert zygote.wait(pid, timeout=seconds + 60) == 0
    zygote.kill(writer)
    assert not [x for x in read_log(writer_log) if x.startswith("FAIL")]
    summaries = []
    for log in logs:
        lines = read_log(log)
        fails = [x for x in lines if x.startswith("FAIL")]
        assert not fails, fails[0]
        lengths = [int(x.split()[1]) for x in lines if x.startswith("read")]
        # the length goes down only across a truncate, which the reader checks itself
        # (trial_harness.truncated_between): the writer truncates now and then
        assert len(set(lengths)) > 3, f"the store hardly grew while read: {set(lengths)}"
        word, last, checked, reads = lines[-1].split()
        assert word == "finished"
        summaries.append((int(last), int(checked), int(reads)))
    # and what is there at the end is right too
    store = pytreestore.open(path, **({"storage_options": opts} if opts else {}))
    n = len(store)
    assert not differences(store.load(as_numpy=True), expected(0, n))
    assert store.verify().ok
    return summaries


@pytest.mark.parametrize("codec", ["zstd", None])  # None: chunks read and written directly
def test_readers_during_local_writes(zygote, tmp_path, codec):
    path = str(tmp_path / "store")
    summaries = run(zygote, tmp_path, path, readers=2, seconds=2, chunk=16, codec=codec)
    print(f"\nlocal readers, {codec} (final length, records checked, reads): {summaries}")


def test_readers_during_ocdbt_writes(zygote, tmp_path):
    """Readers in other processes see each new OCDBT commit (its manifest read again)."""
    path = str(tmp_path / "store")
    summaries = run(zygote, tmp_path, path, readers=2, seconds=2, chunk=16, backend="ocdbt")
    assert default_backend(Location.parse(path)) == "ocdbt"
    print(f"\nOCDBT readers (final length, records checked, reads): {summaries}")


@pytest.mark.s3
def test_a_reader_during_s3_writes(zygote, tmp_path, s3_server, bucket):
    summaries = run(
        zygote,
        tmp_path,
        f"s3://{bucket}/live",
        readers=1,
        seconds=3,
        chunk=16,
        opts=s3_server.options,
    )
    print(f"\nS3 reader (final length, records checked, reads): {summaries}")


def test_a_reader_opened_before_the_first_commit_sees_later_ones(tmp_path):
    path = str(tmp_path / "s")
    writer = pytreestore.create(path, {"x": 0}, chunk_records=4)
    reader = pytreestore.open(path)
    seen = []
    for i in range(10):
        writer.append({"x": i})
        writer.flush()
        seen.append(reader.refresh())
        assert [int(v) for v in reader.load(as_numpy=True)["x"]] == list(range(i + 1))
    assert seen == list(range(1, 11))
    writer.close()
