"""A browser that goes away mid-answer leaves ``casmon ui``'s terminal quiet; a real server error is still shown."""

import casmon
from casmon.ui import make_server


def _server(tmp_path):
    return make_server(casmon.open(tmp_path / "s"))


def test_a_client_gone_mid_answer_prints_nothing(tmp_path, capsys):
    srv = _server(tmp_path)
    try:
        for err in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "Connection reset by peer")):
            try:
                raise err
            except ConnectionError:
                srv.handle_error(None, ("127.0.0.1", 1))
    finally:
        srv.close()
    assert capsys.readouterr().err == ""


def test_a_server_error_is_still_reported(tmp_path, capsys):
    srv = _server(tmp_path)
    try:
        try:
            raise ValueError("a bug in a page")
        except ValueError:
            srv.handle_error(None, ("127.0.0.1", 1))
    finally:
        srv.close()
    assert "a bug in a page" in capsys.readouterr().err
