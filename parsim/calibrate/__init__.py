"""`parsim calibrate`: microbenchmarks on torch.distributed (run by parsim.validate.bench)
and the fit of a hardware profile to them (:mod:`parsim.calibrate.fit`, numpy only)."""
