"""lr-tui: a Textual app to build launches, watch runs and browse checkpoints. Never imports torch."""
