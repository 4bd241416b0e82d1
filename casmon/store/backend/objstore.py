"""S3, GCS and Azure through obstore, without zarr: conditional writes, so create-if-absent is race-free.

The keys are the ones zarr's ``ObjectStore`` reads and writes on the same
bucket (:attr:`ObstoreBackend.zstore` is that store, made on demand), but
casmon sends obstore's requests itself: importing zarr costs a fresh process
a fifth of a second, and a cluster's workers open a store each. The requests
are those zarr's adapter sends (``get``, ranged ``get``, ``head``, ``put``,
``put`` with ``mode="create"``, ``delete``, ``list``, ``list_with_delimiter``),
run and retried by :class:`~.remote.RemoteBackend`.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from casmon.errors import StoreError
from casmon.scrub import scrub_url
from casmon.store.backend import retry as retries
from casmon.store.backend.remote import OPEN_SECONDS, RemoteBackend, client_error
from casmon.store.backend.retry import Retrier

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

    from casmon.store.backend.base import BytesLike, Data

__all__ = ["ObstoreBackend", "open_object_store"]

#: storage_options names as s3fs spells them -> obstore's
_ALIASES = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
            "endpoint_url": "endpoint", "region_name": "region", "aws_access_key_id": "access_key_id",
            "aws_secret_access_key": "secret_access_key"}
#: The process whose requests started obstore's runtime (0: none yet); see ObstoreBackend._fresh.
_runtime_pid = 0
#: What a read of a key that is not there raises (as zarr's adapter reads them: no such key).
_ABSENT = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


class ObstoreBackend(RemoteBackend):
    """One obstore store (a bucket and prefix), whose client ``make`` makes. A process forked from one that sent
    obstore requests cannot send any (see :meth:`_fresh`)."""

    def __init__(self, make: Callable[[], ObjectStore], url: str, read_only: bool, concurrency: int = 16) -> None:
        super().__init__(url, Retrier(), concurrency)
        self._client = make()
        self._read_only = read_only
        self._zarr: Any = None

    @property
    def zstore(self) -> Any:
        """zarr's ``ObjectStore`` on the same client, for code that wants a zarr store (zarr is imported now)."""
        if self._zarr is None:
            from zarr.storage import ObjectStore as ZarrObjectStore

            self._zarr = ZarrObjectStore(self._client, read_only=self._read_only)
        return self._zarr

    def _fresh(self) -> None:
        # obstore's runtime is one per process, and its threads stay in the process that started them: in a forked
        # child every client, the parent's or one made anew, would wait forever. Each request says so at once
        # instead (a cached call then computes, with that warning).
        global _runtime_pid
        pid = os.getpid()
        if _runtime_pid != pid:
            if _runtime_pid:
                raise StoreError(f"{self.url}: this process was forked from one that had used S3 (or GCS, Azure) "
                                 "through obstore, whose client does not survive a fork; start worker processes "
                                 "with 'spawn' or 'forkserver' (multiprocessing.get_context('forkserver'), or "
                                 "ProcessPoolExecutor(mp_context=...))")
            _runtime_pid = pid
        super()._fresh()

    def _obstore_client(self) -> Any:
        return self._client

    @property
    def read_only(self) -> bool:
        return self._read_only

    def _writable(self) -> None:
        if self._read_only:
            raise ValueError("store was opened in read-only mode")

    # -- one request each ------------------------------------------------------------
    async def _aget(self, key: str) -> Data | None:
        import obstore

        try:
            got = await obstore.get_async(self._client, key)
            return memoryview(await got.bytes_async())
        except _ABSENT:
            return None

    async def _aget_range(self, key: str, start: int, end: int) -> Data | None:
        import obstore

        try:
            return memoryview(await obstore.get_range_async(self._client, key, start=start, end=end))
        except _ABSENT:
            return None
        except Exception as e:
            if _past_end(e):
                return memoryview(b"")  # a start past the end reads nothing, as a local file does
            raise

    async def _aexists(self, key: str) -> bool:
        import obstore

        try:
            await obstore.head_async(self._client, key)
        except FileNotFoundError:
            return False
        return True

    async def _agetsize(self, key: str) -> int:
        import obstore

        return int((await obstore.head_async(self._client, key))["size"])

    async def _aset(self, key: str, data: BytesLike) -> None:
        import obstore

        self._writable()
        await obstore.put_async(self._client, key, data)

    async def _acreate(self, key: str, data: BytesLike) -> None:
        import obstore

        self._writable()
        try:
            await obstore.put_async(self._client, key, data, mode="create")
        except obstore.exceptions.AlreadyExistsError:
            pass

    async def _adelete(self, key: str) -> None:
        import obstore

        self._writable()
        try:
            await obstore.delete_async(self._client, key)
        except FileNotFoundError:  # some media say so, S3 does not: the same to casmon
            pass

    async def _alist(self, prefix: str) -> list[str]:
        import obstore

        out: list[str] = []
        async for batch in obstore.list(self._client, prefix=prefix):
            out.extend(str(m["path"]) for m in batch)
        return out

    async def _alist_dir(self, prefix: str) -> list[str]:
        import obstore

        got = await obstore.list_with_delimiter_async(self._client, prefix=prefix)
        base = prefix.rstrip("/")
        cut = len(base) + 1 if base else 0
        return [str(p)[cut:] for p in got["common_prefixes"]] + [str(m["path"])[cut:] for m in got["objects"]]


