"""Where work runs: one interface, two engines.

A caller hands an engine a worker (a picklable object whose ``__call__`` takes one job and returns its result,
holding whatever it warms up between jobs, such as onnxruntime sessions) and a list of jobs; the engine returns
the results in job order, whatever order they finished in, so what is computed from them does not depend on
where they ran. :class:`~onnxsmith.execution.engine.LocalEngine` runs them in this process, one after another
(what onnxsmith always did); :class:`~onnxsmith.execution.engine.RayEngine` runs them on the actors of a Ray
cluster and runs a job again when its worker is lost. :mod:`~onnxsmith.execution.store` keeps each job's result
on disk, so a rerun resumes where an interrupted one stopped. No scheduler, queue or RPC of onnxsmith's own.
"""
