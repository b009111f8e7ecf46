"""The harness's one measuring package: what the benchmark (:mod:`lra.tools.bench`), the doctor
(:mod:`lra.tools.doctor`) and, through the runs' records, ``lra.tools.share_bench`` measure with.

* :mod:`lra.tools.meter.timing`: seconds of one call of a callable, synchronised on the device, and the
  median/min/max columns of a series of calls;
* :mod:`lra.tools.meter.memory`: the peak memory of one call (live tensor storages on a CPU, the CUDA allocator);
* :mod:`lra.tools.meter.step`: one optimizer step of a run at a task's real shape (the model, its loss, AdamW and
  the run's precision) and the inputs it takes, and the peak memory of one such step.

Device helpers (the device's name, synchronising, recognising out-of-memory) are :mod:`lra.devices`, the
bottom layer the run shares. :mod:`lra.tools.meter.step` imports the model; this package's ``__init__`` does not.
"""

from lra.devices import GIB
from lra.tools.meter.memory import LIVE, MIB, LiveTensorBytes, Peak, live_peak, measure_peak, storage_bytes
from lra.tools.meter.timing import timed, timing_columns

__all__ = [
    "GIB",
    "LIVE",
    "MIB",
    "LiveTensorBytes",
    "Peak",
    "live_peak",
    "measure_peak",
    "storage_bytes",
    "timed",
    "timing_columns",
]
