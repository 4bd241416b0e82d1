"""Keras picks its backend when first imported: torch where it is installed (Python 3.11 in CI), else jax."""

import importlib.util
import os

os.environ.setdefault("KERAS_BACKEND", "torch" if importlib.util.find_spec("torch") is not None else "jax")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
