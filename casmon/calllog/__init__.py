"""The call log: ``@casmon.intercept`` records calls; ``casmon.load`` reads them back."""

from casmon.calllog.log import Args, CallLog, CallLogWarning, NotStored, flush, intercept, load

__all__ = ["intercept", "load", "flush", "CallLog", "Args", "NotStored", "CallLogWarning"]
