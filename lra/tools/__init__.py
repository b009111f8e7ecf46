"""The tools built on the run library (``lra``): each reads or starts runs; none is needed to train one.

  lra.tools.sweep        grids and searches over runs [lra-sweep]
  lra.tools.carry        a GPU window's unfinished runs to the next machine; finished runs to results/ [lra-carry]
  lra.tools.catalog      what there is to run: backends (and options), variants, tasks, presets [lra-catalog]
  lra.tools.collect      run records -> the papers' tables, figures and the results page [lra-tables]
  lra.tools.bench        training-step and attention benchmarks [lra-bench]
  lra.tools.doctor       does the harness work on this machine, how fast, at what cost [lra-doctor]
  lra.tools.share_bench  throughput of k runs sharing one GPU [lra-share-bench]
  lra.tools.fidelity     the paper presets against the public code's numbers [lra-fidelity]
  lra.tools.approx       the approximation-error study [lra-approx]
  lra.tools.meter        what bench and the doctor measure with: timed calls, peak memory, a training step
  lra.tools.scripts      console scripts whose entry point has no plain ``main``

The library never imports this package (tests/test_layering.py).
"""
