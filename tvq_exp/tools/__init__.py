"""Tools around the library: benchmarks (:mod:`.bench`) and run analysis (:mod:`.analysis`)."""
