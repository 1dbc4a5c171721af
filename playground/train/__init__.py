"""The training entrypoint (``python -m playground.train``), run locally or in a TrainJob pod.

Modules: ``recipe`` (the loop), ``settings`` (torch-free: the run's settings), ``data`` (its rows: ``sample``),
``tokenizer``, ``model``, ``evaluate``, ``checkpoint``, ``save``, ``reporting``, ``standins``, ``cpu_share`` (OpenMP
waits, threads). Only trainer processes import this package's heavy parts.
"""

from playground.train import cpu_share

# Must run before torch loads libgomp: sleeping OpenMP waits for every process but a training entrypoint that
# starts alone on an idle machine, which spins and hands threads back while others need the CPU (cpu_share).
cpu_share.choose_wait_policy()
