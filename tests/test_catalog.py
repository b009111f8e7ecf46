"""Issue 31: discovery (``python -m lra.tools.catalog``, ``attention.list_backends``), ``--help`` and the README
saying the same things, and ``attention.testing.check_backend`` reporting what it checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attention
from attention import registry, testing
from lra import REPO_ROOT
from lra.tasks import TASK_NAMES
from lra.tools import catalog

torch.set_num_threads(1)

README = REPO_ROOT / "README.md"
VARIANTS = sorted(p.stem for p in (REPO_ROOT / "conf" / "attn").glob("*.yaml"))


def listed(capsys, *argv) -> tuple[int, str]:
    code = catalog.main(list(argv))
    return code, capsys.readouterr().out


def names_under(out: str, header: str) -> list[str]:
    """The names of the rows under the section whose header starts with ``header``."""
    block = re.search(rf"^{header}[^\n]*\n((?:  [^\n]*\n?)*)", out, re.M)
    assert block, out[:2000]
    return re.findall(r"^  (\w+)", block[1], re.M)


def built_in_backends() -> list[str]:
    attention.available()
    return sorted(n for n, e in registry._REGISTRY.items() if e.cls.__module__.partition(".")[0] == "attention")


# ---------------------------------------------------------------- the listing
def test_listing_names_every_backend_variant_task_and_preset_and_nothing_else(capsys):
    code, out = listed(capsys)
    assert code == 0
    assert sorted(names_under(out, "attention backends")) == sorted(attention.available() + VARIANTS)
    assert names_under(out, "tasks") == list(TASK_NAMES)
    assert names_under(out, "presets") == sorted(p.stem for p in (REPO_ROOT / "conf" / "preset").glob("*.yaml"))
    doc = attention.describe("skeinformer")["doc"]
    assert re.search(rf"^  skeinformer +{re.escape(doc)}$", out, re.M)  # the docstring's first line
    assert re.search(r"^  listops +seq_len +2048 +10 classes +ListOps", out, re.M)
    assert re.search(r"^  softmax_nodrop +variant of softmax: sets attn\.options\.dropout=0\.0", out, re.M)


def test_a_pattern_filters_every_section(capsys):
    code, out = listed(capsys, "*former*")
    assert code == 0
    assert names_under(out, "attention backends") == attention.list_backends("*former*")
    assert {"skeinformer", "longformer", "linformer", "skyformer"} <= set(attention.list_backends("*former*"))
    assert names_under(out, "presets") == ["nystromformer_paper", "skeinformer_paper", "skyformer_paper"]
    assert not re.search(r"^tasks", out, re.M)  # no task matches
    code, out = listed(capsys, "*paper", "--presets")
    assert names_under(out, "presets") == ["nystromformer_paper", "skeinformer_paper", "skyformer_paper"]
    assert "attention backends" not in out
    assert attention.list_backends() == attention.available() and attention.list_backends("zzz*") == []


def test_no_match_is_one_line_naming_what_exists_and_exit_1(capsys):
    code, out = listed(capsys, "no_such_*")
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 1
    assert "'no_such_*'" in lines[0] and all(n in lines[0] for n in ["softmax", "softmax_nodrop", "listops", "quick"])


def test_options_show_each_option_as_set_on_the_command_line_with_its_default(capsys):
    code, out = listed(capsys, "linformer", "--options")
    assert code == 0
    assert re.search(r"^      attn\.options\.k +int = 256 +integer \[1, inf\) +projected length", out, re.M), out
    assert "attn_options" not in out


# ---------------------------------------------------------------- --help and README agree
def readme_backends() -> list[str]:
    text = README.read_text()
    para = re.search(r"\*\*Attention backends\*\*(.*?)Options per backend", text, re.S)
    assert para, "README.md: the backend list moved"
    return re.findall(r"`([a-z][a-z0-9_]*)`", para[1])


def test_readme_backend_list_is_the_registry():
    """Before: the README's list omitted ``polynomial``. Every built-in backend and conf/attn/ variant is named."""
    named = readme_backends()
    assert len(named) == len(set(named)), "a backend is named twice"
    want = set(built_in_backends()) | set(VARIANTS)
    assert not want - set(named), f"README.md's backend list misses {sorted(want - set(named))}"
    assert not set(named) - want, f"README.md names backends that do not exist: {sorted(set(named) - want)}"


