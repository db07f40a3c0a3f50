"""tvq_exp: an experiment platform for linear-time attention research (Transformer-VQ, GAU/FLASH, linear and
dense attention) on byte-level language modelling and pixel-level image modelling.

The package is arranged by job; lower floors never import higher ones (tests/test_layout.py holds it):

- ``measure``, ``options``, ``batch``, ``console``, ``resolvers``, ``plots``, ``files`` (contained writes): small
  shared pieces (no other tvq_exp import);
- ``nn`` (norms, positions), ``quantize`` (codebooks): layers;
- ``attention``: the backends behind one contract, each with a ``naive`` reference beside it;
- ``models``: blocks, the decoder, the Lightning module, generation;
- ``data``: corpora, images, samplers (independent of the models);
- ``callbacks``: Lightning callbacks, one per module;
- ``run``: what ``train.py``, ``eval.py`` and ``sample.py`` do (validation, resuming, sweeps);
- ``tools``: benchmarks and analysis (``python -m tvq_exp.bench``, ``python -m tvq_exp.analysis``).

Importing the package registers the config tree's OmegaConf resolvers (:mod:`tvq_exp.resolvers`).
"""

from tvq_exp import resolvers  # noqa: F401  (the ${tvq.*} resolvers of conf/)
