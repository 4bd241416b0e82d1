"""Any zarr v3 ``Store`` (memory, zip, obstore's S3/GCS/Azure, fsspec) behind the :class:`Backend` interface.

zarr's stores are asynchronous: each operation runs on casmon's event-loop
thread (:mod:`.loop`) and the caller waits for it; a batch runs up to
``concurrency`` requests at once. This is the only module of casmon that imports
zarr, and only when such a store is opened: a local folder never needs it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar, cast

from casmon.errors import CasmonError, StoreError
from casmon.scrub import scrub, scrub_url
from casmon.store.backend import loop
from casmon.store.backend.base import Backend
from casmon.store.backend.local import LocalBackend
from casmon.store.backend import retry as retries
from casmon.store.backend.retry import Retrier
from casmon.view import text as view_text

if TYPE_CHECKING:
    from pathlib import Path

    from obstore.store import ClientConfig, RetryConfig
    from zarr.abc.store import Store as ZarrStore
    from zarr.core.buffer import Buffer as ZarrBuffer

    from casmon.store.backend.base import BytesLike, Data

__all__ = ["ZarrBackend", "from_store_object", "open_fsspec", "open_memory", "open_object_store", "open_zip", "client_error"]

T = TypeVar("T")

#: How long opening a remote store retries reaching it (seconds): through a 10 s outage, not half a minute for a typo.
OPEN_SECONDS = 12.0

#: storage_options names as s3fs spells them -> obstore's
_ALIASES = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
            "endpoint_url": "endpoint", "region_name": "region", "aws_access_key_id": "access_key_id",
            "aws_secret_access_key": "secret_access_key"}


def client_error(e: BaseException) -> str:
    """A client's error in one line, saying what to check where the cause is a common one; credentials scrubbed."""
    text = view_text.short_error(e, first_line=True) or type(e).__name__
    low = str(e)
    if "NoSuchBucket" in low:
        return "the bucket does not exist"
    if "InvalidAccessKeyId" in low or "SignatureDoesNotMatch" in low or "403" in low and "Forbidden" in low:
        return "access denied: check the credentials (environment or storage_options)"
    if "error sending request" in low or "Connection refused" in low or "dns error" in low:
        return scrub("cannot reach the endpoint (" + text[:200] + ")")
    return scrub(f"{type(e).__name__}: {text[:300]}")


def _np(buf: ZarrBuffer | None) -> Data | None:
    return None if buf is None else buf.as_numpy_array()


