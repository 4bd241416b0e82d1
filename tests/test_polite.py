from tests.conftest import run_python


def test_import_is_silent_and_writes_nothing(tmp_path):
    code = (
        "import logging, os, sys\n"
        "root = logging.getLogger()\n"
        "before = (root.level, list(root.handlers))\n"
        "import casmon\n"
        "assert (root.level, list(root.handlers)) == before, 'logging was configured'\n"
        "assert not logging.getLogger('casmon').handlers\n"
        "import threading\n"
        "assert [t.name for t in threading.enumerate()] == ['MainThread'], threading.enumerate()\n"
        "print(sorted(os.listdir('.')))\n"
    )
    p = run_python(code, cwd=tmp_path)
    assert p.stdout.strip() == "[]"
    assert p.stderr == ""


def test_store_writes_only_inside_its_folder(tmp_path):
    code = (
        "import casmon, numpy as np\n"
        "s = casmon.open('.casmon')\n"
        "s.put(np.arange(10)); s.append('call', {'a': 1}); s.close()\n"
    )
    run_python(code, cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".casmon"]


def test_unflushed_records_are_flushed_at_exit(tmp_path):
    run_python("import casmon\ns = casmon.open('st', autoflush=None)\ns.append('call', {'a': 1})\n", cwd=tmp_path)
    p = run_python("import casmon\nprint([r for _, r in casmon.open('st').records('call')])\n", cwd=tmp_path)
    assert p.stdout.strip() == "[{'a': 1}]"


def test_a_store_opened_before_threading_was_loaded_flushes_and_exits_once_its_flusher_runs(tmp_path):
    """A store opened before anything loaded ``threading`` registers its exit flush with atexit; its background
    flusher (an ordinary thread, that only the exit flush stops) registers it with threading's exit hooks
    too, so the process neither waits out the flush interval at exit nor loses the write."""
    code = ("import sys\nimport casmon\ns = casmon.open('st', autoflush=3600)\n"
            "print('threading' in sys.modules)\n"
            "s.append('call', {'a': 1})\n"
            "print(s._flusher is not None)\n")
    p = run_python(code, cwd=tmp_path)
    assert p.stdout.split() == ["False", "True"], p.stdout
    p = run_python("import casmon\nprint([r for _, r in casmon.open('st').records('call')])\n", cwd=tmp_path)
    assert p.stdout.strip() == "[{'a': 1}]"
