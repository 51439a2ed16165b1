"""Store locations (``pytreestore._location``): local paths, ``memory://``, ``s3://`` and
``gs://`` with their options, the errors for anything else, and when two locations overlap."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore._location import GCSOptions, HTTPOptions, Location, S3Options
from pytreestore.errors import BadLocationError, ReadOnlyError


@pytest.fixture(autouse=True)
def no_aws_environment(monkeypatch):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)


def test_a_local_path_resolves_to_an_absolute_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loc = Location.parse("runs/../runs/a")
    assert (loc.kind, loc.root, str(loc)) == ("file", str(tmp_path / "runs" / "a"), loc.root)
    assert Location.parse(tmp_path / "b").root == str(tmp_path / "b")  # os.PathLike
    assert not loc.is_object_store and loc.bucket == "" and loc.prefix == ""


def test_a_memory_location_is_a_name():
    loc = Location.parse("memory:///runs/a/")
    assert (loc.kind, loc.root, str(loc)) == ("memory", "runs/a", "memory://runs/a")


def test_s3_and_gs_urls():
    s3 = Location.parse("s3://my-bucket/runs/a/", {"endpoint": "http://127.0.0.1:9000"})
    assert (s3.kind, s3.bucket, s3.prefix, str(s3)) == (
        "s3",
        "my-bucket",
        "runs/a",
        "s3://my-bucket/runs/a",
    )
    assert isinstance(s3.options, S3Options) and s3.options.endpoint == "http://127.0.0.1:9000"
    assert s3.is_object_store
    gs = Location.parse("gs://data.example/x", {"user_project": "p"})
    assert (gs.kind, gs.root, str(gs)) == ("gcs", "data.example/x", "gs://data.example/x")
    assert isinstance(gs.options, GCSOptions) and gs.options.user_project == "p"
    assert Location.parse("gcs://bucket-1").prefix == ""


def test_s3_options_come_from_the_environment_where_not_given(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    options = Location.parse("s3://bkt/p").options
    assert isinstance(options, S3Options)
    assert (options.endpoint, options.region) == ("http://127.0.0.1:1", "eu-west-1")
    given = Location.parse("s3://bkt/p", {"region": "us-east-2"}).options
    assert isinstance(given, S3Options) and given.region == "us-east-2"


def test_secrets_are_not_printed():
    options = S3Options(access_key_id="AKIA", secret_access_key="hush", session_token="t0k3n")
    assert "hush" not in repr(options) and "t0k3n" not in repr(options)
    assert "secret_access_key='***'" in repr(options)


@pytest.mark.parametrize(
    ("path", "options", "message"),
    [
        ("", None, "must not be empty"),
        ("a\x00b", None, "must not contain NUL bytes"),
        (3, None, "must be a str or os.PathLike, got int"),
        ("memory://", None, "names no store"),
        ("ftp://host/x", None, "unsupported URL scheme 'ftp'"),
        ("S3://bucket/x", None, "write the URL scheme in lower case"),
        ("s3:///x", None, "names no bucket"),
        ("s3://Bad_Bucket/x", None, "is not a valid bucket name"),
        ("s3://bucket/a/../b", None, "has an empty, '.' or '..' component"),
        ("s3://bucket/x?versionId=1", None, "holds a query, fragment or backslash"),
        (
            "memory://x",
            {"region": "r"},
            "storage_options are for s3://, gs:// and http(s):// stores",
        ),
        ("s3://bucket/x", {"colour": "red"}, "unknown storage option(s) 'colour'"),
        ("s3://bucket/x", {"max_retries": -1}, "must be an int >= 0"),
        ("s3://bucket/x", {"total_timeout": 0}, "a number of seconds > 0"),
        ("s3://bucket/x", {"anonymous": "yes"}, "must be a bool"),
        ("s3://bucket/x", {"endpoint": "localhost:9000"}, "must look like http(s)://HOST[:PORT]"),
        ("s3://bucket/x", {"access_key_id": "a"}, "give access_key_id and secret_access_key"),
        ("s3://bucket/x", {"anonymous": True, "profile": "p"}, "more than one way"),
        ("s3://bucket/x", {"host_header": "h"}, "needs 'endpoint' as well"),
        ("s3://bucket/x", ["endpoint"], "storage_options must be a dict"),
    ],
)
def test_bad_locations_are_refused_with_the_rule(path, options, message):
    with pytest.raises(BadLocationError, match=re.escape(message)):
        Location.parse(path, options)


def test_a_path_inside_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadLocationError, match="is a file, not a directory"):
        Location.parse(str(tmp_path / "f"))
    with pytest.raises(BadLocationError, match="is below"):
        Location.parse(str(tmp_path / "f" / "s"))


def test_a_symlink_loop_is_refused(tmp_path):
    loop = Path(tmp_path / "loop")
    loop.symlink_to(loop)
    with pytest.raises(BadLocationError, match="symlink loop"):
        Location.parse(str(loop / "s"))


def test_overlap_is_the_same_place_or_one_inside_the_other(tmp_path):
    a = Location.parse(str(tmp_path / "a"))
    assert a.overlaps(Location.parse(str(tmp_path / "a" / "b")))
    assert Location.parse(str(tmp_path / "a" / "b")).overlaps(a)
    assert a.overlaps(Location.parse(str(tmp_path / "a")))
    assert not a.overlaps(Location.parse(str(tmp_path / "ab")))
    assert not a.overlaps(Location.parse("memory://" + str(tmp_path / "a")))
    s3 = {"endpoint": "http://127.0.0.1:1"}
    bucket = Location.parse("s3://bkt", s3)
    assert bucket.overlaps(Location.parse("s3://bkt/p", s3))
    other_server = Location.parse("s3://bkt/p", {"endpoint": "http://127.0.0.1:2"})
    assert not bucket.overlaps(other_server)


# ---- file:// and http(s):// --------------------------------------------------------------------


def test_a_file_url_is_its_local_path_percent_decoded(tmp_path):
    folder = tmp_path / "a b%"
    for url in (f"file://{tmp_path}/a%20b%25", f"file://localhost{tmp_path}/a%20b%25"):
        loc = Location.parse(url)
        assert (loc.kind, loc.root, str(loc)) == ("file", str(folder), str(folder))
        assert loc == Location.parse(folder) and not loc.read_only


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file://example.org/x", "names the host 'example.org'"),
        ("file:relative/x", "is a relative file: URL"),
        ("file:./x", "is a relative file: URL"),
        ("file:///x?y=1", "is not a plain file:// URL"),
        ("file:///x#frag", "is not a plain file:// URL"),
    ],
)
def test_file_urls_that_name_no_local_folder_are_refused(url, message):
    with pytest.raises(BadLocationError, match=re.escape(message)):
        Location.parse(url)


def test_a_file_url_takes_no_storage_options(tmp_path):
    with pytest.raises(BadLocationError, match="takes none"):
        Location.parse(f"file://{tmp_path}", {"headers": {"A": "b"}})


def test_http_and_https_urls_are_read_only_locations():
    loc = Location.parse("https://data.example.org:8443/stores//a/")
    assert (loc.kind, loc.root, str(loc)) == (
        "http",
        "https://data.example.org:8443/stores/a",
        "https://data.example.org:8443/stores/a",
    )
    assert loc.read_only and not loc.is_object_store and loc.bucket == "" and loc.prefix == ""
    plain = Location.parse("http://127.0.0.1:8000")
    assert plain.root == "http://127.0.0.1:8000" and isinstance(plain.options, HTTPOptions)
    assert loc.overlaps(Location.parse("https://data.example.org:8443/stores"))


def test_http_options_and_their_checks():
    opts = {"headers": {"Authorization": "Bearer s3cret"}, "max_retries": 2, "total_timeout": 5}
    loc = Location.parse("http://example.org/s", opts)
    assert isinstance(loc.options, HTTPOptions)
    assert (
        loc.options.headers == {"Authorization": "Bearer s3cret"} and loc.options.max_retries == 2
    )
    assert "s3cret" not in repr(loc.options) and "Authorization" in repr(loc.options)
    for bad, message in [
        ({"headers": {"Bad Name": "x"}}, "a dict of header names to str values"),
        ({"headers": {"A": "x\r\nB: y"}}, "a dict of header names to str values"),
        ({"headers": ["A: x"]}, "a dict of header names to str values"),
        ({"region": "eu"}, "unknown storage option(s) 'region'"),
        ({"total_timeout": 0}, "a number of seconds > 0"),
    ]:
        with pytest.raises(BadLocationError, match=re.escape(message)):
            Location.parse("http://example.org/s", bad)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http:///s", "names no host"),
        ("HTTP://example.org/s", "write the URL scheme in lower case"),
        ("https://user:pw@example.org/s", "must not hold credentials"),
        ("http://example.org/s?x=1", "holds a query, fragment or backslash"),
        ("http://example.org/a/../s", "has a '.' or '..' component"),
        ("http://example.org:99999/s", "has a bad port"),
    ],
)
def test_http_urls_that_name_no_store_are_refused(url, message):
    with pytest.raises(BadLocationError, match=re.escape(message)):
        Location.parse(url)


def test_writing_to_a_read_only_location_is_refused_by_name(tmp_path):
    with pytest.raises(ReadOnlyError, match=re.escape("cannot create a store at http://h/s: ")):
        Location.parse("http://h/s").check_writable("create a store")
    Location.parse(tmp_path).check_writable("create a store")  # a local one: no error


@pytest.mark.parametrize("name", ["a" * 300, "/".join(["b" * 200] * 30)])
def test_a_name_the_file_system_refuses_is_a_bad_location(tmp_path, name):
    """A name too long (ENAMETOOLONG) raised a raw OSError from every open and create."""
    path = str(tmp_path / name)
    with pytest.raises(
        BadLocationError, match=r"cannot be a store's directory: File name too long"
    ):
        Location.parse(path)
    with pytest.raises(BadLocationError, match="Choose a shorter path"):
        pytreestore.create(path, {"a": np.int8(1)})
    assert list(tmp_path.iterdir()) == []
