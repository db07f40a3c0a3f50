"""Lightning callbacks, one per module: checkpoints (:mod:`.checkpoint`), RNG states (:mod:`.rng_state`),
preemption (:mod:`.preemption`), the validation at the last step (:mod:`.final_validation`), the numerics guard (:mod:`.numerics_guard`), throughput
(:mod:`.throughput`), the per-validation summary line (:mod:`.validation_summary`), the progress bar
(:mod:`.progress_bar`), TensorBoard's HParams tab (:mod:`.final_hparams`), text and image samples
(:mod:`.text_samples`, :mod:`.image_samples`), the global batch (:mod:`.global_batch`), codebook
health (:mod:`.codebook_health`) and the DDP codebook check (:mod:`.codebook_sync`). Hydra's
``conf/callbacks/*.yaml`` lists them by ``_target_``."""
