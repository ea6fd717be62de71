"""lr-engine: policies, datasets and one training loop for every layout."""
