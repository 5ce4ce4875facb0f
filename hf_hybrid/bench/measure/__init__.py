"""The measuring tools beside the arena: what the hybrid machinery costs (`--overhead`) and what faults
cost (`--faults`)."""
