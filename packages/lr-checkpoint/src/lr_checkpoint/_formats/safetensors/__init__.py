"""safetensors files: `read` (one pass, into place, hashed), `write` (from tensors), `body`
(from a streamed data section, no torch)."""
