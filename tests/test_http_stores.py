"""Stores read over HTTP (read-only), on both backends and every kind of store, from a folder
served by Python's ``http.server`` on 127.0.0.1 (``tests/http_server.py``); and ``file://``
URLs, which name the local store at their path."""

from __future__ import annotations

import html
import re
import shutil
import threading
import time
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import pytreestore
from pytreestore._location import Location
from pytreestore.backends import KeyListing, capable
from pytreestore.backends._registry import backend_at
from pytreestore.cli import main
from pytreestore.errors import (
    CorruptChunkError,
    NotAStoreError,
    PyTreeStoreError,
    ReadOnlyError,
    StorageError,
    StoreNotFoundError,
    VersionNotFoundError,
)
from tests.http_server import serve
from tests.parity import kinds

READERS = ("tensorstore", "zarr")
#: quick failures: a dead server is given up on within seconds
FAST = {"max_retries": 1, "retry_delay": 0.05, "total_timeout": 10}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A served folder holding one store of every kind per backend (9 records, then 3 more
    in a second commit tagged 'nine-plus'), and the records of each."""
    folder = tmp_path_factory.mktemp("site")
    written = {}
    for name in kinds.KINDS:
        for backend in READERS:
            path = folder / f"{name}-{backend}"
            records = kinds.filled(path, name, backend)
            more = kinds.records(name, 3, start=9)
            with pytreestore.open(path, "a", backend=backend) as store:
                store.extend(more)
                store.flush()
                store.tag("nine-plus")
            written[name, backend] = records + more
    with serve(folder) as (url, faults):
        yield url, folder, faults, written


MATRIX = [(k, b) for k in kinds.KINDS for b in READERS]


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=[f"{k}-{b}" for k, b in MATRIX])
def test_every_kind_of_store_reads_over_http(site, name, backend):
    url, _, _, written = site
    want = written[name, backend]
    store = pytreestore.open(f"{url}/{name}-{backend}", backend=backend)
    assert len(store) == 12 and store.mode == "r"
    kinds.assert_same(list(store.records(as_numpy=True)), want)
    kinds.assert_same(store[5], want[5])
    kinds.assert_same([store[i] for i in range(12)], want)
    assert sum(1 for _ in store.batches(4)) == 3
    report = store.verify()
    assert report.ok, report
    assert [(v.version, v.records) for v in store.versions()] == [(0, 0), (1, 9), (2, 12)]
    store.close()


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=[f"{k}-{b}" for k, b in MATRIX])
def test_the_notebook_view_over_http_says_what_it_cannot_list(site, name, backend):
    """The view shows values read over HTTP, and says that versions and tags are not listed
    (a web server cannot list; it used to show "1 kept" and no tags)."""
    url, folder, faults, written = site
    store = pytreestore.open(f"{url}/{name}-{backend}", backend=backend)
    sent = len(faults.requests)
    page = re.sub(r"<style.*?</style>", "", store._repr_html_(), flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert "version 2 · versions and tags not listed: a web server cannot list them" in text
    assert "kept" not in text and "pts-error" not in page
    assert len(faults.requests) - sent < 200  # no request per version
    local = pytreestore.open(folder / f"{name}-{backend}", backend=backend)._repr_html_()
    assert "3 kept" in html.unescape(local) and "nine-plus (version 2)" in local
    assert "record 0" in text and "record 11" in text  # the values were read over HTTP
    assert len(written[name, backend]) == 12


@pytest.mark.parametrize("backend", READERS)
def test_a_store_written_by_one_backend_reads_with_the_other(site, backend):
    url, _, _, written = site
    other = "zarr" if backend == "tensorstore" else "tensorstore"
    store = pytreestore.open(f"{url}/nested-{other}", backend=backend)
    kinds.assert_same(list(store), written["nested", other])


@pytest.mark.parametrize("backend", READERS)
@pytest.mark.parametrize("name", ["fixed", "nested"])
def test_an_older_version_by_number_or_tag(site, backend, name):
    url, _, _, written = site
    at = f"{url}/{name}-{backend}"
    old = pytreestore.open(at, backend=backend, version=1)
    assert len(old) == 9
    kinds.assert_same(list(old), written[name, backend][:9])
    tagged = pytreestore.open(at, backend=backend, version="nine-plus")
    assert len(tagged) == 12
    with pytest.raises(VersionNotFoundError, match="has no tag 'nope'"):
        pytreestore.open(at, backend=backend, version="nope")
    with pytest.raises(VersionNotFoundError, match=re.escape("versions 0 to 2")):
        pytreestore.open(at, backend=backend, version=7)


@pytest.mark.parametrize("backend", READERS)
def test_a_missing_store_is_store_not_found(site, backend):
    url = site[0]
    with pytest.raises(StoreNotFoundError, match=re.escape(f"no store at {url}/nothing")):
        pytreestore.open(f"{url}/nothing", backend=backend)


def test_without_backend_a_plain_store_opens_with_tensorstore(site):
    url, _, _, written = site
    store = pytreestore.open(f"{url}/fixed-zarr")
    kinds.assert_same(list(store), written["fixed", "zarr"])


@pytest.mark.parametrize("backend", READERS)
def test_a_chunk_the_server_does_not_have_is_a_corrupt_chunk(site, backend):
    url, _, faults, _ = site
    key = f"fixed-{backend}/x/c/0/0"
    faults.missing.add(key)
    try:
        store = pytreestore.open(f"{url}/fixed-{backend}", backend=backend)
        with pytest.raises(CorruptChunkError, match=re.escape(".x")):
            store.load(slice(None), as_numpy=True)
        assert not store.verify().ok
    finally:
        faults.missing.discard(key)


@pytest.mark.parametrize("backend", READERS)
def test_a_server_that_dies_mid_read_is_a_pytreestore_error(site, backend):
    url, _, faults, _ = site
    key = f"optional-{backend}/x/c/0/0"
    faults.cut.add(key)
    try:
        store = pytreestore.open(f"{url}/optional-{backend}", backend=backend, storage_options=FAST)
        with pytest.raises(PyTreeStoreError) as caught:
            store.load(slice(None), as_numpy=True)
        assert isinstance(caught.value, StorageError | CorruptChunkError), caught.value
    finally:
        faults.cut.discard(key)


def test_an_unreachable_server_is_a_storage_error(tmp_path):
    with serve(tmp_path) as (url, _):
        pass  # the server is gone: nothing listens there
    for backend in READERS:
        with pytest.raises(StorageError):
            pytreestore.open(f"{url}/s", backend=backend, storage_options=FAST)


@pytest.mark.parametrize("backend", READERS)
def test_writes_are_refused_by_name_before_any_request(site, backend, tmp_path):
    url, folder, faults, _ = site
    at = f"{url}/fixed-{backend}"
    sent = len(faults.requests)
    advice = "stores on a web server (http:// and https://) are read-only"
    calls = [
        lambda: pytreestore.open(at, "a", backend=backend),
        lambda: pytreestore.create(at, {"x": np.int8(0)}, backend=backend),
        lambda: pytreestore.create(at, {"x": np.int8(0)}, overwrite=True),
        lambda: pytreestore.evolve(at, drop=[".t"], backend=backend),
        lambda: pytreestore.copy(folder / f"fixed-{backend}", at),
        lambda: pytreestore.write_fragment(at, kinds.records("fixed", 1)),
    ]
    for call in calls:
        with pytest.raises(ReadOnlyError, match=re.escape(advice)):
            call()
    assert len(faults.requests) == sent  # refused before anything was sent
    store = pytreestore.open(at, backend=backend)
    with pytest.raises(ReadOnlyError):
        store.append(kinds.record("fixed", 0))
    with pytest.raises(ReadOnlyError):
        store.vacuum()


@pytest.mark.parametrize("backend", READERS)
def test_the_backend_over_http_lists_nothing_and_writes_nothing(site, backend):
    url = site[0]
    engine = backend_at(backend, Location.parse(f"{url}/fixed-{backend}"))
    assert not capable(engine, KeyListing)
    assert engine.read_bytes("zarr.json") is not None and not engine.is_empty()
    with pytest.raises(ReadOnlyError, match=re.escape("cannot write a at")):
        engine.write_bytes("a", b"1")
    assert backend_at(backend, Location.parse(f"{url}/nothing")).is_empty()


def test_a_store_copied_from_http_to_local_disk(site, tmp_path):
    url, _, _, written = site
    pytreestore.copy(f"{url}/ragged_axis-zarr", tmp_path / "c")
    kinds.assert_same(list(pytreestore.open(tmp_path / "c")), written["ragged_axis", "zarr"])


@pytest.mark.parametrize("backend", READERS)
def test_a_reader_over_http_sees_committed_versions_while_a_writer_appends(backend, tmp_path):
    name = "ragged_list"
    records = kinds.filled(tmp_path / "s", name, backend, n=4)
    with serve(tmp_path) as (url, _):
        reader = pytreestore.open(f"{url}/s", backend=backend)
        writer = pytreestore.open(tmp_path / "s", "a", backend=backend)
        for _ in range(3):
            more = kinds.records(name, 3, start=len(records))
            writer.extend(more)
            writer.flush()
            records += more
            assert len(reader) == 4  # it keeps the commit it opened at, whole
            kinds.assert_same(list(reader.records(as_numpy=True)), records[:4])
            fresh = pytreestore.open(f"{url}/s", backend=backend)
            assert len(fresh) == len(records)
            kinds.assert_same(fresh[len(records) - 1], records[-1])
            kinds.assert_same(list(fresh), records)
        assert reader.refresh() == len(records)  # a refresh sees the latest commit
        kinds.assert_same(list(reader), records)
        writer.close()


@pytest.mark.parametrize("backend", READERS)
def test_a_reader_refreshing_while_a_writer_commits_reads_whole_versions(backend, tmp_path):
    name = "nested"
    want = kinds.records(name, 24)
    # plain chunks: a shard a writer replaces between a reader's index and data requests is
    # torn over HTTP (docs/interop.md, "Byte ranges"); whole files never are
    kinds.create(tmp_path / "s", name, backend, inner_chunk_bytes=None).close()
    seen = []
    with serve(tmp_path) as (url, _):
        reader = pytreestore.open(f"{url}/s", backend=backend)

        def write() -> None:
            with pytreestore.open(tmp_path / "s", "a", backend=backend) as writer:
                for i in range(0, 24, 2):
                    writer.extend(want[i : i + 2])
                    writer.flush()

        thread = threading.Thread(target=write)
        thread.start()
        while thread.is_alive() or len(reader) < 24:
            n = reader.refresh()
            assert n % 2 == 0  # only committed versions: two records at a time
            kinds.assert_same(list(reader.records(as_numpy=True)), want[:n])
            seen.append(n)
        thread.join()
    assert seen[-1] == 24


@pytest.mark.parametrize("backend", READERS)
def test_packed_and_sharded_stores_read_over_http(tmp_path, backend):
    records = kinds.records("ragged_list", 7)
    for name, options in (("packed", {"pack": True}), ("sharded", {"inner_chunk_bytes": 64})):
        with kinds.create(tmp_path / name, "ragged_list", backend, **options) as store:
            store.extend(records)
    with serve(tmp_path) as (url, _):
        for name in ("packed", "sharded"):
            store = pytreestore.open(f"{url}/{name}", backend=backend)
            kinds.assert_same(list(store.records(as_numpy=True)), records)
            kinds.assert_same([store[i] for i in (6, 0, 3)], [records[i] for i in (6, 0, 3)])


def test_a_server_that_ignores_byte_ranges_is_named_for_a_sharded_store(tmp_path):
    records = kinds.records("fixed", 5)
    with kinds.create(tmp_path / "s", "fixed", "tensorstore", inner_chunk_bytes=64) as store:
        store.extend(records)
    with serve(tmp_path) as (url, faults):
        faults.ranges = False
        store = pytreestore.open(f"{url}/s")
        with pytest.raises(StorageError, match="serve them from a server that answers Range"):
            store[0]
        faults.ranges = True
        kinds.assert_same(store[4], records[4])


def test_an_ocdbt_store_reads_over_http(tmp_path):
    """OCDBT reads parts of its files: a server that answers byte ranges serves it."""
    records = kinds.filled(tmp_path / "o", "nested", "ocdbt")
    with pytreestore.open(tmp_path / "o", "a") as store:
        store.extend(kinds.records("nested", 2, start=9))
        store.flush()
        store.tag("eleven")
    with serve(tmp_path) as (url, _):
        for backend in (None, "ocdbt"):
            store = pytreestore.open(f"{url}/o", backend=backend)
            kinds.assert_same(list(store)[:9], records)
            assert [v.records for v in store.versions()] == [0, 9, 11]
            assert store.verify().ok
            kinds.assert_same(list(pytreestore.open(f"{url}/o", version=1)), records)
            assert len(pytreestore.open(f"{url}/o", version="eleven")) == 11
        with pytest.raises(NotAStoreError, match="backend='ocdbt'"):
            pytreestore.open(f"{url}/o", backend="tensorstore")


def test_the_cli_reads_over_http(site):
    url = site[0]
    run = CliRunner()
    info = run.invoke(main, ["info", f"{url}/fixed-zarr"], catch_exceptions=False)
    assert info.exit_code == 0 and "12 records" in info.output
    verify = run.invoke(main, ["verify", f"{url}/nested-tensorstore"], catch_exceptions=False)
    assert verify.exit_code == 0 and "OK (12 records" in verify.output
    versions = run.invoke(main, ["versions", f"{url}/optional-zarr"], catch_exceptions=False)
    assert [line.split()[:2] for line in versions.output.splitlines()] == [
        ["0", "0"],
        ["1", "9"],
        ["2", "12"],
    ]


# ---- file:// -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", READERS)
@pytest.mark.parametrize("name", kinds.KINDS)
def test_a_file_url_is_the_store_at_its_path(tmp_path, backend, name):
    folder = tmp_path / "a b"  # percent-encoded in the URL
    url = "file://" + str(folder).replace(" ", "%20") + "/s"
    records = kinds.records(name, 6)
    with kinds.create(url, name, backend) as store:
        store.extend(records[:4])
    with pytreestore.open(url, "a", backend=backend) as store:
        store.extend(records[4:])
    assert (folder / "s" / "zarr.json").is_file()
    kinds.assert_same(list(pytreestore.open(folder / "s", backend=backend)), records)
    store = pytreestore.open(url.replace("file://", "file://localhost"), backend=backend)
    kinds.assert_same([store[i] for i in range(2, 5)], records[2:5])
    assert store.path == str(folder / "s")
    shutil.rmtree(folder)


@pytest.mark.parametrize("backend", READERS)
def test_a_forked_child_gets_a_clear_error_not_a_hang(site, backend):
    """A child forked after the parent read over HTTP: TensorStore would abort it and obstore
    (the zarr backend) would wait forever; both raise ForkedBackendError, naming 'spawn'."""
    from pytreestore.errors import ForkedBackendError
    from tests.test_misuse import run_in_child

    url, _, _, written = site
    at = f"{url}/fixed-{backend}"
    store = pytreestore.open(at, backend=backend)
    kinds.assert_same(store[3], written["fixed", backend][3])

    def refused(call: Any) -> int:
        try:
            call()
        except ForkedBackendError as err:
            return int("'spawn'" in str(err) and at in str(err))
        return 0

    def child() -> int:
        count = refused(lambda: store.load(slice(0, 12), as_numpy=True))
        return count + refused(lambda: pytreestore.open(at, backend=backend).load(as_numpy=True))

    assert run_in_child(child) == 2
    kinds.assert_same(store[7], written["fixed", backend][7])  # the parent reads on


@pytest.mark.parametrize("backend", READERS)
def test_a_read_past_the_total_timeout_is_a_storage_error(site, backend):
    """Issue 44, item 11: a TensorStore read timed out raised a raw asyncio.CancelledError (a
    BaseException): stopping the cancelled reads waited on them with ``result()``. Every
    backend gives StorageError, and the store reads again once the server answers."""
    url, folder, faults, written = site
    opts = {**FAST, "total_timeout": 1, "request_timeout": 1}
    store = pytreestore.open(f"{url}/fixed-{backend}", backend=backend, storage_options=opts)
    chunks = sorted(p for p in (folder / f"fixed-{backend}" / "t" / "c").rglob("*") if p.is_file())
    stalled = {str(p.relative_to(folder)) for p in chunks}
    faults.stall_seconds = 2.0
    faults.stalled |= stalled
    try:
        with pytest.raises(StorageError, match=r"total_timeout|error sending request"):
            store.load(slice(0, 12), as_numpy=True)
    finally:
        faults.stalled -= stalled
    time.sleep(faults.stall_seconds)  # the stalled answers end (their connections free again)
    kinds.assert_same(list(store.records(as_numpy=True)), written["fixed", backend])
