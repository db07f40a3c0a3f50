"""Running things: the train / evaluate / sample commands behind ``train.py``, ``eval.py`` and ``sample.py``
(:mod:`.train` checks the config, :mod:`.fit` trains it; :mod:`.evaluate`, :mod:`.sample`), config validation (:mod:`.validation`), building a run
(:mod:`.build`), resuming (:mod:`.resume`, :mod:`.checkpoints`, :mod:`.legacy`), sweep jobs (:mod:`.sweeps`)
and one-line errors (:mod:`.errors`)."""
