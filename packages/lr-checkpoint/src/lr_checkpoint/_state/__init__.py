"""The training process's side of a checkpoint: `state_dicts` (model and optimizer state in
one shape for every layout), `gathered` (a sharded model's gathered safetensors files, one
tensor at a time), `rng` (generator states)."""
