"""``@casmon.cache`` of an ``async def`` function: the wrapper, with a CachedFunction's helpers as attributes."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

__all__ = ["async_wrapper"]


def async_wrapper(state: Any, cached: Any) -> Callable:
    """``@casmon.cache`` of an ``async def`` function: an ``async def`` function itself, so
    ``inspect.iscoroutinefunction`` (and the frameworks that ask it) see a coroutine function."""

    @functools.wraps(state.fn)
    async def async_cached(*args, **kwargs):
        # Never waits: a wait would block the event loop, and with it the coroutine computing the key.
        ctx, found, value = state.begin(args, kwargs, waits=False)
        if found:
            return value
        t0 = time.perf_counter()
        try:
            result = await state.fn(*args, **kwargs)
        except BaseException:
            state.abort(ctx)
            raise
        state.end(ctx, result, t0, args, kwargs)
        return result

    # The helpers of a CachedFunction, as attributes of the coroutine function (read by duck typing).
    wrapper: Any = async_cached
    wrapper.__casmon_cache__ = state
    wrapper.cache_info = functools.partial(cached.cache_info, wrapper)
    wrapper.cache_clear = functools.partial(cached.cache_clear, wrapper)
    wrapper.is_cached = functools.partial(cached.is_cached, wrapper)
    wrapper.ref = functools.partial(cached.ref, wrapper)
    wrapper.lookup = functools.partial(cached.lookup, wrapper)
    wrapper.explain = functools.partial(cached.explain, wrapper)

    async def refresh(*args, **kwargs):
        t0 = time.perf_counter()
        result = await state.fn(*args, **kwargs)
        ctx = state.key_ctx(args, kwargs)
        if ctx[0] is not None:
            state._replacing.add(bytes(ctx[0]))
        state.end(ctx, result, t0, args, kwargs)
        return result

    wrapper.refresh = refresh
    return wrapper
