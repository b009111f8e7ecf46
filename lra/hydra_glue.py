"""Every use of Hydra beyond its compose API, in one place (Hydra's private modules are imported here and
nowhere else): composing a sweep's jobs with Hydra's own config loader, as its launcher will, and running
one composed run in its folder as ``@hydra.main`` would (:func:`run_in_folder`: the folder, ``.hydra/``,
the log file), so that ``lra.train`` composes its configuration once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from hydra import initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import run_job, setup_globals
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, open_dict, read_write

from lra import CONF_DIR


class Composer:
    """Hydra's own config loader, as ``python -m lra.train -m`` would build it (job name ``job_name``)."""

    def __init__(self, job_name: str = "sweep"):
        GlobalHydra.instance().clear()
        self._ctx = initialize_config_dir(config_dir=str(CONF_DIR), job_name=job_name, version_base="1.3")

    def __enter__(self):
        self._ctx.__enter__()
        self.hydra = GlobalHydra.instance().hydra
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)

    def primary(self, overrides: list[str], logging: bool = False) -> DictConfig:
        """The multirun's own config (sweep dir, launcher, sweeper; its hydra overrides reach every job)."""
        return self.hydra.compose_config(
            "config", list(overrides), run_mode=RunMode.MULTIRUN, with_log_configuration=logging
        )

    def job(self, primary: DictConfig, overrides: list[str]) -> tuple[DictConfig, Path]:
        """The job's config and run folder, exactly as the launcher will compose them."""
        cfg = self.hydra.config_loader.load_sweep_config(primary, list(overrides))
        HydraConfig.instance().set_config(cfg)
        return cfg, Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)

    def context(self, cfg: DictConfig) -> HydraContext:
        setup_globals()
        return HydraContext(config_loader=self.hydra.config_loader, callbacks=Callbacks(cfg))


def run_dir_of(cfg: DictConfig) -> Path:
    """The folder ``hydra.run.dir`` of a config composed with its ``hydra`` node names (its interpolations
    read the config, ``run_tag`` included)."""
    HydraConfig.instance().set_config(cfg)
    return Path(str(cfg.hydra.run.dir)).absolute()


def run_in_folder(cfg: DictConfig, task: Callable[[DictConfig], Any], job_name: str) -> Any:
    """Run ``task(cfg without its hydra node)`` in the folder ``hydra.run.dir`` as ``@hydra.main`` does for
    ``python -m lra.<job_name>``: the folder made, ``.hydra/{config,hydra,overrides}.yaml`` written, the job's
    logging (``<folder>/<job_name>.log``) set up, ``HydraConfig`` set. ``cfg`` is used as it is: nothing is
    composed again. An exception of ``task`` is raised again here."""
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.RUN  # as @hydra.main says of a single run (the compose API leaves it unset)
    with Composer(job_name) as composer:
        ret = run_job(
            task_function=task,
            config=cfg,
            job_dir_key="hydra.run.dir",
            job_subdir_key=None,
            hydra_context=composer.context(cfg),
        )
    return ret.return_value  # raises what the task raised
