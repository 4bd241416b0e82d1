"""A cached function called with arguments its signature refuses: the TypeError names the function, as Python's does."""

import pytest

import casmon


@pytest.mark.parametrize("call, says", [
    (lambda f: f(1), "missing a required argument: 'b'"),
    (lambda f: f(1, 2, 3), "too many positional arguments"),
    (lambda f: f(1, 2, c=3), "got an unexpected keyword argument 'c'"),
])
def test_a_call_its_signature_refuses_is_a_type_error_naming_the_function(tmp_path, call, says):
    @casmon.cache(store=str(tmp_path / "s"))
    def pair(a, b):
        return a, b

    with pytest.raises(TypeError, match=rf"^{__name__}\..*pair: {says}") as e:
        call(pair)
    assert e.value.__cause__ is None and e.value.__suppress_context__

