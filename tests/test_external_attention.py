"""Your own attention without forking: a backend in the user's package, selected by import path
(``attn=external attn.target=pkg.mod:Class``) or announced through the ``lra_harness.attention`` entry
point group, gets option checks, the memory fit, the public contract checks and the tables."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import attention
from attention import registry, testing
from tests.helpers import TINY, record, run_env, run_train

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


class WrongShape(TempSoftmax):
    """Drops the last feature of every output row."""

    def forward(self, q, k, v, mask=None):
        return super().forward(q, k, v, mask)[..., :-1]


class NanOut(TempSoftmax):
    """Divides by a zero norm: NaN everywhere."""

    def forward(self, q, k, v, mask=None):
        out = super().forward(q, k, v, mask)
        return out / (out * 0).sum(-1, keepdim=True)


class NaNOut(NanOut):
    """The same, its name spelled with NaN's capitals."""
'''


@pytest.fixture()
def user_package(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "my_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "attn.py").write_text(textwrap.dedent(BACKEND))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return tmp_path / "site"


def test_public_contract_checks_pass_a_good_backend_and_catch_a_bad_one(user_package):
    name = attention.load_external("my_pkg.attn:TempSoftmax")
    assert name == "temp_softmax" and name in attention.available()  # the class's snake_case: one row per class
    testing.check_backend(name)
    blind = attention.load_external("my_pkg.attn:MaskBlind")
    with pytest.raises(AssertionError, match="padded content"):
        testing.check_backend(blind)
    assert attention.describe(name)["option_info"]["temperature"]["doc"] == "divides the scores"


def test_bad_targets_are_one_line(user_package):
    from lra.config import ConfigError, load

    for target, what in [
        ("my_pkg.attn", "expected 'package.module:ClassName'"),
        ("my_pkg.nope:X", "cannot be imported"),
        ("my_pkg.attn:Options", "not a subclass"),
    ]:
        with pytest.raises(ConfigError, match=what):
            load(["preset=quick", "attn=external", f"attn.target={target}"])
    with pytest.raises(ConfigError, match="'temperature'=0"):
        load(["preset=quick", "attn=external", "attn.target=my_pkg.attn:TempSoftmax", "+attn.options.temperature=0"])


@pytest.mark.slow  # 20-30 s: in `make test-slow`, which CI runs, so `make test` stays under 12 min
def test_external_backend_trains_and_appears_in_the_tables(tmp_path, user_package):
    env = run_env(tmp_path, pythonpath=user_package)
    external = ["attn=external", "attn.target=my_pkg.attn:TempSoftmax", "+attn.options.temperature=2.0"]
    run_train(tmp_path, *TINY, "trainer.progress=false", *external, env=env)  # checked: an error shows its output
    rec = record(tmp_path / "runs")
    assert rec["status"] == "completed" and rec["attn"] == rec["attn_backend"] == "temp_softmax"
    assert rec["attn_options"] == {"temperature": 2.0}
    assert rec["peak_mem_estimate_bytes"] > 0  # the memory fit estimated it like any backend
    tables = subprocess.run(
        [
            sys.executable,
            "-m",
            "lra.tools.collect",
            "--runs",
            str(tmp_path / "runs"),
            "--out",
            str(tmp_path / "tables"),
            "--no-plots",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tables.returncode == 0, tables.stderr[-3000:]
    assert any("temp_softmax" in p.read_text() for p in (tmp_path / "tables").rglob("*.md"))


def test_entry_point_gives_a_typed_config_node(tmp_path, user_package):
    dist = user_package / "my_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[lra_harness.attention]\ntemp_softmax = my_pkg.attn:TempSoftmax\n")
    env = run_env(tmp_path, pythonpath=user_package)

    def fit(*args):
        return subprocess.run(
            [sys.executable, "-m", "lra.fit", "preset=quick", "hardware=cpu", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = fit("attn=temp_softmax", "attn.options.temperature=3")  # no '+': its node is typed
    assert ok.returncode == 0 and "'temperature': 3.0" in ok.stdout, ok.stderr[-2000:]
    bad = fit("attn=temp_softmax", "attn.options.temperature=hot")
    assert bad.returncode == 2 and "attn.options.temperature" in bad.stderr


# ------------------------------------------------------------------- issue 19: errors name the backend
def tiny_classifier(name):
    from lra.model import LRAClassifier

    torch.manual_seed(0)
    return LRAClassifier(
        vocab_size=16, seq_len=12, num_classes=2, attn_name=name, dim=16, hidden=16, head_dim=8, head_hidden=8
    )


def tokens_and_mask():
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 7:] = False
    return torch.randint(1, 16, (2, 12), generator=torch.Generator().manual_seed(0)), mask


def fit_estimate(name):
    """The memory fit's training step on fake tensors: the first place a run calls the backend."""
    from lra.config import AttnSpec, ModelSpec
    from lra.fit import train_step_peak

    return train_step_peak(
        ModelSpec(
            vocab_size=16, seq_len=12, num_classes=2, attn=AttnSpec(name), dim=16, hidden=16, head_dim=8, head_hidden=8
        ),
        2,
    )


def test_external_backend_returning_the_wrong_shape_names_the_backend(user_package):
    """Before: a reshape traceback in lra/model.py naming no backend. Now the backend's call fails,
    naming it, its import path and the contract: in the memory fit (fake tensors, before training),
    in the model, and in the public contract checks (as AssertionError)."""
    name = attention.load_external("my_pkg.attn:WrongShape")
    said = (
        r"attention 'wrong_shape' \(my_pkg\.attn:WrongShape\) returned shape \(2, 2, 12, 7\) for q \(2, 2, 12, 8\) "
        r"and v \(2, 2, 12, 8\): the contract is out of shape \(batch, heads, n, head_dim\)"
    )
    with pytest.raises(attention.BackendContractError, match=said):
        fit_estimate(name)
    with pytest.raises(attention.BackendContractError, match=said):
        tiny_classifier(name)(*tokens_and_mask())
    with pytest.raises(AssertionError, match=r"attention 'wrong_shape' \(my_pkg\.attn:WrongShape\) returned shape"):
        testing.check_backend(name)


def test_external_backend_returning_nan_names_the_backend(user_package):
    """Before: the run failed on a non-finite loss, nothing named the backend. Now its first call
    with real tensors says so. Checked once per module (a device sync per step would stall the GPU),
    never on the memory fit's fake tensors, and never on padded rows (the README's backend returns
    NaN for the queries of an all-padding sample, which is no fault)."""
    name = attention.load_external("my_pkg.attn:NanOut")
    assert fit_estimate(name) > 0
    model = tiny_classifier(name)
    with pytest.raises(
        attention.BackendContractError,
        match=r"attention 'nan_out' \(my_pkg\.attn:NanOut\) returned NaN or inf at real \(unmasked\) "
        r"positions for finite q, k, v on its first call",
    ):
        model(*tokens_and_mask())
    assert torch.isnan(model(*tokens_and_mask())).all()  # once: the second call is not checked again

    good = tiny_classifier(attention.load_external("my_pkg.attn:TempSoftmax"))
    tokens, mask = tokens_and_mask()
    mask[0] = False  # a sample without real tokens: its rows are all padding, NaN there is allowed
    assert torch.isfinite(good(tokens, mask)[1]).all()


def test_a_class_spelled_with_nan_is_named_nan_not_na_n(user_package, fresh_registry):
    """Before: the class ``NaNOut`` was registered, named in the contract's messages and given a run folder as
    ``na_n_out`` (every capital a word). Now NaN is one word: ``nan_out``; other names are split as before."""
    from lra.config import load

    names = ["NaNOut", "ToyNaN", "HandleNaNsFast", "BaNaNa", "TempSoftmax", "YOSOConv", "LSHAttention"]
    assert [registry.snake_case(n) for n in names] == [
        "nan_out",
        "toy_nan",
        "handle_nans_fast",
        "ba_na_na",
        "temp_softmax",
        "yoso_conv",
        "lsh_attention",
    ]
    spec = load(["preset=quick", "attn=external", "attn.target=my_pkg.attn:NaNOut"])
    assert (spec.attn.label, spec.attn.name) == ("nan_out", "nan_out")  # the folder and table row, the registry
    with pytest.raises(
        attention.BackendContractError,
        match=r"^attention 'nan_out' \(my_pkg\.attn:NaNOut\) returned NaN or inf at real \(unmasked\) positions",
    ):
        tiny_classifier("nan_out")(*tokens_and_mask())


README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> tuple[str, str, str, str]:
    """The README's external-attention example: (file path, code, load_external target, check_backend name)."""
    text = README.read_text()
    block = re.search(r"```python\n# (\S+\.py)\n(.*?)```", text, re.S)
    target = re.search(r'attention\.load_external\("([^"]+)"\)', text)
    name = re.search(r'attention\.testing\.check_backend\("([^"]+)"\)', text)
    assert block and target and name, "README.md: the external-attention example or its check_backend line moved"
    return block[1], block[2], target[1], name[1]


@pytest.fixture()
def fresh_registry(monkeypatch):
    """The built-in backends only, and no ``my_pkg`` imported yet: the README's steps as a user
    runs them in a fresh process (this file's own my_pkg is put back afterwards)."""
    attention.available()
    monkeypatch.setattr(
        registry,
        "_REGISTRY",
        {k: e for k, e in registry._REGISTRY.items() if e.cls.__module__.startswith("attention.")},
    )
    ours = {m: sys.modules.pop(m) for m in list(sys.modules) if m.partition(".")[0] == "my_pkg"}
    yield
    for m in [m for m in sys.modules if m.partition(".")[0] == "my_pkg"]:
        del sys.modules[m]
    sys.modules.update(ours)


def test_readme_external_attention_example_passes_check_backend(tmp_path, monkeypatch, fresh_registry):
    """Before: the README's example failed check_backend (it wanted a module docstring the README
    never mentions). Now the example, as written, passes the checks the README tells a user to run."""
    path, code, target, name = readme_example()
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(code)
    for pkg in (tmp_path / path).relative_to(tmp_path).parents:
        if pkg != Path("."):
            (tmp_path / pkg / "__init__.py").touch()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert attention.load_external(target) == name
    testing.check_backend(name)


# ------------------------------------------------------------------- issue 27: one class, one row
LABELS = """
import json, sys
from lra.config import load
from lra.record import new_record
out = {}
for route in sys.argv[1:]:
    rec = new_record(load(["preset=quick", *route.split()]))
    out[route] = [rec["attn"], rec["attn_backend"]]
print(json.dumps(out))
"""


def _labels_and_stderr(tmp_path, site, routes, entry_point=None, env_extra=None):
    """The record's (attn, attn_backend) of each route, in a fresh process as a run has it, and what that
    process wrote to stderr."""
    env = run_env(tmp_path, pythonpath=site)
    env.pop("LRA_ATTENTION_MODULES", None)
    for d in site.glob("*.dist-info"):
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    if entry_point:
        dist = site / "my_pkg-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pkg\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(f"[lra_harness.attention]\n{entry_point}\n")
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", LABELS, *routes], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k: tuple(v) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}, proc.stderr


def _labels(tmp_path, site, routes, entry_point=None):
    return _labels_and_stderr(tmp_path, site, routes, entry_point)[0]


def test_the_dropped_modules_variable_is_named_not_silently_ignored(tmp_path, user_package):
    """Two ways in (attn.target, an entry point): a user who still sets LRA_ATTENTION_MODULES is told what
    replaced it, and attn.target still works."""
    got, err = _labels_and_stderr(tmp_path, user_package, [TARGET], env_extra={"LRA_ATTENTION_MODULES": "my_pkg.attn"})
    assert got == {TARGET: ("temp_softmax", "temp_softmax")}
    assert "LRA_ATTENTION_MODULES is no longer read" in err and "entry point" in err


TARGET = "attn=external attn.target=my_pkg.attn:TempSoftmax"


def test_one_external_class_is_one_record_attn_whatever_route_loads_it(tmp_path, user_package):
    """Before: attn.target put the class name in the record (TempSoftmax) and the entry point its own name
    (temp_softmax): one backend, two table rows. Now every route gives the registered name, else the class
    name in snake_case, as both the label (attn) and the backend (attn_backend)."""
    (user_package / "my_pkg" / "reg.py").write_text(
        "import attention\nfrom my_pkg.attn import TempSoftmax\nattention.register('temp_softmax')(TempSoftmax)\n"
    )
    one = ("temp_softmax", "temp_softmax")
    assert _labels(tmp_path, user_package, [TARGET]) == {TARGET: one}
    assert _labels(
        tmp_path, user_package, [TARGET, "attn=temp_softmax"], entry_point="temp_softmax = my_pkg.attn:TempSoftmax"
    ) == {TARGET: one, "attn=temp_softmax": one}
    assert _labels(tmp_path, user_package, [TARGET, "attn=temp_softmax"], entry_point="reg = my_pkg.reg") == {
        TARGET: one,
        "attn=temp_softmax": one,
    }
    # an entry point under another name: attn.target finds that registration, not the snake_case
    tempered = ("tempered", "tempered")
    assert _labels(
        tmp_path, user_package, [TARGET, "attn=tempered"], entry_point="tempered = my_pkg.attn:TempSoftmax"
    ) == {TARGET: tempered, "attn=tempered": tempered}


def test_external_label_rules_and_the_run_folder(user_package):
    """attn.label= given by the user stays the label; a class whose snake_case is a built-in backend's name
    (Linformer -> linformer) keeps its class name instead of failing or taking the built-in's row; the run
    folder is named when the config is composed, before the import: the same snake_case name."""
    from lra.config import compose_checked, load
    from lra.hydra_glue import run_dir_of
    from lra.naming import run_tag

    # a top-level module: my_pkg may be an earlier test's, imported from another folder
    (user_package / "my_clash.py").write_text(
        "from my_pkg.attn import TempSoftmax\n\n\n" "class Linformer(TempSoftmax):\n    pass\n"
    )
    spec = load(["preset=quick", *TARGET.split(), "attn.label=mine"])
    assert (spec.attn.label, spec.attn.name) == ("mine", "temp_softmax")
    spec = load(["preset=quick", "attn=external", "attn.target=my_clash:Linformer"])
    assert (spec.attn.label, spec.attn.name) == ("Linformer", "Linformer")
    assert attention.describe("linformer")["module"] == "attention.linformer"  # the built-in is untouched
    args = ["preset=quick", *TARGET.split()]
    cfg = compose_checked([*args, f"run_tag={run_tag(args)}"], job="train")  # as lra.train names its folder
    assert run_dir_of(cfg).parts[-2:] == ("temp_softmax", "seed0")  # the folder says what the record says


# ------------------------------------------------------------------- issue 32: an import is contained
MISBEHAVING = {
    "exits": "import sys\nsys.exit(0)\n",
    "raises": "x = 1\nraise RuntimeError('no GPU driver here')\n",
    "takes_softmax": (
        "import attention\nfrom my_pkg.attn import TempSoftmax\n\n\n"
        "@attention.register('early')\nclass Early(TempSoftmax):\n    pass\n\n\n"
        "@attention.register('softmax')\nclass Mine(TempSoftmax):\n    pass\n"
    ),
}


def test_a_backend_module_that_exits_raises_or_takes_a_builtin_name_at_import_is_one_line(user_package):
    """Before: sys.exit(0) at import ended lra.train with exit 0, no output, no folder; an exception or a
    built-in name registered again was a traceback that did not say which module. Now each is the one line
    of a config error (lra.train: exit 2, before any folder) naming the module and what it did; nothing it
    registered stays, the built-in keeps its name. A callback's ``_target_`` module is held to the same."""
    from lra.config import ConfigError, load
    from lra.targets import locate

    for name, code in MISBEHAVING.items():  # top-level modules: my_pkg may be an earlier test's, from another folder
        (user_package / f"ext_{name}.py").write_text(code)
    said = {
        "exits": r"importing ext_exits called sys\.exit\(0\)",
        "raises": r"importing ext_raises raised RuntimeError: no GPU driver here \(.*raises\.py, line 2\)",
        "takes_softmax": r"importing ext_takes_softmax registers the backend name 'softmax', which is "
        r"attention\.softmax:\w+'s: register its class under another name",
    }
    for name, what in said.items():
        with pytest.raises(attention.InvalidOption, match=rf"^attn\.target='ext_{name}:Mine': {what}"):
            attention.load_external(f"ext_{name}:Mine")
    with pytest.raises(ConfigError, match=rf"^attn\.target='ext_exits:Mine': {said['exits']}"):  # as lra.train has it
        load(["preset=quick", "attn=external", "attn.target=ext_exits:Mine"])
    assert "early" not in attention.available()  # registered before the module failed: dropped with it
    assert attention.describe("softmax")["module"] == "attention.softmax"
    with pytest.raises(ConfigError, match=r"^callbacks\.x\._target_='ext_exits\.Cb': importing ext_exits"):
        locate("callbacks.x", "ext_exits.Cb", "a Lightning callback")


@pytest.fixture()
def torch_settings():
    """torch's global settings as they were, put back after the test whatever it did."""
    dtype, threads, grad = torch.get_default_dtype(), torch.get_num_threads(), torch.is_grad_enabled()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)
    torch.set_grad_enabled(grad)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def test_torch_settings_a_backend_module_changes_at_import_are_put_back_with_one_warning(
    user_package, torch_settings, caplog
):
    """Before: a module calling torch.set_default_dtype(torch.float64) at import made the run train in float64
    while its record said 32-true (threads, determinism and grad mode the same way). Now what it changed is put
    back after the import, and one warning names the module and each setting."""
    (user_package / "ext_sets_torch.py").write_text(
        "import torch\nfrom my_pkg.attn import TempSoftmax as Mine\n"
        "torch.set_default_dtype(torch.float64)\ntorch.set_num_threads(3)\n"
        "torch.use_deterministic_algorithms(True)\ntorch.set_grad_enabled(False)\n"
    )
    before = (torch.get_default_dtype(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    with caplog.at_level("WARNING", logger="attention"):
        assert attention.load_external("ext_sets_torch:Mine") == "temp_softmax"
    after = (torch.get_default_dtype(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    assert after == before == (torch.float32, 1, False) and torch.is_grad_enabled()
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "attention"]
    assert warning.startswith("importing ext_sets_torch changed torch's global settings; restored: ")
    for change in ("default dtype float64 -> float32", "threads 3 -> 1", "deterministic algorithms on -> off"):
        assert change in warning
    assert "grad enabled False -> True" in warning


def test_a_broken_entry_point_is_named_and_left_out_the_other_backends_still_load(user_package, monkeypatch, caplog):
    """Before: an installed package whose entry-point module raised at import broke every harness command
    with a traceback (every one imports the registry). Now it is one warning naming the entry point, its
    package and what its module did; the other backends load, and asking for its name says why it is missing."""
    (user_package / "ext_raises.py").write_text(MISBEHAVING["raises"])
    dist = user_package / "my_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[lra_harness.attention]\nbroken = ext_raises:Mine\n")
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_BROKEN", {}, raising=False)
    monkeypatch.setattr(registry, "_LOADED", False)
    with caplog.at_level("WARNING", logger="attention"):
        assert "softmax" in attention.available() and "broken" not in attention.available()
    said = (
        r"entry point broken = ext_raises:Mine \(group lra_harness\.attention, package my-pkg\): importing "
        r"ext_raises raised RuntimeError: no GPU driver here"
    )
    assert [re.match(said, r.getMessage()) is not None for r in caplog.records if r.name == "attention"] == [True]
    with pytest.raises(attention.InvalidOption, match=said):
        attention.describe("broken")
