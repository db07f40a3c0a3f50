"""Reading runs into tables and plots (``python -m tvq_exp.analysis``): see :mod:`.cli`."""
