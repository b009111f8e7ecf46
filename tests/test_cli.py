"""The training command's Hydra help, and where a checkout finds its config and roots. That every
``python -m lra.*`` command answers ``--help`` with usage and an example and refuses an unknown flag in
one line is tests/test_cli_commands.py (in-process, over every command found in the sources)."""

import os
import re
import subprocess
import sys

import pytest

from lra import CONF_DIR, IN_CHECKOUT, REPO_ROOT


def cli(tmp_path, module, *args):
    # data and runs roots in tmp: a command that wrongly starts working cannot touch the checkout's
    env = {
        **os.environ,
        "LRA_DATA": str(tmp_path / "data"),
        "LRA_RUNS": str(tmp_path / "runs"),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
    }
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_train_help_takes_overrides_and_names_the_groups(tmp_path):
    """Hydra's --help composes the config first: overrides before it are fine, and the groups are listed."""
    proc = cli(tmp_path, "lra.train", "task=text", "attn=nystrom", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = dict(re.findall(r"^(attn|task|hardware|preset): (.+)$", proc.stdout, re.M))
    assert {"softmax", "nystrom", "skeinformer"} <= set(groups["attn"].split(", "))
    assert set(groups["task"].split(", ")) == {"listops", "text", "retrieval", "image", "pathfinder"}


def test_checkout_uses_its_own_conf_and_roots():
    assert IN_CHECKOUT
    assert REPO_ROOT == CONF_DIR.parent and (REPO_ROOT / "pyproject.toml").is_file()
    assert (CONF_DIR / "config.yaml").is_file()


@pytest.mark.parametrize(
    "module, args, says",
    [
        ("lra.train", ["task=listops", "experiment=quick"], "experiment= is now preset=: use preset=quick"),
        ("lra.train", ["-m", "semantics=clean"], "semantics= is now quirks=: use quirks=none"),
        (
            "lra.tools.sweep",
            ["grid=skeinformer_table1", "semantics=paper"],
            "semantics= is now quirks=: use quirks=skeinformer",
        ),
    ],
)
def test_old_spellings_are_one_line_before_any_work(tmp_path, module, args, says):
    """experiment= is preset=, semantics= is quirks=: refused with one line naming the new spelling, exit 2."""
    proc = cli(tmp_path, module, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "runs").exists()