class ZarrBackend(Backend):
    """One zarr store, driven from casmon's event loop.

    ``reopen`` makes the store again in a forked child, whose clients cannot use
    the parent's loop.
    """

    def __init__(self, zstore: ZarrStore, url: str, reopen: Callable[[], ZarrStore] | None = None,
                 concurrency: int = 16) -> None:
        from zarr.abc.store import RangeByteRequest
        from zarr.buffer import default_buffer_prototype
        from zarr.buffer.cpu import Buffer
        from zarr.storage import ZipStore

        super().__init__(url, concurrency)
        self._zstore = zstore
        self._reopen = reopen
        self._pid = os.getpid()
        self._proto = default_buffer_prototype()
        self._range = RangeByteRequest
        self._buffer = Buffer
        self._zip = isinstance(zstore, ZipStore)
        #: Retries of this medium's requests (none for memory and zip stores, which do not fail that way).
        self.retrier: Retrier | None = None if isinstance(zstore, ZipStore) or type(zstore).__name__ == "MemoryStore" \
            else Retrier()

    @property
    def zstore(self) -> ZarrStore:
        return self._zstore

    def _z(self) -> ZarrStore:
        if self._pid != os.getpid():
            # Forked: clients bound to the parent's loop cannot be used here.
            if self._reopen is not None:
                self._zstore = self._reopen()
            self._pid = os.getpid()
        return self._zstore

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one operation; errors that are not about a file become a :class:`StoreError`."""
        try:
            return loop.run(coro)
        except (OSError, CasmonError, ValueError, TypeError, KeyError):
            raise
        except Exception as e:  # noqa: BLE001 - e.g. obstore's errors: name the store, keep the cause
            raise StoreError(f"{self.url}: {client_error(e)}") from e

    def _call_write(self, coro: Coroutine[Any, Any, T]) -> T:
        """:meth:`_call` for a write: while it is in flight, :attr:`while_waiting` runs every ``wait_tick``."""
        hook = self.while_waiting
        if hook is None:
            return self._call(coro)
        import concurrent.futures

        fut = loop.submit(coro)
        try:
            while True:
                try:
                    return fut.result(timeout=self.wait_tick)
                except concurrent.futures.TimeoutError:
                    try:
                        hook()
                    except Exception:  # noqa: BLE001 - looking after held values is best effort
                        pass
        except (OSError, CasmonError, ValueError, TypeError, KeyError):
            raise
        except Exception as e:  # noqa: BLE001 - as _call
            raise StoreError(f"{self.url}: {client_error(e)}") from e

    def _retried(self, make: Callable[[], Awaitable[T]]) -> Coroutine[Any, Any, T]:
        """``make()`` awaited with this medium's retries (:mod:`.retry`): each request is retried on its own."""
        r = self.retrier
        if r is None:
            async def once() -> T:
                return await make()
            return once()
        return r.run(make)

    def _bytes(self, data: BytesLike) -> ZarrBuffer:
        return self._buffer.from_bytes(data)

    @property
    def read_only(self) -> bool:
        return bool(self._zstore.read_only)

    @property
    def supports_deletes(self) -> bool:
        return bool(self._zstore.supports_deletes) and not self._zip

    @property
    def needs_close(self) -> bool:
        """A zip file must be closed for its entries to be readable by others."""
        return self._zip and not self.read_only

    def _close(self) -> None:
        self._zstore.close()

    # -- reads -------------------------------------------------------------------
    def _get(self, key: str) -> Data | None:
        z = self._z()
        return _np(self._call(self._retried(lambda: z.get(key, self._proto))))

    def _get_range(self, key: str, start: int, end: int) -> Data | None:
        z = self._z()
        return _np(self._call(self._retried(lambda: z.get(key, self._proto, byte_range=self._range(start, end)))))

    def _get_many(self, keys: list[str]) -> list[Data | None]:
        z = self._z()
        got = self._call(loop.gather_limited(
            (self._retried(functools.partial(z.get, k, self._proto)) for k in keys), self.concurrency))
        return [_np(b) for b in got]

    def _get_ranges(self, requests: list[tuple[str, int, int]]) -> list[Data | None]:
        z = self._z()
        got = self._call(loop.gather_limited(
            (self._retried(functools.partial(z.get, k, self._proto, byte_range=self._range(s, e)))
             for k, s, e in requests), self.concurrency))
        return [_np(b) for b in got]

    def _exists_many(self, keys: list[str]) -> list[bool]:
        z = self._z()
        if len(keys) == 1:
            return [self._call(self._retried(lambda: z.exists(keys[0])))]
        return self._call(loop.gather_limited((self._retried(functools.partial(z.exists, k)) for k in keys),
                                              self.concurrency))

    def _getsize(self, key: str) -> int:
        z = self._z()
        return self._call(self._retried(lambda: z.getsize(key)))

    def _getsize_many(self, keys: list[str]) -> list[int]:
        z = self._z()

        async def one(k: str) -> int:
            try:
                return await self._retried(lambda: z.getsize(k))
            except FileNotFoundError:
                return 0

        return self._call(loop.gather_limited((one(k) for k in keys), self.concurrency))

    def _list(self, prefix: str) -> list[str]:
        z = self._z()

        async def go() -> list[str]:
            return [k async for k in z.list_prefix(prefix)]

        return self._call(self._retried(go))

    def _list_dir(self, prefix: str) -> list[str]:
        z = self._z()

        async def go() -> list[str]:
            return [k async for k in z.list_dir(prefix)]

        return self._call(self._retried(go))

    def _obstore(self) -> Any:
        """The obstore store behind zarr's ``ObjectStore`` (which knows when each key was written), else None."""
        z = self._z()
        return getattr(z, "store", None) if type(z).__name__ == "ObjectStore" else None

    def _landed(self, keys: list[str]) -> list[float | None] | None:
        ob = self._obstore()
        if ob is None:
            return None
        import obstore

        async def one(k: str) -> float | None:
            try:
                meta = await self._retried(lambda: obstore.head_async(ob, k))
            except FileNotFoundError:
                return None
            return float(meta["last_modified"].timestamp())

        return self._call(loop.gather_limited((one(k) for k in keys), self.concurrency))

    def _list_landed(self, prefix: str) -> dict[str, float] | None:
        ob = self._obstore()
        if ob is None:
            return None
        import obstore

        base = prefix if prefix.endswith("/") or not prefix else prefix + "/"

        async def go() -> dict[str, float]:
            out: dict[str, float] = {}
            for batch in await obstore.list(ob, prefix=base).collect_async():
                for meta in batch if isinstance(batch, list) else [batch]:
                    path = str(meta["path"])
                    if "/" not in path[len(base):]:
                        out[path] = float(meta["last_modified"].timestamp())
            return out

        return self._call(self._retried(go))

    # -- writes ------------------------------------------------------------------
    def _write(self, key: str, parts: Sequence[BytesLike], exclusive: bool) -> None:
        data = self._bytes(parts[0] if len(parts) == 1 else b"".join(parts))
        z = self._z()
        self._call_write(self._retried(lambda: z.set_if_not_exists(key, data) if exclusive else z.set(key, data)))

    def _write_many(self, items: Sequence[tuple[str, BytesLike]]) -> None:
        z = self._z()
        self._call_write(loop.gather_limited(
            (self._retried(functools.partial(z.set_if_not_exists, k, self._bytes(d))) for k, d in items), self.concurrency))

    def _create_async(self, key: str, data: BytesLike) -> Future[None]:
        z = self._z()
        self.requests += 1
        buf = self._bytes(data)
        return loop.submit(self._retried(lambda: z.set_if_not_exists(key, buf)))

    def _delete_many(self, keys: list[str]) -> None:
        z = self._z()
        if len(keys) == 1:
            self._call(self._retried(lambda: z.delete(keys[0])))
            return
        self._call(loop.gather_limited((self._retried(functools.partial(z.delete, k)) for k in keys), self.concurrency))


