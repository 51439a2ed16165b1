"""Store locations (``pytreestore._location``): local paths, ``memory://``, ``s3://`` and
``gs://`` with their options, the errors for anything else, and when two locations overlap."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytreestore._location import GCSOptions, Location, S3Options
from pytreestore.errors import BadLocationError


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
        ("memory://x", {"region": "r"}, "storage_options are for s3:// and gs:// stores"),
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
