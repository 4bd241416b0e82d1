"""The fault-injecting S3 proxy (tests/support/s3proxy.py) itself, through obstore, boto3 and raw HTTP.

Every test reads moto directly (not through the proxy) for the ground truth of what landed.
"""

import gc
import hashlib
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from datetime import timedelta

import pytest

from tests.support.s3proxy import FaultProxy, Rule

obstore = pytest.importorskip("obstore")
boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402 - after the skip
from botocore.exceptions import ClientError  # noqa: E402
from obstore.exceptions import BaseError  # noqa: E402
from obstore.store import S3Store  # noqa: E402

KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def store(proxy, bucket, *, retries=0, key_id="testing", secret="testing", **client_options):
    """An obstore S3 store through the proxy: no retries unless asked, ``client_options`` added."""
    return S3Store(bucket, endpoint=proxy.url, access_key_id=key_id, secret_access_key=secret,
                   region="us-east-1", virtual_hosted_style_request=False,
                   client_options={"allow_http": True, **client_options},
                   retry_config={"max_retries": retries, "retry_timeout": timedelta(seconds=10),
                                 "backoff": {"init_backoff": timedelta(milliseconds=10),
                                             "max_backoff": timedelta(milliseconds=50)}})


def boto(url, retries=0, **keys):
    return boto3.client("s3", endpoint_url=url, config=Config(retries={"total_max_attempts": retries + 1}),
                        **{**KEYS, **keys})


@pytest.fixture
def moto(moto_server):
    """boto3 straight to moto: the ground truth."""
    return boto(moto_server)


def on_moto(moto, bucket, key):
    """The object's bytes as moto has them, or None when it is absent."""
    try:
        return moto.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as e:
        if e.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise


