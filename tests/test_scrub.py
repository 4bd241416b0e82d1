"""casmon.scrub on store URLs: a password holding ``/``, ``@`` or ``:`` is never shown, stored or logged.

A store location's user information is removed whole (``scrub_url``), and any text about it
(errors, warnings, reprs) goes through ``scrub`` too, so a client echoing the URL leaks nothing.
"""

import logging
import os
import subprocess
import sys
import warnings

import pytest

import casmon
from casmon import scrub
from tests.conftest import ROOT

SECRET = "pa/ss"


@pytest.mark.parametrize("url, clean", [
    ("s3://user:pa/ss@bucket/x", "s3://bucket/x"),
    ("s3://user:pa@ss@bucket/x", "s3://bucket/x"),
    ("s3://user:p:a/s@s@bucket/x/y", "s3://bucket/x/y"),
    ("https://alice:p@ss:w/rd@host/x", "https://host/x"),
    ("s3://user:pw@bucket/x", "s3://bucket/x"),
    ("s3://user@bucket/x", "s3://bucket/x"),
    ("S3://User:Pa/Ss@bucket", "S3://bucket"),
    # no credentials: unchanged
    ("s3://bucket/x", "s3://bucket/x"),
    ("s3://bucket/run@2/x", "s3://bucket/run@2/x"),  # an '@' in the path, no ':' before its first '/'
    ("memory://name", "memory://name"),
    ("/home/me/.casmon", "/home/me/.casmon"),
    ("store.zip", "store.zip"),
    ("file:///tmp/s", "file:///tmp/s"),
])
def test_scrub_url_removes_user_information_whole(url, clean):
    assert scrub.scrub_url(url) == clean
    assert SECRET not in scrub.scrub_url(url)


@pytest.mark.parametrize("text", [
    "cannot open s3://user:pa/ss@bucket/x: ValueError: invalid port number",
    "cannot open s3://user:pa/ss@bucket/x",
    "s3://user:pa/ss@bucket/x",
    "<casmon.Store 's3://user:pa/ss@bucket/x'>",
    "error at gs://k:pa/ss@b/p (retrying)",
])
def test_scrub_masks_credentials_in_text_about_a_url(text):
    out = scrub.scrub(text)
    assert SECRET not in out and "user" not in out, out
    assert scrub.scrub_output(text).count(SECRET) == 0


def test_scrub_url_result_is_left_alone_by_scrub():
    """The store's own (clean) URL in a message stays as it is: nothing in it looks like a credential."""
    clean = scrub.scrub_url("s3://user:pa/ss@bucket/x")
    assert scrub.scrub(f"cannot open {clean}: the bucket does not exist") == (
        "cannot open s3://bucket/x: the bucket does not exist")


def _no_secret(*texts):
    leaked = [t for t in texts if SECRET in str(t)]
    assert not leaked, leaked


def test_open_s3_url_with_a_slash_in_the_password_leaks_nothing(s3_env, caplog):
    _env, bucket = s3_env
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(casmon.StoreError) as err:
            casmon.open("s3://user:pa/ss@no-such-bucket-here/x")
        s = casmon.open(f"s3://user:pa/ss@{bucket}/x", autoflush=None)
        try:
            d = s.put({"v": 1})
            s.append("call", {"n": 1}, refs=[d])
            s.flush()
            texts = [str(err.value), repr(err.value), s.url, repr(s), repr(s.backend), str(s.stats())]
        finally:
            s.close()
    _no_secret(*texts, *(str(w.message) for w in caught), caplog.text)
    assert "no-such-bucket-here" in str(err.value)
    assert s.url == f"s3://{bucket}/x"
    import boto3

    client = boto3.client("s3", endpoint_url=_env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    for obj in client.list_objects_v2(Bucket=bucket)["Contents"]:
        assert SECRET.encode() not in client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        assert SECRET not in obj["Key"]


def test_open_error_never_shows_the_password_even_when_the_client_rejects_the_url(s3_env):
    """A URL the client cannot parse at all: the error names the location without its credentials."""
    with pytest.raises((casmon.StoreError, ValueError, TypeError)) as err:
        casmon.open("s3://user:pa/ss@[not-a-host/x")
    _no_secret(str(err.value), repr(err.value))


def test_cli_stats_on_an_s3_url_with_credentials_leaks_nothing(s3_env):
    env, _bucket = s3_env
    e = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    p = subprocess.run([sys.executable, "-m", "casmon.cli", "stats", "--store", "s3://user:pa/ss@no-such-bucket-here/x"],
                       capture_output=True, text=True, env=e, timeout=300)
    assert p.returncode != 0
    _no_secret(p.stdout, p.stderr)
    assert "no-such-bucket-here" in p.stderr
