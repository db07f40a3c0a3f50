"""Studies: named runs crossed with regimes and seeds, each job writing its own result file
(``python -m tvq_exp.analysis study run|report``): see :mod:`.spec`, :mod:`.runner`, :mod:`.report`."""
