"""A custom callmonitor Handler and two user classes, for the import tests."""

import os
import threading

from callmonitor import Handler


class Fancy:
    def __init__(self, text):
        self.text = text
        self.lock = threading.Lock()  # pickle will not cut it


class FancyHandler(Handler):
    def load(self, path):
        with open(os.path.join(path, f"arg_{self.target}.txt")) as f:
            self.data = Fancy(f.read())

    def save(self, path):
        with open(os.path.join(path, f"arg_{self.target}.txt"), "w") as f:
            f.write(self.data.text)
        self._data = None

    @classmethod
    def accumulator_done(cls):
        pass


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)
