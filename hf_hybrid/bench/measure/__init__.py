"""The measuring tools beside the arena: what the hybrid machinery costs (`--overhead`, `memory`) and how
training survives faults (`--faults`). They time and fault single runs; the arena's verdicts are in
`hf_hybrid.bench`."""
