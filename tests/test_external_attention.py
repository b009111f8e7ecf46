"""Your own attention without forking: a backend in the user's package, selected by import path
(``attn=external attn.target=pkg.mod:Class``) or announced through the ``lra_harness.attention`` entry
point group, gets option checks, the memory fit, the public contract checks and the tables."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import attention
from attention import testing
from tests.test_train import TINY

BACKEND = '''
"""Softmax attention with a temperature: the README's ten-line example of a backend in your package."""
from dataclasses import dataclass

import torch
from attention import AttentionBackend, Capabilities, check_range


@dataclass(frozen=True)
class Options:
    temperature: float = 1.0  # divides the scores

    def __post_init__(self):
        check_range("temperature", self.temperature, 0.0, None, lo_open=True)


class TempSoftmax(AttentionBackend):
    """Softmax attention with scores q.k / (sqrt(d) * temperature)."""

    Options = Options
    capabilities = Capabilities(exact=True, complexity="O(n^2)")

    def forward(self, q, k, v, mask=None):
        scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5 * self.options.temperature)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        return scores.softmax(-1) @ v


class MaskBlind(TempSoftmax):
    """Ignores the mask: the contract checks must catch it."""

    def forward(self, q, k, v, mask=None):
        return super().forward(q, k, v, None)
'''


@pytest.fixture()
def user_package(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "my_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "attn.py").write_text(textwrap.dedent(BACKEND))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return tmp_path / "site"


def _env(tmp_path, site):
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "LRA_DATA": str(tmp_path / "data"), "LRA_RUNS": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1",
            "WANDB_MODE": "disabled"}


def test_public_contract_checks_pass_a_good_backend_and_catch_a_bad_one(user_package):
    name = attention.load_external("my_pkg.attn:TempSoftmax")
    assert name == "TempSoftmax" and name in attention.available()
    testing.check_backend(name)
    blind = attention.load_external("my_pkg.attn:MaskBlind")
    with pytest.raises(AssertionError, match="padded content"):
        testing.check_backend(blind)
    assert attention.describe(name)["option_info"]["temperature"]["doc"] == "divides the scores"


def test_bad_targets_are_one_line(user_package):
    from lra.config import ConfigError, load

    for target, what in [("my_pkg.attn", "expected 'package.module:ClassName'"),
                         ("my_pkg.nope:X", "cannot be imported"), ("my_pkg.attn:Options", "not a subclass")]:
        with pytest.raises(ConfigError, match=what):
            load(["experiment=quick", "attn=external", f"attn.target={target}"])
    with pytest.raises(ConfigError, match="'temperature'=0"):
        load(["experiment=quick", "attn=external", "attn.target=my_pkg.attn:TempSoftmax", "+attn.options.temperature=0"])


def test_external_backend_trains_and_appears_in_the_tables(tmp_path, user_package):
    env = _env(tmp_path, user_package)
    run = subprocess.run([sys.executable, "-m", "lra.train", *TINY, "trainer.progress=false", "attn=external",
                          "attn.target=my_pkg.attn:TempSoftmax", "+attn.options.temperature=2.0"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rec = json.loads(next((tmp_path / "runs").rglob("result.json")).read_text())
    assert rec["status"] == "completed" and rec["attn"] == "TempSoftmax" and rec["attn_options"] == {"temperature": 2.0}
    assert rec["peak_mem_estimate_bytes"] > 0  # the memory fit estimated it like any backend
    tables = subprocess.run([sys.executable, "-m", "lra.collect", "--runs", str(tmp_path / "runs"), "--out",
                             str(tmp_path / "tables"), "--no-plots"], env=env, capture_output=True, text=True,
                            timeout=300)
    assert tables.returncode == 0, tables.stderr[-3000:]
    assert any("TempSoftmax" in p.read_text() for p in (tmp_path / "tables").rglob("*.md"))


def test_entry_point_gives_a_typed_config_node(tmp_path, user_package):
    dist = user_package / "my_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[lra_harness.attention]\ntemp_softmax = my_pkg.attn:TempSoftmax\n")
    env = _env(tmp_path, user_package)

    def fit(*args):
        return subprocess.run([sys.executable, "-m", "lra.fit", "experiment=quick", "hardware=cpu", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    ok = fit("attn=temp_softmax", "attn.options.temperature=3")  # no '+': its node is typed
    assert ok.returncode == 0 and "'temperature': 3.0" in ok.stdout, ok.stderr[-2000:]
    bad = fit("attn=temp_softmax", "attn.options.temperature=hot")
    assert bad.returncode == 2 and "attn.options.temperature" in bad.stderr