def test_train_help_spells_backend_options_as_the_readme_does(tmp_path):
    """Before: ``--help`` showed ``attn_options.linformer.k`` (a preset table's key) where the README says
    ``attn.options.k``. Now the help uses the README's spelling and names the listing command."""
    env = {**os.environ, "LRA_DATA": str(tmp_path / "data"), "LRA_RUNS": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "lra.train", "--help"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "attn.options.k=128" in proc.stdout and "attn.options.<option>" in proc.stdout
    assert "attn_options." not in proc.stdout
    assert "lra.tools.catalog" in proc.stdout
    groups = dict(re.findall(r"^(attn): (.+)$", proc.stdout, re.M))
    assert set(groups["attn"].split(", ")) - {"external"} <= set(readme_backends())


# ---------------------------------------------------------------- check_backend's report
def test_check_backend_reports_what_it_checked(capsys):
    report = testing.check_backend("vmean")
    assert capsys.readouterr().out == ""  # silent; the caller prints the report
    assert report.backend == "vmean" and report.passed == list(testing.CHECKS)
    n = len(testing.CHECKS)
    assert str(report).startswith(f"{n} of {n} contract checks passed for vmean: unknown_option_rejected, ")


@pytest.fixture()
def own_registry(monkeypatch):
    """A copy of the registry: a toy registered by a test leaves no trace for the tests after it."""
    attention.available()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_a_broken_backend_raises_one_assertion_naming_each_failing_check(own_registry):
    @attention.register("toy_mask_blind", capabilities=attention.Capabilities(uses_qk=False))
    class ToyMaskBlind(attention.AttentionBackend):
        """Mean of every value row, padded ones included (the bug the checks must catch)."""

        def forward(self, q, k, v, mask=None):
            return v.mean(-2, keepdim=True).expand_as(v)

    with pytest.raises(AssertionError) as e:
        testing.check_backend("toy_mask_blind")
    said = str(e.value)
    assert said.startswith(f"2 of {len(testing.CHECKS)} contract checks failed for toy_mask_blind: padding_at_end: ")
    assert "padding_in_middle: " in said and "padded content" in said


def test_contract_cases_give_one_case_per_backend_and_check():
    cases = testing.contract_cases(["none", "vmean"])
    assert len(cases) == 2 * len(testing.CHECKS)
    assert [c.id for c in cases[: len(testing.CHECKS)]] == [f"none-{c}" for c in testing.CHECKS]
    assert [c.values for c in cases[-len(testing.CHECKS) :]] == [("vmean", f) for f in testing.CHECKS.values()]


@pytest.mark.parametrize("name, check", testing.contract_cases(["none"]))
def test_contract_cases_run_as_the_docstring_says(name, check):
    check(name)


def test_python_m_attention_testing_prints_the_report_line(capsys):
    assert testing.main(["none"]) == 0
    n = len(testing.CHECKS)
    assert capsys.readouterr().out.startswith(f"{n} of {n} contract checks passed for none: ")
    assert testing.main(["no_such_backend"]) == 1
    assert "unknown attention backend 'no_such_backend'" in capsys.readouterr().out


def test_catalog_check_runs_the_contract_on_the_listed_backends(capsys):
    code, out = listed(capsys, "vmea*", "--backends", "--check")
    assert code == 0 and re.search(r"^\d+ of \d+ contract checks passed for vmean: ", out, re.M)


def test_tools_docstring_names_the_command():
    assert "lra.tools.catalog" in Path(catalog.__file__).with_name("__init__.py").read_text()


def test_checks_failing_alike_are_said_once(own_registry):
    @attention.register("toy_nan")
    class ToyNaN(attention.AttentionBackend):
        """NaN everywhere: several checks fail with one message."""

        def forward(self, q, k, v, mask=None):
            return torch.full_like(v, float("nan"))

    with pytest.raises(AssertionError) as e:
        testing.check_backend("toy_nan")
    said = str(e.value)
    messages = [part.split(": ", 1)[1] for part in said.split(": ", 1)[1].split("; ")]
    assert len(messages) == len(set(messages)) and len(said) < 1000, said  # each message once
    n = int(said.split(" of ")[0])
    assert n >= 2 and sum(len(part.split(": ", 1)[0].split(", ")) for part in said.split(": ", 1)[1].split("; ")) == n
