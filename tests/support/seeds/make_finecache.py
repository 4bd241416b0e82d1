"""Makes a FineCache 0.1.4 base folder with FineCache itself (tests/compat/test_import.py runs it; also made the fixture).

Run from the ``tests/`` folder of a git repository: ``python make_finecache.py``. Writes ``.cache/``:
two cache files and two run folders.
"""

from FineCache import FineCache, IncrementDir

fc = FineCache(".cache")


@fc.cache()
def func(a1, a2, k1="v1", k2="v2"):
    return a1 + 1, a2 + 2, k1[::-1], k2[::-1]


if __name__ == "__main__":
    func(3, a2=4, k2="v3")
    func(5, a2=6)
    inc = IncrementDir(".cache", "test")
    with open("temp.yml", "w") as f:
        f.write("lr: 0.1\n")
    with fc.record_context(inc, comment="first", tracking_files=[r".*\.yml"]) as info:
        print("epoch 1")
        info["accuracy"] = 0.5
    with fc.record_context(inc, tracking_files=[r".*\.yml"]) as info:
        print("epoch 2")
        info["accuracy"] = 0.75