def _past_end(e: BaseException) -> bool:
    """True for S3's answer to a range that starts past the object's end (416, ``InvalidRange``)."""
    text = str(e)
    return "InvalidRange" in text or "416" in text and "Range Not Satisfiable" in text


def open_object_store(url: str, read_only: bool, storage_options: dict[str, Any], probe: str | None = None) -> ObstoreBackend:
    """The store at ``url`` (``s3://``, ``gs://``, ``az://``, ...): reached now, so a wrong endpoint, bucket or
    credential is said at open (``probe``: a key the caller reads next, read to reach it; see
    :meth:`Backend.reach`).

    Credentials and endpoint come from the environment (``AWS_ACCESS_KEY_ID``,
    ``AWS_ENDPOINT_URL``, ...) or ``storage_options``; they are never written to the store.
    """
    from obstore.store import from_url

    opts = {_ALIASES.get(k, k): v for k, v in storage_options.items()}
    client_options = dict(opts.pop("client_options", {}) or {})
    # obstore's own retries are for a blip (a few, quick); casmon's (retry.py) are sized for throttling and outages.
    retry_config = opts.pop("retry_config", None) or {
        "max_retries": 2, "retry_timeout": _dt.timedelta(seconds=5),
        "backoff": {"init_backoff": _dt.timedelta(milliseconds=50), "max_backoff": _dt.timedelta(seconds=1), "base": 2},
    }
    endpoint = opts.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    if endpoint and str(endpoint).startswith("http://"):
        client_options.setdefault("allow_http", True)
    if endpoint and url.startswith(("s3://", "s3a://")):
        opts.setdefault("virtual_hosted_style_request", False)
    clean = scrub_url(url)

    # storage_options are the user's, checked by obstore itself: its TypedDicts describe them.
    client = cast("ClientConfig | None", client_options or None)
    retry = cast("RetryConfig", retry_config)

    def make() -> ObjectStore:
        return from_url(clean, client_options=client, retry_config=retry, **opts)

    try:
        b = ObstoreBackend(make, clean, read_only)
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"cannot open {clean}: {client_error(e)}") from None
    assert b.retrier is not None
    b.retrier.seconds = min(retries.RETRY_SECONDS, OPEN_SECONDS)  # a wrong endpoint is said at once, not in half a minute
    t0 = time.monotonic()
    try:
        if probe is None:  # reach the store now: a clear error at open, before anything is written
            b.list_dir("")
        else:
            b.reach(probe)
    except Exception as e:  # noqa: BLE001
        cause = e.__cause__ or e
        waited = time.monotonic() - t0
        tried = f" (casmon tried for {waited:.0f} s: an endpoint that is away for a moment is waited for)" if waited >= 1 else ""
        raise StoreError(f"cannot open {clean}: {client_error(cause)}{tried}") from None
    finally:
        b.retrier.seconds = None
        b.retrier.down_since = None
    return b
