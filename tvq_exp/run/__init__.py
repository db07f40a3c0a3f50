"""Running things: the train / evaluate / sample commands behind ``train.py``, ``eval.py`` and ``sample.py``.

A train run is one pass (:mod:`.train`): read and verify what the files hold (:mod:`.resume` with :mod:`.checkpoints`,
the one safe loader :mod:`.safe_load` and a stored config as data :mod:`.stored`, upgraded by :mod:`.legacy`),
compose the run from the tree (:mod:`.compose`), validate it once (:mod:`.validation`, :mod:`.schema`), build
(:mod:`.build`), fit (:mod:`.fit`); the run dir is written only then (:mod:`.run_dir`). :mod:`.evaluate` and
:mod:`.sample` read a checkpoint the same way; sweep jobs (:mod:`.sweeps`), loggers that continue a run
(:mod:`.loggers`), FSDP (:mod:`.fsdp`) and one-line errors (:mod:`.errors`)."""
