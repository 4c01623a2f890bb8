"""Fixtures for the Python module's tests: a generated model and a registry
serving it under two names with a fallback. $SB_BIN is the switchboard CLI
(CTest sets it; else build/switchboard of this checkout); the module finds
the library through $SWITCHBOARD_LIB or next to the build."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    path = d / "demo.gguf"
    cli = os.environ.get("SB_BIN", os.path.join(ROOT, "build", "switchboard"))
    subprocess.run([cli, "gen-model", "--out", str(path), "--type", "q8_0", "--dim", "64", "--hidden", "128",
                    "--layers", "2", "--heads", "4", "--vocab", "512", "--ctx", "256", "--seed", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    return path


@pytest.fixture(scope="session")
def registry(model):
    path = model.parent / "models.json"
    path.write_text(json.dumps({
        "fallback": "demo",
        "models": [{"name": "demo", "path": model.name, "device": "cpu"},
                   {"name": "other", "path": model.name, "aliases": ["alt"]}],
    }))
    return path