# -- opening: every zarr store casmon makes is made here ------------------------------
def open_memory(d: dict[str, Any], url: str, read_only: bool) -> ZarrBackend:
    """A ``MemoryStore`` over ``d`` (the same dict is the same store)."""
    from zarr.storage import MemoryStore

    return ZarrBackend(MemoryStore(d, read_only=read_only), url)


def open_zip(path: Path, read_only: bool) -> ZarrBackend:
    """A ``ZipStore`` on ``path`` (checked by the caller to be a zip archive, an empty file, or absent)."""
    from zarr.storage import ZipStore

    try:
        z = loop.run(ZipStore.open(path, mode="r" if read_only else "a"))
    except Exception as e:  # noqa: BLE001 - zipfile raises many kinds
        raise StoreError(f"cannot open zip store at {path}: {e}") from None
    return ZarrBackend(z, str(path))


def from_store_object(location: object) -> Backend:
    """A zarr ``Store`` instance, used as it is (zarr imported only now: a local folder is served without it)."""
    from zarr.abc.store import Store as ZarrStore
    from zarr.storage import LocalStore, MemoryStore, ZipStore


    if not isinstance(location, ZarrStore):
        raise TypeError(f"store location must be a path, a URL or a zarr Store, got {type(location).__name__}")
    if isinstance(location, LocalStore):  # served with plain system calls, as a LocalFolder is
        return LocalBackend(location, scrub(str(location)))
    if not isinstance(location, (MemoryStore, ZipStore)):
        loop.note_remote_client()  # someone else's client: its threads are not ours to outlive
    return ZarrBackend(location, scrub(str(location)))


def open_object_store(url: str, read_only: bool, storage_options: dict[str, Any], probe: str | None = None) -> ZarrBackend:
    """S3, GCS or Azure through obstore: conditional writes, so create-if-absent is race-free.

    Credentials and endpoint come from the environment (``AWS_ACCESS_KEY_ID``,
    ``AWS_ENDPOINT_URL``, ...) or ``storage_options``; they are never written to the store.
    """
    import datetime as _dt

    from obstore.store import from_url
    from zarr.storage import ObjectStore


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

    def make() -> ZarrStore:
        return ObjectStore(from_url(clean, client_options=client, retry_config=retry, **opts), read_only=read_only)

    try:
        z = make()
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"cannot open {clean}: {client_error(e)}") from None
    b = ZarrBackend(z, clean, reopen=make)
    assert b.retrier is not None
    b.retrier.seconds = min(retries.RETRY_SECONDS, OPEN_SECONDS)  # a wrong endpoint is said at once, not in half a minute
    try:
        if probe is None:  # reach the store now: a clear error at open, before anything is written
            b.list_dir("")
        else:
            b.reach(probe)
    except Exception as e:  # noqa: BLE001
        cause = e.__cause__ or e
        raise StoreError(f"cannot open {clean}: {client_error(cause)}") from None
    finally:
        b.retrier.seconds = None
        b.retrier.down_since = None
    return b


def open_fsspec(url: str, read_only: bool, storage_options: dict[str, Any]) -> ZarrBackend:
    """Any other URL through fsspec, which may take credentials from the URL itself: it gets the URL
    whole, and only the scrubbed URL is shown or kept."""
    from zarr.storage import FsspecStore

    opts = dict(storage_options)
    if url.startswith("s3://"):
        opts.setdefault("skip_instance_cache", True)
        opts.setdefault("asynchronous", True)

    def make() -> ZarrStore:
        async def go() -> ZarrStore:
            return FsspecStore.from_url(url, storage_options=opts, read_only=read_only)

        return loop.run(go())

    clean = scrub_url(url)
    try:
        z = make()
    except ImportError as e:
        raise StoreError(f"cannot open {clean}: {scrub(str(e))} (install obstore, or the fsspec driver for this scheme)") from None
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"cannot open {clean}: {client_error(e)}") from None
    return ZarrBackend(z, clean, reopen=make)