def raw(proxy):
    """A plain HTTP/1.1 connection to the proxy (moto accepts unsigned requests)."""
    return http.client.HTTPConnection("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]), timeout=10)


def request(conn, method, path, body=None, **kwargs):
    conn.request(method, path, body=body, **kwargs)
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_requests_and_replies_pass_through_unchanged(s3_proxy, moto):
    proxy, bucket = s3_proxy
    s = store(proxy, bucket)
    obstore.put(s, "a/one", b"hello")
    assert bytes(obstore.get(s, "a/one").bytes()) == b"hello"
    assert [m["path"] for m in obstore.list(s, prefix="a").collect()] == ["a/one"]
    assert bytes(obstore.get(s, "a/one", options={"range": (1, 3)}).bytes()) == b"el"
    assert obstore.head(s, "a/one")["size"] == 5
    obstore.delete(s, "a/one")  # obstore deletes with a bulk delete: POST ?delete
    assert on_moto(moto, bucket, "a/one") is None
    via = boto(proxy.url)  # boto3 sends Expect: 100-continue
    via.put_object(Bucket=bucket, Key="b", Body=b"boto")
    assert on_moto(moto, bucket, "b") == b"boto"
    assert via.get_object(Bucket=bucket, Key="b")["Body"].read() == b"boto"
    log = proxy.log
    assert [(e.method, e.action) for e in log] == [
        ("PUT", None), ("GET", None), ("GET", None), ("GET", None), ("HEAD", None), ("POST", None),
        ("PUT", None), ("GET", None)]
    assert all(e.status == e.upstream_status and e.status in (200, 206) for e in log), log
    assert log[2].query == "list-type=2&prefix=a%2F" and log[0].path == f"/{bucket}/a/one"
    assert log[5].query == "delete"
    assert proxy.counts() == 8 and proxy.counts(action="forward", method="put") == 2


def test_large_bodies_arrive_byte_for_byte(s3_proxy, moto):
    proxy, bucket = s3_proxy
    s = store(proxy, bucket)
    data = random.Random(1).randbytes(12 << 20)  # a multipart upload of three parts
    obstore.put(s, "big", data)
    assert hashlib.md5(on_moto(moto, bucket, "big")).digest() == hashlib.md5(data).digest()
    assert bytes(obstore.get(s, "big").bytes()) == data
    assert proxy.counts(method="PUT", path=re.compile(r"/big$")) == 3


def test_signatures_still_verify_through_the_proxy(tmp_path):
    """A moto server of its own with signature checks on: requests signed for the proxy's Host pass."""
    pytest.importorskip("moto")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")  # the three IAM calls below, then auth
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1)
                break
            except Exception:  # noqa: BLE001 - not up yet
                assert time.time() < deadline and proc.poll() is None, "moto server did not start"
                time.sleep(0.2)
        iam = boto3.client("iam", endpoint_url=url, **KEYS)
        iam.create_user(UserName="u")
        key = iam.create_access_key(UserName="u")["AccessKey"]
        iam.put_user_policy(UserName="u", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        keys = {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
        boto(url, **keys).create_bucket(Bucket="signed")
        with FaultProxy(url) as proxy:
            s = store(proxy, "signed", key_id=key["AccessKeyId"], secret=key["SecretAccessKey"])
            obstore.put(s, "k", b"signed")
            assert bytes(obstore.get(s, "k").bytes()) == b"signed"
            boto(proxy.url, **keys).put_object(Bucket="signed", Key="b", Body=b"boto")
            # the control: moto does check signatures here
            with pytest.raises(BaseError):
                obstore.put(store(proxy, "signed", key_id=key["AccessKeyId"], secret="wrong"), "x", b"no")
            assert [e.upstream_status for e in proxy.log] == [200, 200, 200, 403]
        assert boto(url, **keys).get_object(Bucket="signed", Key="b")["Body"].read() == b"boto"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_drop_before_closes_without_forwarding(s3_proxy, moto):
    proxy, bucket = s3_proxy
    proxy.add(Rule("drop_before", method="PUT", times=1))
    s = store(proxy, bucket)
    with pytest.raises(BaseError):
        obstore.put(s, "k", b"v")
    assert on_moto(moto, bucket, "k") is None
    (e,) = proxy.log
    assert (e.action, e.status, e.upstream_status) == ("drop_before", None, None)
    obstore.put(s, "k", b"v")  # the rule is spent
    assert on_moto(moto, bucket, "k") == b"v"


def test_drop_after_loses_the_reply_of_a_write_that_landed(s3_proxy, moto):
    proxy, bucket = s3_proxy
    proxy.add(Rule("drop_after", method="PUT"))
    with pytest.raises(BaseError):
        obstore.put(store(proxy, bucket), "k", b"landed")
    assert on_moto(moto, bucket, "k") == b"landed"
    (e,) = proxy.log
    assert (e.action, e.status, e.upstream_status) == ("drop_after", None, 200)


def test_reset_aborts_with_a_tcp_rst_without_forwarding(s3_proxy, moto):
    proxy, bucket = s3_proxy
    proxy.add(Rule("reset", path="/k"))
    with pytest.raises(BaseError):
        obstore.put(store(proxy, bucket), "k", b"v")
    assert on_moto(moto, bucket, "k") is None
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET /{bucket}/k HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
    assert [(e.action, e.status, e.upstream_status) for e in proxy.log] == [("reset", None, None)] * 2


def test_status_answers_slowdown_without_forwarding_and_keeps_the_connection(s3_proxy, moto):
    proxy, bucket = s3_proxy
    proxy.add(Rule("status", method="PUT", path="/slow", status=503))
    proxy.add(Rule("status", method="PUT", path="/broken", status=500))
    with pytest.raises(ClientError) as err:
        boto(proxy.url).put_object(Bucket=bucket, Key="slow", Body=b"v")
    assert err.value.response["Error"]["Code"] == "SlowDown"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    with pytest.raises(ClientError) as err:
        boto(proxy.url).put_object(Bucket=bucket, Key="broken", Body=b"v")
    assert err.value.response["Error"]["Code"] == "InternalError"
    assert on_moto(moto, bucket, "slow") is None and on_moto(moto, bucket, "broken") is None
    conn = raw(proxy)
    status, body = request(conn, "PUT", f"/{bucket}/slow", b"v")
    assert status == 503 and b"<Code>SlowDown</Code><Message>Please reduce your request rate.</Message>" in body
    assert request(conn, "PUT", f"/{bucket}/fine", b"v")[0] == 200  # the same connection, kept alive
    conn.close()
    *_, slow, fine = proxy.log
    assert (slow.status, slow.upstream_status, fine.status) == (503, None, 200)
    assert slow.connection == fine.connection
    assert proxy.counts(action="status") == 3


def test_obstore_retries_a_slowdown_as_often_as_it_is_told(s3_proxy):
    proxy, bucket = s3_proxy
    proxy.add(Rule("status", method="PUT"))
    with pytest.raises(BaseError):
        obstore.put(store(proxy, bucket, retries=2), "k", b"v")
    assert proxy.counts(action="status", method="PUT") == 3


def test_delay_before_lands_late_without_blocking_other_connections(s3_proxy, moto):
    proxy, bucket = s3_proxy
    rule = proxy.add(Rule("delay_before", path="/slow", delay=60.0))  # until released
    slow_done = []

    def slow_put():
        obstore.put(store(proxy, bucket), "slow", b"late")
        slow_done.append(time.monotonic())

    thread = threading.Thread(target=slow_put)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while rule.applied == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rule.applied == 1, "the slow PUT reached the proxy"
        fast = store(proxy, bucket)
        for i in range(5):
            obstore.put(fast, f"fast{i}", b"v")  # all through while the slow one waits
        assert not slow_done and on_moto(moto, bucket, "slow") is None
    finally:
        rule.release()
    thread.join(60)
    assert slow_done and on_moto(moto, bucket, "slow") == b"late"


def test_delay_before_abandons_a_request_whose_client_left(s3_proxy, moto):
    proxy, bucket = s3_proxy
    proxy.add(Rule("delay_before", method="PUT", delay=1.0))
    with pytest.raises(BaseError):
        obstore.put(store(proxy, bucket, timeout=timedelta(seconds=0.3)), "k", b"v")
    assert proxy.wait_idle(5)
    assert on_moto(moto, bucket, "k") is None
    (e,) = proxy.log
    assert (e.action, e.status, e.upstream_status) == ("delay_before", None, None)


def test_hold_lands_a_write_after_its_client_gave_up(s3_proxy, moto):
    proxy, bucket = s3_proxy
    rule = proxy.add(Rule("hold", method="PUT", delay=60.0))  # held until released: the client gives up first
    with pytest.raises(BaseError, match="(?i)timed? ?out"):
        obstore.put(store(proxy, bucket, timeout="500ms"), "late", b"late write")
    assert on_moto(moto, bucket, "late") is None
    assert proxy.in_flight == 1
    rule.release()
    assert proxy.wait_idle(30)
    assert on_moto(moto, bucket, "late") == b"late write"
    (e,) = proxy.log
    assert (e.action, e.status, e.upstream_status) == ("hold", None, 200)


def test_delay_after_replies_late_to_a_write_that_landed_early(s3_proxy, moto):
    proxy, bucket = s3_proxy
    proxy.add(Rule("delay_after", method="PUT", delay=1.0, times=1))
    proxy.add(Rule("delay_after", method="GET", delay=0.3, times=1))
    with pytest.raises(BaseError):
        obstore.put(store(proxy, bucket, timeout="300ms"), "k", b"early")
    assert on_moto(moto, bucket, "k") == b"early"
    t0 = time.monotonic()
    assert bytes(obstore.get(store(proxy, bucket), "k").bytes()) == b"early"
    assert time.monotonic() - t0 >= 0.3
    assert proxy.wait_idle(5)
    # the log is in the order handling ended: the PUT's reply was due after the GET's
    assert [(e.method, e.action, e.status) for e in proxy.log] == [("GET", "delay_after", 200),
                                                                  ("PUT", "delay_after", None)]


def test_truncate_cuts_the_reply_in_half(s3_proxy, moto):
    proxy, bucket = s3_proxy
    moto.put_object(Bucket=bucket, Key="k", Body=b"x" * 10_000, ACL="public-read")  # readable unsigned
    proxy.add(Rule("truncate", method="GET"))
    proxy.add(Rule("truncate", method="PUT"))
    with pytest.raises(BaseError):
        obstore.get(store(proxy, bucket), "k").bytes()
    conn = raw(proxy)
    conn.request("GET", f"/{bucket}/k")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Connection") == "close"
    with pytest.raises(http.client.IncompleteRead) as cut:
        resp.read()
    assert len(cut.value.partial) == 5_000
    conn.close()
    with pytest.raises(BaseError):  # an empty reply loses half its head instead
        obstore.put(store(proxy, bucket), "put", b"v")
    assert on_moto(moto, bucket, "put") == b"v"
    assert [e.action for e in proxy.log] == ["truncate"] * 3


def test_chunked_request_bodies_are_parsed_and_forwarded(s3_proxy, moto):
    """obstore and boto3 never send chunked bodies (always Content-Length), so raw HTTP does."""
    proxy, bucket = s3_proxy
    conn = raw(proxy)
    assert request(conn, "PUT", f"/{bucket}/c1", iter([b"abc", b"", b"def" * 1000]), encode_chunked=True,
                   headers={"Transfer-Encoding": "chunked"})[0] == 200
    assert request(conn, "PUT", f"/{bucket}/c2", iter([b"second"]), encode_chunked=True,
                   headers={"Transfer-Encoding": "chunked"})[0] == 200
    conn.close()
    assert on_moto(moto, bucket, "c1") == b"abc" + b"def" * 1000
    assert on_moto(moto, bucket, "c2") == b"second"
    log = proxy.log
    assert [e.chunked for e in log] == [True, True] and log[0].connection == log[1].connection


class RecordingUpstream:
    """An upstream that expects exactly ``requests`` (raw bytes), one per connection, and answers ``replies``."""

    def __init__(self, requests, replies):
        self.expected, self.replies, self.got = requests, replies, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        with self.sock:
            for want, reply in zip(self.expected, self.replies):
                conn, _ = self.sock.accept()
                with conn:
                    conn.settimeout(5)
                    got = b""
                    while len(got) < len(want) and (chunk := conn.recv(65536)):
                        got += chunk
                    self.got.append(got)
                    conn.sendall(reply)


def test_requests_go_upstream_byte_for_byte_and_replies_of_every_framing_come_back():
    """Chunk extensions and trailers (which moto's server refuses), pipelining, chunked and unframed replies."""
    first = (b"PUT /b/c3 HTTP/1.1\r\nHost: 127.0.0.1:1\r\nX-Amz-Date: 20260101T000000Z\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n")
    second = b"PUT /b/c4 HTTP/1.1\r\nHost: 127.0.0.1:1\r\nContent-Length: 4\r\n\r\nfour"
    upstream = RecordingUpstream(
        [first, second],
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
         b"HTTP/1.1 201 Created\r\nX-Up: 1\r\n\r\nuntil close"])
    with FaultProxy(upstream.url) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(first + second)  # pipelined
            replies = b""
            while chunk := sock.recv(65536):
                replies += chunk
        upstream.thread.join(5)
        log = proxy.log
    assert upstream.got == [first, second]
    assert replies == (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
                       b"5\r\nhello\r\n0\r\n\r\n"
                       b"HTTP/1.1 201 Created\r\nX-Up: 1\r\nConnection: close\r\n\r\nuntil close")
    assert [(e.path, e.chunked, e.status) for e in log] == [("/b/c3", True, 200), ("/b/c4", False, 201)]
    assert log[0].connection == log[1].connection


def test_one_client_keeps_one_connection_alive_for_many_requests(s3_proxy, moto):
    proxy, bucket = s3_proxy
    s = store(proxy, bucket)
    for i in range(50):
        obstore.put(s, f"k{i}", str(i).encode())
    log = proxy.log
    assert len(log) == 50 and all(e.status == 200 for e in log)
    assert len({e.connection for e in log}) <= 2  # moto closes every connection; the proxy keeps the client's
    assert on_moto(moto, bucket, "k49") == b"49"


@pytest.mark.parametrize("mode", ["503", "reset", "drop"])
def test_an_outage_fails_every_request_for_its_duration(s3_proxy, moto, mode):
    proxy, bucket = s3_proxy
    s = store(proxy, bucket)
    proxy.add(Rule("status", path="/never-matches-before-the-outage", status=500))
    t0 = time.monotonic()
    proxy.outage(1.0, mode)
    failures, recovered = 0, None
    while recovered is None and time.monotonic() - t0 < 60:  # a loaded machine only makes each try slower
        try:
            obstore.put(s, "k", b"v")
            recovered = time.monotonic() - t0
        except BaseError:
            failures += 1
            time.sleep(0.05)
    assert recovered is not None and 1.0 <= recovered, "nothing passes while it lasts, and it ends"
    assert failures >= 2, "every request within it fails, not just the first"
    assert on_moto(moto, bucket, "k") == b"v"
    expected = {"503": "status", "reset": "reset", "drop": "drop_before"}[mode]
    assert proxy.counts(action=expected) == failures


def test_a_seeded_random_makes_probabilistic_faults_reproducible(s3_proxy):
    proxy, _bucket = s3_proxy

    def pattern():
        proxy.clear()
        proxy.random = random.Random(42)
        proxy.add(Rule("status", probability=0.3))
        conn = raw(proxy)
        got = [request(conn, "GET", "/")[0] == 503 for _ in range(40)]
        conn.close()
        return got

    first = pattern()
    draws = random.Random(42)
    assert first == pattern() == [draws.random() < 0.3 for _ in range(40)]
    assert 0 < sum(first) < 40


def test_rules_filter_count_and_expire(s3_proxy):
    proxy, bucket = s3_proxy
    first = proxy.add(Rule("status", method="GET", path=re.compile(r"/a\d$"), after=1, times=2, status=500))
    proxy.add(Rule("status", method="GET", status=503))  # the first matching rule wins
    timed = proxy.add(Rule("status", method="PUT", status=500, duration=0.3))
    conn = raw(proxy)
    assert [request(conn, "GET", f"/{bucket}/a{i}")[0] for i in range(5)] == [503, 500, 500, 503, 503]
    assert request(conn, "GET", f"/{bucket}/b")[0] == 503
    assert request(conn, "PUT", f"/{bucket}/a", b"v")[0] == 500
    time.sleep(0.35)
    assert request(conn, "PUT", f"/{bucket}/a", b"v")[0] == 200
    conn.close()
    assert (first.matched, first.applied, first.spent) == (3, 2, True)
    assert not timed.live(time.monotonic()) and len(proxy.rules) == 3
    proxy.clear()
    assert proxy.rules == []
    assert proxy.counts(action="status", path="/a") == 6 and proxy.counts(action="forward") == 1
    with pytest.raises(ValueError):
        Rule("explode")
    with pytest.raises(ValueError):
        proxy.outage(1.0, "flood")


def test_stop_closes_every_connection_and_its_thread(moto_server, s3_env):
    _env, bucket = s3_env
    before = set(threading.enumerate())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proxy = FaultProxy(moto_server).start()
        (thread,) = set(threading.enumerate()) - before
        assert thread.daemon
        idle = socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])), timeout=5)
        proxy.add(Rule("hold", delay=120.0))  # stop() must not wait it out
        held = threading.Thread(target=lambda: pytest.raises(BaseError, obstore.put,
                                                             store(proxy, bucket), "held", b"v"))
        held.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        proxy.stop()
        assert time.monotonic() - t0 < 60, "stop waited for the held request"
        held.join(60)
        assert idle.recv(10) == b""  # closed by the proxy
        idle.close()
        proxy.stop()  # idempotent
        assert not thread.is_alive() and set(threading.enumerate()) <= before | {held}
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]
    assert on_moto(boto(moto_server), bucket, "held") is None  # a hold cut short by stop() never lands


def test_the_fixture_points_aws_endpoint_url_at_the_proxy(s3_proxy, moto):
    proxy, bucket = s3_proxy
    assert os.environ["AWS_ENDPOINT_URL"] == proxy.url
    obstore.put(S3Store(bucket, client_options={"allow_http": True}), "env", b"from env")
    assert on_moto(moto, bucket, "env") == b"from env"
    assert proxy.counts(method="PUT", path="/env") == 1
